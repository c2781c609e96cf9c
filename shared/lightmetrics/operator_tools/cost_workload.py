"""What the system does in a month, as input to the cost model (:mod:`lightmetrics.operator_tools.cost_model`):
requests per unit of work by API — the hot path's (:data:`MEASURED_REQUESTS`, verified live by
tests/test_bench.py) and the background jobs' (:data:`JOB_REQUESTS`, verified by
tests/test_cost_measured.py) — the :class:`Assumptions` the model cannot measure, and
:func:`job_units`: how many units each job does per month under the schedules of
``lightmetrics.deployment.resources``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from lightmetrics.deployment.pricing import PRICE_TABLE
from lightmetrics.deployment.resources import FUNCTIONS
from lightmetrics.reaps.gc_marks import MARKS_SHARDS

DAY_S = 86400
MONTH_S = 30.4375 * DAY_S  # an average month
MONTH_DAYS = MONTH_S / DAY_S
#: ``walks_per_month`` of a deployment without S3 Inventory (infra/config.py ``inventory: false``):
#: the walk's weekly fallback schedule (schedules.scheduled).
WEEKLY_WALKS_PER_MONTH = 4.35
#: The index-accepted function's spec: its event source's batch size and batching window are what
#: the CDK app synthesizes (one source for the model and the template).
_INDEXER = next(f for f in FUNCTIONS if f.name == "index-accepted")

#: Requests per operation of the hot path, by API (``lmctl bench cost-table``; verified live by
#: tests/test_bench.py).
MEASURED_REQUESTS: dict[str, dict[str, int]] = {
    "accept.new": {"s3.PutObject": 2},
    "accept.duplicate": {"s3.GetObject": 1, "s3.HeadObject": 1, "s3.PutObject": 2},
    "accept.conflict": {"s3.GetObject": 1, "s3.HeadObject": 1, "s3.PutObject": 3},
    "accept.conflict_again": {"s3.GetObject": 1, "s3.HeadObject": 2, "s3.PutObject": 3},
    "index.accepted_manifest": {"s3.GetObject": 1, "s3.PutObject": 2},
    "index.raw_blob": {"s3.HeadObject": 1, "s3.PutObject": 1},
    "walk.repair_per_key": {"s3.GetObject": 1, "s3.HeadObject": 1, "s3.PutObject": 3},
}

#: Per unit of work of each background job: requests by API, ``sfn.transitions`` (states entered)
#: and ``lambda.Invoke`` (task invocations). Measured by tests/test_cost_measured.py, which fails
#: unless the live totals of whole runs equal the sum of units x these counts. A unit the job did
#: not do costs nothing; ``run`` is what one execution (one scheduled run) costs on top.
#: Queries of a read of every pending mark: one per marks shard and one of the previous version's
#: ``checkpoint#reap`` (docs/protocol.md §15 G-I10, §17 E8)
MARKS_PARTITIONS = MARKS_SHARDS + 1
JOB_REQUESTS: dict[str, dict[str, dict[str, int]]] = {
    "walk": {
        # a key inside retention whose accepted-by-time entry is present (§13 W5): one HEAD of the
        # entry, or its share of an index_listing when its (hour, boot) group is worth a LIST (an
        # upper bound: a page chooses whichever is cheaper)
        "key.retained": {"s3.HeadObject": 1},
        # a key inside retention checked by its group's index_listing: nothing of its own
        "key.listed": {},
        # a key whose LastModified places it in a tombstoned hour (§13 W4): not probed at all
        "key.reaped": {},
        # a key whose entry is missing: its HEAD, then the full repair (GET record, 2 PUTs, HEAD blob, PUT)
        "key.repaired": {"s3.GetObject": 1, "s3.HeadObject": 2, "s3.PutObject": 3},
        # one LIST of accepted-by-time/v1/<hour>/<agent>.<boot>. for a group of 13 or more keys of a page
        "index_listing": {"s3.ListObjectsV2": 1},
        # each ListObjectsV2 of a page after its first (a page of more than 1,000 keys)
        "page_listing": {"s3.ListObjectsV2": 1},
        # one page task: its LIST, the fence and the cursor (UpdateItem each)
        "page": {"s3.ListObjectsV2": 1, "dynamodb.UpdateItem": 2, "sfn.transitions": 1, "lambda.Invoke": 1},
        # enumerating one partition (agent boot): a boots-level LIST (MaxKeys = partitions Plan needs)
        "partition": {"s3.ListObjectsV2": 1},
        # one round: Plan (read the checkpoint, the skipped blockers; one transaction), Route, the Map
        "round": {"dynamodb.Query": 2, "dynamodb.TransactWriteItems": 1, "sfn.transitions": 3, "lambda.Invoke": 1},
        # handing over to a new execution (history limit): Plan, Route, Continue, Continued, Begin
        "continuation": {"dynamodb.Query": 1, "dynamodb.TransactWriteItems": 2, "dynamodb.UpdateItem": 1,
                         "sfn.transitions": 5, "lambda.Invoke": 3},
        # a tombstone HEAD: once per candidate hour of a record (and blob hour of a repair) per task
        # process (negative answers are forgotten after 60 s)
        "tombstone_check": {"s3.HeadObject": 1},
        # Begin (lease, checkpoint), the two root listings, the last Plan and Route, Finish (the 2
        # watermarks a walk that is not full moves, W3; a full walk moves 2 more), Done
        "run": {"dynamodb.GetItem": 1, "dynamodb.PutItem": 2, "dynamodb.Query": 3, "dynamodb.TransactWriteItems": 2,
                "dynamodb.UpdateItem": 2, "s3.ListObjectsV2": 2, "sfn.transitions": 5, "lambda.Invoke": 3},
    },
    "gc": {
        # the daily incremental GC (source by-time, rule G-B1): each blob once, when its
        # raw-blobs-by-time hour passes the retry horizon: HEAD blob, GET record
        "blob.old": {"s3.HeadObject": 1, "s3.GetObject": 1},
        # the tombstone HEAD of a referenced blob's acceptance hour: once per hour per page task
        # (rule G-R1; a page of one raw-blobs-by-time hour holds about one acceptance hour)
        "tombstone_check": {"s3.HeadObject": 1},
        # one page task (mark phase): LIST, checkpoint read, the page's intent looked for (a Query of
        # its marks shard and one of checkpoint#reap, §17 E8), one transaction (the marks, the
        # summary with its pending pages and the source cursor); Gc + Route
        "page": {"s3.ListObjectsV2": 1, "dynamodb.GetItem": 1, "dynamodb.Query": 2, "dynamodb.TransactWriteItems": 1,
                 "sfn.transitions": 2, "lambda.Invoke": 1},
        # Begin (+ the source cursor's GetItem), Route, the settle task (nothing marked; the marks a
        # failed reap left looked for: a Query of every marks partition, G-I10), Route, Finish,
        # Done. A run over hours with nothing newly due costs this plus one page (one LIST).
        "run": {"dynamodb.GetItem": 5, "dynamodb.PutItem": 2, "dynamodb.Query": MARKS_PARTITIONS,
                "dynamodb.TransactWriteItems": 2,
                "sfn.transitions": 6, "lambda.Invoke": 3},
    },
    "retention": {
        # GET record (blobs phase; its proof and settle use what it read, rule G-R1), HEAD blob,
        # GET record (derived phase: the retention role, which holds no marks); its 6 deletes are
        # in its page's DeleteObjects
        "batch": {"s3.GetObject": 2, "s3.HeadObject": 1},
        # one page in each of the blobs and derived phases (the derived phase deletes a listed
        # entry's accepted-by-blob, then the entry: rule R-I8), and its settle task; a DeleteObjects
        # (up to 1,000 keys) each for the markers, the captured versions, the markers, the
        # raw-blobs-by-time hints, the accepted-by-blob and the accepted-by-time entries; the page's
        # marks read by key when it is settled, no other page's (G-I10)
        "page": {"s3.ListObjectsV2": 2, "s3.HeadObject": 2, "s3.DeleteObjects": 6, "dynamodb.GetItem": 4,
                 "dynamodb.Query": 4, "dynamodb.TransactWriteItems": 4, "dynamodb.UpdateItem": 3,
                 "sfn.transitions": 6, "lambda.Invoke": 3},
        # a settle round (every max_pending_pages marked pages): Wait (the GC grace), AfterWait
        "settle_round": {"dynamodb.TransactWriteItems": 1, "sfn.transitions": 2},
        # one hour: HEAD reaped marker, tombstone + reaped marker (PUT), watermark reads, records,
        # its key-range plan (a Query: hour_ranges), verify listing, the tombstone wait
        "hour": {"s3.ListObjectsV2": 1, "s3.HeadObject": 1, "s3.PutObject": 2, "dynamodb.GetItem": 6,
                 "dynamodb.Query": 2, "dynamodb.TransactWriteItems": 2, "dynamodb.UpdateItem": 4,
                 "sfn.transitions": 6, "lambda.Invoke": 2},
        # expired_hours lists each date of accepted-by-time it walks through
        "date_listed": {"s3.ListObjectsV2": 1},
        # Begin, the last task's Query of marks# items left to settle first (rule G-I8: one of every
        # marks partition, G-I10), Finish
        "run": {"s3.ListObjectsV2": 1, "dynamodb.GetItem": 3, "dynamodb.PutItem": 2, "dynamodb.Query": 1 + MARKS_PARTITIONS,
                "dynamodb.TransactWriteItems": 1, "sfn.transitions": 4, "lambda.Invoke": 2},
    },
    "reconciler": {
        # an entry checked (first run after it, and the next one inside the margin) whose blob is in
        # the raw-blobs-by-time listing of its hour or the hour before: GET record, nothing else
        "entry.verified": {"s3.GetObject": 1},
        # an entry whose blob event was lost (protocol §12): GET record, HEAD accepted-by-blob (present),
        # HEAD blob (checksum), PUT raw-blobs-by-time (its hour listed, so no HEAD first)
        "entry.repaired": {"s3.GetObject": 1, "s3.HeadObject": 2, "s3.PutObject": 1},
        # one listing page of a scanned hour (the first page of every open hour on every run)
        "listing": {"s3.ListObjectsV2": 1},
        # one raw-blobs-by-time hour listed (once per run; a scanned hour with entries to check and
        # the hour before it)
        "blob_listing": {"s3.ListObjectsV2": 1},
        "tombstone_check": {"s3.HeadObject": 1},
        # progress saved after a scanned hour that checked entries, other than the run's last (R7)
        "hour_saved": {"dynamodb.PutItem": 1},
        # progress saved inside an hour, every SAVE_EVERY_ENTRIES checked entries but the hour's last (R7)
        "progress_saved": {"dynamodb.PutItem": 1},
        "run": {"dynamodb.GetItem": 1, "dynamodb.PutItem": 1},
    },
}

# The operator's full scan (source scan) proves like the incremental GC, plus one HEAD for each
# blob younger than LM_RETRY_HORIZON_S (it lists them too).
JOB_REQUESTS["gc-scan"] = {**JOB_REQUESTS["gc"], "blob.young": {"s3.HeadObject": 1}}
#: The scheduled GC (rule G-B3): the newest committed audit's orphan-blob-candidates, each proven once.
JOB_REQUESTS["gc-audit"] = {
    # an orphan: HEAD blob, GET record (absent), HEAD quarantine; after the grace the record and
    # the evidence again; its 4 deletes are in its page's DeleteObjects
    "candidate.orphan": {"s3.HeadObject": 3, "s3.GetObject": 2},
    # one page: the summary's HEAD, a ranged GET of the part file; a DeleteObjects each for the
    # markers placed, the captured versions, the markers, the raw-blobs-by-time hints; the mark
    # task's and the settle task's control-table work (the page's items read by key); Gc + Route twice
    "page": {"s3.GetObject": 1, "s3.HeadObject": 1, "s3.DeleteObjects": 4, "dynamodb.GetItem": 3,
             "dynamodb.Query": 2, "dynamodb.TransactWriteItems": 3, "dynamodb.UpdateItem": 2, "sfn.transitions": 4,
             "lambda.Invoke": 2},
    # each part file of orphan-blob-candidates: the LIST that finds the next one
    "part": {"s3.ListObjectsV2": 1},
    # Begin (the commit markers' LIST, the run's cursor), the first part's LIST, the last settle's
    # Query of every marks partition (G-I8, G-I10), Finish
    "run": {"s3.ListObjectsV2": 2, "dynamodb.GetItem": 5, "dynamodb.PutItem": 2, "dynamodb.Query": MARKS_PARTITIONS,
            "dynamodb.TransactWriteItems": 2,
            "sfn.transitions": 6, "lambda.Invoke": 2},
    # a day without a new audit: Begin finds the newest run proven and no marks left to settle, Finish
    "run.nothing_new": {"s3.ListObjectsV2": 1, "dynamodb.GetItem": 4, "dynamodb.PutItem": 2,
                        "dynamodb.Query": MARKS_PARTITIONS,
                        "dynamodb.TransactWriteItems": 1, "sfn.transitions": 4, "lambda.Invoke": 2},
}

#: Closing one hour in AWS (CloudWatchAgeProbe), read from aws/queue_probes.py rather than measured (moto
#: has no queue-age metric): ApproximateAgeOfOldestMessage of the 3 index queues, the depth of
#: the 3 DLQs, and one Query for open indexing blockers.
HOUR_CLOSE_REQUESTS: dict[str, int] = {"cloudwatch.GetMetricStatistics": 3, "sqs.GetQueueAttributes": 3,
                                       "dynamodb.Query": 1}


@dataclass(frozen=True)
class Assumptions:
    """What the model cannot measure locally; every figure is an input to edit, not a fact."""

    # -- the hot path
    ingest_ms: float = 120.0  # billed duration per accept: 2 sequential S3 round trips + auth/validation
    ingest_memory_mb: int = 1024  # resources.py: the ingest function
    # one invocation of an indexer: the records of its batch run concurrently (a read round trip,
    # a write round trip, the batch's delete), then CPU per record one after another
    index_io_ms: float = 80.0
    # At one vCPU (index_cpu_ms scales it), ours per record and per invocation, botocore's per S3 request:
    # measured on x86_64 (2 cores, Python 3.11), 2026-12-07, median of 3 `lmctl bench indexer-cpu --invocations 50`
    index_cpu_ms_per_record: float = 0.34
    index_cpu_ms_per_invocation: float = 0.76
    index_sdk_cpu_ms_per_request: float = 0.73
    index_memory_mb: int = 512
    # messages per invocation: 0 derives them from the rate, the window and the batch size
    # (sqs_batching.messages_per_invocation); N > 0 assumes N
    sqs_batch_size: int = 0
    sqs_max_batch_size: int = _INDEXER.batch_size  # resources.py: the event source's batch size
    sqs_batching_window_s: float = float(_INDEXER.batching_window_s)  # resources.py: MaximumBatchingWindow
    sqs_poll_gap_s: float = 0.1  # a poller's receive round trip and previous invocation
    sqs_pollers_per_queue: int = 5  # Lambda's SQS event source, 20 s long polls when idle
    # -- the reconciler (resources.py: rate(5 minutes), 1024 MB)
    reconcile_every_s: int = 300
    settle_s: int = 900  # LM_SETTLE_S default
    reconcile_margin_s: int = 120  # LM_RECONCILE_MARGIN_S default
    reconcile_save_every: int = 5000  # reconcile.SAVE_EVERY_ENTRIES: progress saved inside an hour (R7)
    reconcile_entry_ms: float = 10.0  # billed ms per repaired entry (repairs run in a pool)
    reconcile_run_ms: float = 300.0  # fixed part of each shard's run (checkpoint, probes, listing)
    reconcile_fanout_ms: float = 100.0  # the scheduled run: ceil(shards / 10) SendMessageBatch, no more
    reconcile_memory_mb: int = 1024
    # -- data and history
    retention_days: float = 90.0  # LM_RETENTION_S default
    system_age_days: float = 365.0  # how long the system has accepted (the walk lists all of it)
    fleet_agents: int = 1000  # agents reporting; a walk partition is one boot of one agent
    boot_days: float = 7.0  # mean lifetime of an agent boot (keys per partition)
    retry_horizon_days: float = 7.0  # LM_RETRY_HORIZON_S default: younger blobs cost GC one HEAD
    manifest_bytes: int = 700
    derived_bytes: int = 1200  # accepted-by-time + accepted-by-blob + raw-blobs-by-time
    noncurrent_version_days: float = 30.0  # infra/config.py: derived entries deleted by retention/GC
    # -- the bootstrap walk (resources.py: page_size 10,000, parallelism 40). Not scheduled where an S3
    # Inventory runs (the default deployment: the weekly audit moves every W, docs/walks.md); a bucket
    # without one walks weekly: --assume walks_per_month=4.35 (WEEKLY_WALKS_PER_MONTH)
    walks_per_month: float = 0.0
    walk_page_size: int = 10_000
    walk_parallelism: int = 40
    walk_rounds_per_execution: int = 14  # walk.max_rounds_for(40): rounds before the history budget
    walk_key_ms: float = 10.0  # billed ms per key a page task probes or repairs (16 keys at a time)
    walk_page_ms: float = 200.0  # billed ms per page task besides those keys: its LIST, group LISTs, fence, cursor
    walk_memory_mb: int = 1024
    # -- the reaps (resources.py: GC daily from the newest audit, rule G-B3; retention daily once
    # enabled, 24 hours a run)
    gc_runs_per_month: float = MONTH_DAYS
    gc_page_size: int = 500  # reap page_size default
    gc_blob_ms: float = 4.0  # billed ms per proof (2 sequential reads, 8 at a time; the tombstone HEAD once per hour)
    # blobs no record names (an accept that died between its blob and its record, a conflicting
    # submission): what the weekly audit lists and GC proves; an operator's figure, not measured
    orphan_fraction: float = 0.001
    reap_memory_mb: int = 1024
    retention_hours_per_run: int = 24  # retention.expired_hours limit
    retention_page_size: int = 1000  # the retention schedule's page_size
    retention_max_pending_pages: int = 20
    # billed ms per batch over its tasks: 2 record reads, a HEAD and 6 deletes of ~20 ms each, 8 in
    # flight (a page's reads and deletes run on the reap's pool; they ran one by one: 40 ms). The
    # deletes are now DeleteObjects, 6 a page: an upper bound, kept until measured on AWS
    retention_batch_ms: float = 25.0
    retention_memory_mb: int = 768  # reap-gc 1024 MB, reap-retention 512 MB
    reap_mark_bytes: int = 172  # a retention mark, stored compactly (rule G-I7; reap.dynamodb_item_bytes of a real one)
    task_overhead_ms: float = 50.0  # billed ms of a Step Functions task besides its keys (512 MB)
    # -- the inventory audit (infra: weekly S3 Inventory of all versions, Parquet; audit weekly on EMR)
    audits_per_month: float = MONTH_DAYS / 7  # one inventory report and one audit a week
    inventory_bytes_per_object: int = 90  # a Parquet inventory row: key, version id and ETag do not compress
    inventory_retention_days: float = 14.0  # infra/config.py: inventory reports in the ops bucket
    ops_retention_days: float = 90.0  # infra/config.py: access logs in the ops bucket
    audit_rows_per_vcpu_s: float = 15_300.0  # lmctl bench pipeline: 30,600 rows/s on 2 cores
    audit_gb_per_vcpu: float = 4.0  # EMR Serverless default workers: 4 vCPU, 16 GB
    emr_arm64: bool = False  # infra/components/pipeline.py: architecture X86_64
    # -- logs and traces
    lambda_platform_log_bytes: int = 360  # START, END, REPORT (with X-Ray ids)
    ingest_log_bytes: int = 900  # "ingest answered" (Powertools JSON with the Lambda context) + EMF metrics
    task_log_bytes: int = 300  # a background invocation's EMF metrics line
    reconcile_log_bytes: int = 1500  # "reconcile run" with its report
    # moto's histories: 3.3-4.8 events and 1.2 KB (reaps) to 3.0 KB (walk) per state entered
    sfn_log_bytes_per_transition: int = 2500
    log_retention_days: float = 30.0  # infra/config.py
    access_log_record_bytes: int = 700  # one S3 server access log record (the UA string alone is ~180 B)
    xray_sampled_fraction: float = 0.05  # default sampling rule beyond 1 request/s
    # -- fixed monthly items
    cloudwatch_alarms: int = 50
    custom_metrics: int = 40
    dashboards: int = 1
    secrets: int = 1
    # -- the alternative
    alt_item_bytes: int = 300  # DynamoDB dedupe item (identity, hash, blob key, times)
    alt_gsi_count: int = 1  # a by-time index to enumerate batches for rollups and retention
    alt_pitr: bool = True

    @property
    def reconcile_passes_per_entry(self) -> float:
        """Runs that list an entry: from its acceptance (mid-hour on average) until its hour closes."""
        return (1800 + self.settle_s) / self.reconcile_every_s

    @property
    def reconcile_repairs_per_entry(self) -> float:
        """Runs that repair an entry (protocol §12 R4, verified once): the first run after it, and
        the next one too if it landed within the margin before the newest entry of that run."""
        return 1 + min(1.0, self.reconcile_margin_s / self.reconcile_every_s)

    @property
    def live_days(self) -> float:
        return min(self.system_age_days, self.retention_days)

    @property
    def reaped_days(self) -> float:
        return max(0.0, self.system_age_days - self.retention_days)


def retention_marks_capacity(a: Assumptions, *, by_key: bool = False) -> tuple[float, float]:
    """(WRU, RRU) per retained batch of its ``marks#`` items: a mark is written with its page's
    intent, again as marked, and deleted when settled (3 transactional writes, 2 WRU per KB). An
    hour in one range (the summary's pages) reads all pending marks in every task of a settle
    round; an hour in key ranges (``by_key``) reads a page's items once, by key, when it is due
    (consistent reads, 1 RRU per 4 KB)."""
    marks_kb = a.reap_mark_bytes / 1024
    m = a.retention_max_pending_pages
    return 6 * marks_kb, (1 if by_key else m + (m + 1) / 2) * marks_kb / 4


def inventory_objects(batches_per_second: float, a: Assumptions) -> float:
    """Objects one S3 Inventory report lists (the audit's rows): the records, the blobs and their
    3 derived entries inside retention, and the noncurrent versions and markers reaps leave."""
    return (a.system_age_days + 4 * a.live_days + 6 * min(a.noncurrent_version_days, a.reaped_days)) \
        * batches_per_second * DAY_S


def job_requests(job: str, units: Mapping[str, float]) -> dict[str, float]:
    """Requests by API (and transitions, invocations) of ``job`` doing ``units`` (unit -> count)."""
    table = JOB_REQUESTS[job]
    unknown = set(units) - set(table)
    if unknown:
        raise ValueError(f"{job} has no units {sorted(unknown)}; known: {sorted(table)}")
    total: dict[str, float] = {}
    for unit, n in units.items():
        for api, k in table[unit].items():
            total[api] = total.get(api, 0) + k * n
    return {api: n for api, n in sorted(total.items()) if n}


def job_units(batches_per_second: float, a: Assumptions) -> dict[str, dict[str, float]]:
    """Units of work per month of each background job at this rate, history and schedule."""
    rate = batches_per_second
    live, reaped = a.live_days, a.reaped_days
    # A walk lists every acceptance record ever made (they are permanent), partition by partition,
    # parallelism pages a round, walk_rounds_per_execution rounds an execution; walks_per_month of them.
    retained_keys, reaped_keys = rate * live * DAY_S, rate * reaped * DAY_S
    boot_rate = rate / a.fleet_agents  # keys per second of one agent boot
    per_partition = boot_rate * a.boot_days * DAY_S
    partitions = (retained_keys + reaped_keys) / per_partition
    pages_per_partition = math.ceil(per_partition / a.walk_page_size)
    pages = partitions * pages_per_partition
    retained_pages = retained_keys / per_partition * pages_per_partition
    rounds = math.ceil(pages / a.walk_parallelism)
    executions = max(1, math.ceil(rounds / a.walk_rounds_per_execution))
    w = a.walks_per_month
    # A page of one boot spans min(page, partition) / boot_rate seconds: the hours its keys fall in
    # (one tombstone HEAD each per task process; for retained keys, one (hour, boot) group each).
    keys_per_page = min(a.walk_page_size, per_partition)
    hours_per_page = 1 + keys_per_page / boot_rate / 3600
    # Rule W5: a group of keys of one hour is checked by one LIST when that is cheaper than a HEAD
    # a key (13 keys or more at list prices), else a HEAD each.
    group = keys_per_page / hours_per_page
    listed = group * PRICE_TABLE.price("s3.get_per_1000") > PRICE_TABLE.price("s3.put_per_1000")
    walk = {"key.retained": 0.0 if listed else w * retained_keys, "key.listed": w * retained_keys if listed else 0.0,
            "key.reaped": w * reaped_keys, "index_listing": w * retained_pages * hours_per_page if listed else 0.0,
            "page": w * pages, "page_listing": w * pages * (math.ceil(keys_per_page / 1000) - 1),
            "partition": w * partitions, "round": w * rounds,
            "continuation": w * (executions - 1), "tombstone_check": w * pages * hours_per_page, "run": w}
    # GC (rule G-B3): a daily run proves the newest committed audit's orphan candidates once; the
    # runs between two audits find it proven (one listing). Orphans, not blobs, drive it.
    g = a.gc_runs_per_month
    orphans = rate * MONTH_S * a.orphan_fraction
    per_audit = orphans / a.audits_per_month
    gc = {"candidate.orphan": orphans, "page": a.audits_per_month * math.ceil(per_audit / a.gc_page_size),
          "part": a.audits_per_month * max(1, math.ceil(per_audit / 200_000)),  # pipeline/audit/job.py: rows a part
          "run": a.audits_per_month, "run.nothing_new": max(0.0, g - a.audits_per_month)}
    # Retention: once the system is older than its retention, an hour expires every hour; a daily
    # run takes 24 of them.
    retention: dict[str, float] = {}
    if a.system_age_days > a.retention_days:
        hours = MONTH_S / 3600
        pages_h = math.ceil(rate * 3600 / a.retention_page_size)
        runs = hours / a.retention_hours_per_run
        retention = {"batch": rate * MONTH_S, "page": hours * pages_h,
                     "settle_round": hours * math.ceil(pages_h / a.retention_max_pending_pages),
                     "hour": hours, "run": runs, "date_listed": 2 * runs}
    # The reconciler: every run lists the open hours (the current one, and the previous one inside
    # the settle window); an entry is listed ~9 times and checked 1-2 times (R4): one GET when its
    # blob is in the raw-blobs-by-time listings of its hour and the one before, listed once a run
    # (as many pages as the entries listed, twice); progress saved after each hour but the last, and
    # every reconcile_save_every entries a run checks but its last slice (R7).
    runs = MONTH_S / a.reconcile_every_s
    scans = runs * (1 + a.settle_s / 3600)
    entries = rate * MONTH_S
    listing = scans + entries * a.reconcile_passes_per_entry / 1000
    checked = entries * a.reconcile_repairs_per_entry
    reconciler = {"entry.verified": checked, "listing": listing, "blob_listing": 2 * listing,
                  "hour_saved": scans - runs,
                  "progress_saved": runs * max(0, math.ceil(checked / runs / a.reconcile_save_every) - 1),
                  "run": runs}
    return {"walk": walk, "gc": gc, "retention": retention, "reconciler": reconciler}
