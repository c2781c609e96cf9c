"""Dollars per month and per million accepted batches at a rate: ``lmctl cost`` and docs/cost.md.

Every recurring component is priced as (requests per unit of work, by API) x (units per month):

* the hot path (accept, the S3 -> SQS event path, both indexers) from :data:`MEASURED_REQUESTS`,
  checked against live counts by tests/test_bench.py;
* the background jobs (steady-state reconciler, weekly bootstrap walk, daily incremental GC, daily
  retention) from :data:`JOB_REQUESTS`: requests by API, Step Functions state transitions
  (``sfn.transitions``, the states an execution enters, as the ASL really runs) and Lambda task
  invocations (``lambda.Invoke``) per unit of work. tests/test_cost_measured.py runs each job on
  moto (the walk and the reap through their state machines) and fails unless every live count
  equals the table; :func:`job_units` says how many units each job does per month under the
  schedules of ``lightmetrics.deployment.resources`` and the :class:`Assumptions`;
* what that traffic leaves behind: control-table capacity, CloudWatch Logs (Lambda and Step
  Functions, whose logging level is ALL with execution data), S3 server access log records kept
  in the ops bucket, X-Ray traces; the daily S3 Inventory, its reports and the Spark audit on EMR
  Serverless; storage; fixed monthly items (schedules, idle polls, alarms, metrics, the secret).

Two designs side by side: ``lightmetrics`` (this system, every batch new) and ``dynamodb-dedupe``
(what a team would otherwise build: one DynamoDB conditional PutItem per batch plus a GSI to
enumerate by time, and the S3 blob; it leaves out whatever that team would add to reconcile
blobs against records). Both get the same ingest Lambda, its logs, traces and access log records.

Every cost line is named ``<part>: <what>``; the part (ingest, indexing, reconciler, walk, GC,
retention, audit, storage, monitoring) is what docs/cost.md and the summary group by.

Example:
    >>> est = estimate(batches_per_second=100, frame_bytes=4096)
    >>> est["designs"]["lightmetrics"]["per_month_usd"] > est["designs"]["dynamodb-dedupe"]["per_month_usd"]
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from lightmetrics.deployment.pricing import PRICE_TABLE, PriceTable

DAY_S = 86400
MONTH_S = 30.4375 * DAY_S  # an average month
MONTH_DAYS = MONTH_S / DAY_S

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
        # one page task (mark phase): LIST, checkpoint read, marks Query x2, one transaction (the
        # marks, the summary and the source cursor); Gc + Route
        "page": {"s3.ListObjectsV2": 1, "dynamodb.GetItem": 1, "dynamodb.Query": 2, "dynamodb.TransactWriteItems": 1,
                 "sfn.transitions": 2, "lambda.Invoke": 1},
        # Begin (+ the source cursor's GetItem), Route, the settle task (nothing marked), Route,
        # Finish, Done. A run over hours with nothing newly due costs this plus one page (one LIST).
        "run": {"dynamodb.GetItem": 5, "dynamodb.PutItem": 2, "dynamodb.Query": 1, "dynamodb.TransactWriteItems": 2,
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
        # raw-blobs-by-time hints, the accepted-by-blob and the accepted-by-time entries
        "page": {"s3.ListObjectsV2": 2, "s3.HeadObject": 2, "s3.DeleteObjects": 6, "dynamodb.GetItem": 3,
                 "dynamodb.Query": 5, "dynamodb.TransactWriteItems": 4, "dynamodb.UpdateItem": 3,
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
        "run": {"s3.ListObjectsV2": 1, "dynamodb.GetItem": 3, "dynamodb.PutItem": 2, "dynamodb.Query": 1,
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
    # task's and the settle task's control-table work; Gc + Route twice
    "page": {"s3.GetObject": 1, "s3.HeadObject": 1, "s3.DeleteObjects": 4, "dynamodb.GetItem": 2,
             "dynamodb.Query": 3, "dynamodb.TransactWriteItems": 3, "dynamodb.UpdateItem": 2, "sfn.transitions": 4,
             "lambda.Invoke": 2},
    # each part file of orphan-blob-candidates: the LIST that finds the next one
    "part": {"s3.ListObjectsV2": 1},
    # Begin (the commit markers' LIST, the run's cursor), the first part's LIST, Finish
    "run": {"s3.ListObjectsV2": 2, "dynamodb.GetItem": 5, "dynamodb.PutItem": 2, "dynamodb.TransactWriteItems": 2,
            "sfn.transitions": 6, "lambda.Invoke": 2},
    # a day without a new audit: Begin finds the newest run proven and no marks left to settle, Finish
    "run.nothing_new": {"s3.ListObjectsV2": 1, "dynamodb.GetItem": 4, "dynamodb.PutItem": 2, "dynamodb.Query": 1,
                        "dynamodb.TransactWriteItems": 1, "sfn.transitions": 4, "lambda.Invoke": 2},
}

#: Closing one hour in AWS (CloudWatchAgeProbe), read from reconcile.py rather than measured (moto
#: has no queue-age metric): ApproximateAgeOfOldestMessage of the 3 index queues, the depth of
#: the 3 DLQs, and one Query for open indexing blockers.
HOUR_CLOSE_REQUESTS: dict[str, int] = {"cloudwatch.GetMetricStatistics": 3, "sqs.GetQueueAttributes": 3,
                                       "dynamodb.Query": 1}

#: S3 APIs billed at the PUT/LIST rate; DELETE is free (DeleteObjects priced as its deletes: at the
#: PUT rate it would be 6 requests a 1,000 batches, $0.03 a million); everything else at the GET rate.
_S3_PUT_CLASS = {"s3.PutObject", "s3.CopyObject", "s3.ListObjectsV2", "s3.CompleteMultipartUpload"}
_S3_FREE = {"s3.DeleteObject", "s3.DeleteObjects"}
_DDB_WRITES = {"dynamodb.PutItem", "dynamodb.UpdateItem", "dynamodb.DeleteItem"}
_DDB_READS = {"dynamodb.GetItem", "dynamodb.Query"}
#: Parts that are not "ingest, indexing and storage" (the target: at most 15 % of the total).
CORE_PARTS = ("ingest", "indexing", "storage")


@dataclass(frozen=True)
class Assumptions:
    """What the model cannot measure locally; every figure is an input to edit, not a fact."""

    # -- the hot path
    ingest_ms: float = 120.0  # billed duration per accept: 2 sequential S3 round trips + auth/validation
    ingest_memory_mb: int = 1024  # resources.py: the ingest function
    index_batch_ms: float = 200.0  # per SQS batch of 10 records, records concurrent (~5-6 round trips)
    index_memory_mb: int = 512
    sqs_batch_size: int = 10
    sqs_pollers_per_queue: int = 5  # Lambda's SQS event source, 20 s long polls when idle
    # -- the reconciler (resources.py: rate(5 minutes), 1024 MB)
    reconcile_every_s: int = 300
    settle_s: int = 900  # LM_SETTLE_S default
    reconcile_margin_s: int = 120  # LM_RECONCILE_MARGIN_S default
    reconcile_save_every: int = 5000  # reconcile.SAVE_EVERY_ENTRIES: progress saved inside an hour (R7)
    reconcile_entry_ms: float = 10.0  # billed ms per repaired entry (repairs run in a pool)
    reconcile_run_ms: float = 300.0  # fixed part of each scheduled run (checkpoint, probes, listing)
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
    # -- the bootstrap walk (resources.py: weekly, page_size 10,000, parallelism 40)
    walks_per_month: float = 4.35
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
    # The weekly walk lists every acceptance record ever made (they are permanent), partition by
    # partition, parallelism pages a round, walk_rounds_per_execution rounds an execution.
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
          "part": a.audits_per_month * max(1, math.ceil(per_audit / 200_000)),  # pipeline/audit.py: rows a part
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


# --- lines -------------------------------------------------------------------------------------------
def _line(item: str, quantity: float, unit: str, usd_per_batch: float) -> dict[str, Any]:
    return {"item": item, "quantity_per_batch": quantity, "unit": unit, "usd_per_batch": usd_per_batch}


def _gb_s(ms: float, memory_mb: int) -> float:
    return ms / 1000.0 * memory_mb / 1024.0


def _months(days: float) -> float:
    return days * DAY_S / MONTH_S


def _s3_requests(requests: Mapping[str, float]) -> float:
    return sum(n for api, n in requests.items() if api.startswith("s3."))


def traffic_lines(part: str, requests: Mapping[str, float], a: Assumptions, prices: PriceTable, *,
                  gb_s: float = 0.0, log_bytes_per_invocation: float = 0.0,
                  extra_wru: float = 0.0, extra_rru: float = 0.0) -> list[dict[str, Any]]:
    """Cost lines of ``requests`` per batch (requests by API, ``sfn.transitions``, ``lambda.Invoke``):
    the requests themselves, control-table capacity, Lambda, Step Functions, and what they leave
    behind (CloudWatch Logs, S3 access log records, X-Ray traces)."""
    p = prices.price
    out: list[dict[str, Any]] = []
    puts = sum(n for api, n in requests.items() if api in _S3_PUT_CLASS)
    gets = sum(n for api, n in requests.items()
               if api.startswith("s3.") and api not in _S3_PUT_CLASS and api not in _S3_FREE)
    if puts:
        out.append(_line(f"{part}: S3 PUT/LIST", puts, "requests", puts / 1000 * p("s3.put_per_1000")))
    if gets:
        out.append(_line(f"{part}: S3 GET/HEAD", gets, "requests", gets / 1000 * p("s3.get_per_1000")))
    # Control table: items are small (<= 1 KB, <= 4 KB read); a transaction writes 2 of them at 2 WRU each.
    wru = sum(n for api, n in requests.items() if api in _DDB_WRITES) \
        + 4 * requests.get("dynamodb.TransactWriteItems", 0.0) + extra_wru
    rru = sum(n for api, n in requests.items() if api in _DDB_READS) + extra_rru
    if wru or rru:
        out.append(_line(f"{part}: control table", wru + rru, "WRU+RRU",
                         wru / 1e6 * p("dynamodb.per_million_wru") + rru / 1e6 * p("dynamodb.per_million_rru")))
    sqs = sum(n for api, n in requests.items() if api.startswith("sqs."))
    if sqs:
        out.append(_line(f"{part}: SQS requests", sqs, "requests", sqs / 1e6 * p("sqs.per_million")))
    cw = requests.get("cloudwatch.GetMetricStatistics", 0.0)
    if cw:
        out.append(_line(f"{part}: CloudWatch GetMetricStatistics", cw, "requests",
                         cw / 1000 * p("cloudwatch.per_1000_metric_requests")))
    transitions = requests.get("sfn.transitions", 0.0)
    if transitions:
        out.append(_line(f"{part}: Step Functions transitions", transitions, "transitions",
                         transitions / 1000 * p("stepfunctions.per_1000_transitions")))
    invocations = requests.get("lambda.Invoke", 0.0)
    if invocations:
        out.append(_line(f"{part}: Lambda invocations", invocations, "invocations",
                         invocations / 1e6 * p("lambda.per_million_requests")))
    if gb_s:
        out.append(_line(f"{part}: Lambda duration", gb_s, "GB-s", gb_s * p("lambda.gb_second")))
    log_gb = (invocations * (a.lambda_platform_log_bytes + log_bytes_per_invocation)
              + transitions * a.sfn_log_bytes_per_transition) / 1e9
    if log_gb:
        out.append(_line(f"{part}: CloudWatch Logs", log_gb, "GB ingested",
                         log_gb * (p("cloudwatch.logs_ingest_per_gb")
                                   + _months(a.log_retention_days) * p("cloudwatch.logs_storage_gb_month"))))
    s3_requests = _s3_requests(requests)
    if s3_requests:
        gb_months = s3_requests * a.access_log_record_bytes / 1e9 * _months(a.ops_retention_days)
        out.append(_line(f"{part}: S3 access log records", s3_requests, "records",
                         gb_months * p("s3.storage_gb_month")))
    if invocations:
        traces = invocations * a.xray_sampled_fraction
        out.append(_line(f"{part}: X-Ray traces", traces, "traces", traces / 1e6 * p("xray.per_million_traces")))
    return out


def _per_batch(requests: Mapping[str, float], batches_per_month: float) -> dict[str, float]:
    return {api: n / batches_per_month for api, n in requests.items()}


def _hot_path(a: Assumptions) -> dict[str, dict[str, float]]:
    """Per-batch requests of ingest and indexing."""
    m = MEASURED_REQUESTS
    ingest: dict[str, float] = {**m["accept.new"], "lambda.Invoke": 1}
    indexing: dict[str, float] = {}
    for op in ("index.accepted_manifest", "index.raw_blob"):
        for api, n in m[op].items():
            indexing[api] = indexing.get(api, 0) + n
    # 2 notifications (manifest, blob): a SendMessage by S3 each, and per SQS batch one
    # ReceiveMessage and one DeleteMessageBatch by the event source mapping
    indexing["sqs.messages"] = 2 * (1 + 2 / a.sqs_batch_size)
    indexing["lambda.Invoke"] = 2 / a.sqs_batch_size
    return {"ingest": ingest, "indexing": dict(indexing)}


def lightmetrics_lines(frame_bytes: int, a: Assumptions, prices: PriceTable, *, batches_per_second: float = 100.0
                       ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(per-batch lines, fixed monthly lines) for this system."""
    p = prices.price
    per_month = batches_per_second * MONTH_S
    hot = _hot_path(a)
    lines = traffic_lines("ingest", hot["ingest"], a, prices, gb_s=_gb_s(a.ingest_ms, a.ingest_memory_mb),
                          log_bytes_per_invocation=a.ingest_log_bytes)
    lines += traffic_lines("indexing", hot["indexing"], a, prices,
                           gb_s=hot["indexing"]["lambda.Invoke"] * _gb_s(a.index_batch_ms, a.index_memory_mb),
                           log_bytes_per_invocation=a.task_log_bytes)

    units = job_units(batches_per_second, a)
    overhead = _gb_s(a.task_overhead_ms, 512)
    # reconciler (its runs are in the fixed lines)
    u = units["reconciler"]
    req = _per_batch(job_requests("reconciler", u), per_month)
    lines += traffic_lines("reconciler", req, a, prices,
                           gb_s=u["entry.verified"] / per_month * _gb_s(a.reconcile_entry_ms, a.reconcile_memory_mb))
    # the weekly walk
    u = units["walk"]
    req = _per_batch(job_requests("walk", u), per_month)
    probed = u["key.retained"] / per_month
    lines += traffic_lines("walk", req, a, prices, log_bytes_per_invocation=a.task_log_bytes,
                           gb_s=probed * _gb_s(a.walk_key_ms, a.walk_memory_mb)
                           + u["page"] / per_month * _gb_s(a.walk_page_ms, a.walk_memory_mb)
                           + req["lambda.Invoke"] * overhead)
    # the daily GC of the audit's orphan candidates (the audit's own confirmation of each, a HEAD of
    # the blob, a GET of the record and a HEAD of the evidence, is counted with it)
    u = units["gc"]
    req = _per_batch(job_requests("gc-audit", u), per_month)
    req["s3.HeadObject"] = req.get("s3.HeadObject", 0.0) + 2 * u["candidate.orphan"] / per_month
    req["s3.GetObject"] = req.get("s3.GetObject", 0.0) + u["candidate.orphan"] / per_month
    lines += traffic_lines("GC", req, a, prices, log_bytes_per_invocation=a.task_log_bytes,
                           gb_s=u["candidate.orphan"] / per_month * _gb_s(a.gc_blob_ms, a.reap_memory_mb)
                           + req["lambda.Invoke"] * overhead)
    # daily retention; its marks items are priced by size: a mark is written with its page's
    # intent, again as marked, and deleted when settled (3 transactional writes, 2 WRU per KB), and
    # every task of a settle round reads all pending marks (consistent reads, 1 RRU per 4 KB)
    u = units["retention"]
    if u:
        req = _per_batch(job_requests("retention", u), per_month)
        marks_kb = a.reap_mark_bytes / 1024
        m = a.retention_max_pending_pages
        lines += traffic_lines("retention", req, a, prices, log_bytes_per_invocation=a.task_log_bytes,
                               gb_s=_gb_s(a.retention_batch_ms, a.retention_memory_mb) + req["lambda.Invoke"] * overhead,
                               extra_wru=6 * marks_kb, extra_rru=(m + (m + 1) / 2) * marks_kb / 4)
    # the inventory audit: S3 Inventory of every version, its Parquet reports in the ops bucket,
    # the Spark audit over them on EMR Serverless, audits_per_month times
    objects = (a.system_age_days + 4 * a.live_days + 6 * min(a.noncurrent_version_days, a.reaped_days)) \
        * batches_per_second * DAY_S  # listed per report: records, blobs + 3 derived, noncurrent versions + markers
    listed = objects * a.audits_per_month / per_month
    lines.append(_line("audit: S3 Inventory", listed, "objects listed",
                       listed / 1e6 * p("s3.inventory_per_million_objects")))
    # each report is kept inventory_retention_days
    report_gb_months = listed * a.inventory_bytes_per_object / 1e9 * _months(a.inventory_retention_days)
    lines.append(_line("audit: inventory reports (ops bucket)", report_gb_months, "GB-months",
                       report_gb_months * p("s3.storage_gb_month")))
    vcpu_h = listed / a.audit_rows_per_vcpu_s / 3600
    arch = "arm64" if a.emr_arm64 else "x86"
    lines.append(_line("audit: EMR Serverless vCPU", vcpu_h, "vCPU-hours",
                       vcpu_h * p(f"emr_serverless.vcpu_hour_{arch}")))
    lines.append(_line("audit: EMR Serverless memory", vcpu_h * a.audit_gb_per_vcpu, "GB-hours",
                       vcpu_h * a.audit_gb_per_vcpu * p(f"emr_serverless.gb_hour_{arch}")))
    # storage
    live_gb_months = (frame_bytes + a.derived_bytes) / 1e9 * _months(a.retention_days)
    lines.append(_line("storage: frames + derived entries (retention period)", live_gb_months, "GB-months",
                       live_gb_months * p("s3.storage_gb_month")))
    records_gb_months = a.manifest_bytes / 1e9 * _months(a.system_age_days)
    lines.append(_line("storage: acceptance records (kept forever)", records_gb_months, "GB-months",
                       records_gb_months * p("s3.storage_gb_month")))
    if a.reaped_days:
        noncurrent = a.derived_bytes / 1e9 * _months(a.noncurrent_version_days)
        lines.append(_line("storage: noncurrent derived versions", noncurrent, "GB-months",
                           noncurrent * p("s3.storage_gb_month")))
    return lines, _fixed_lines(a, prices)


def _fixed_lines(a: Assumptions, prices: PriceTable) -> list[dict[str, Any]]:
    """Monthly costs that do not follow the batch rate."""
    p = prices.price
    runs = MONTH_S / a.reconcile_every_s
    invoke = p("lambda.per_million_requests") / 1e6
    log_gb = (a.lambda_platform_log_bytes + a.reconcile_log_bytes) / 1e9
    log_price = (p("cloudwatch.logs_ingest_per_gb")
                 + _months(a.log_retention_days) * p("cloudwatch.logs_storage_gb_month"))
    closes = MONTH_S / 3600
    close_usd = (HOUR_CLOSE_REQUESTS["cloudwatch.GetMetricStatistics"] / 1000 * p("cloudwatch.per_1000_metric_requests")
                 + HOUR_CLOSE_REQUESTS["sqs.GetQueueAttributes"] / 1e6 * p("sqs.per_million")
                 + HOUR_CLOSE_REQUESTS["dynamodb.Query"] / 1e6 * p("dynamodb.per_million_rru"))
    sweeps = MONTH_S / 300  # sweep-dlq: rate(5 minutes), one ReceiveMessage per DLQ
    polls = 3 * a.sqs_pollers_per_queue * MONTH_S / 20
    return [
        _line("reconciler: scheduled runs", runs, "invocations",
              runs * (invoke + _gb_s(a.reconcile_run_ms, a.reconcile_memory_mb) * p("lambda.gb_second")
                      + log_gb * log_price)),
        _line("reconciler: closing hours (queue age, DLQs, blockers)", closes, "hours closed", closes * close_usd),
        _line("indexing: SQS idle long polls (3 index queues)", polls, "requests", polls / 1e6 * p("sqs.per_million")),
        _line("indexing: sweep-dlq runs", sweeps, "invocations",
              sweeps * (invoke + _gb_s(200, 512) * p("lambda.gb_second") + 3 / 1e6 * p("sqs.per_million")
                        + a.lambda_platform_log_bytes / 1e9 * log_price)),
        _line("audit: pipeline state machine", 2 * a.audits_per_month, "transitions",
              2 * a.audits_per_month / 1000 * p("stepfunctions.per_1000_transitions")),
        _line("monitoring: CloudWatch alarms", a.cloudwatch_alarms, "alarms",
              a.cloudwatch_alarms * p("cloudwatch.alarm_month")),
        _line("monitoring: custom metrics", a.custom_metrics, "metrics",
              a.custom_metrics * p("cloudwatch.metric_month")),
        _line("monitoring: dashboards", a.dashboards, "dashboards", a.dashboards * p("cloudwatch.dashboard_month")),
        _line("monitoring: Secrets Manager (token secret)", a.secrets, "secrets",
              a.secrets * p("secretsmanager.secret_month")),
    ]


def alternative_lines(frame_bytes: int, a: Assumptions, prices: PriceTable, *, batches_per_second: float = 100.0
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(per-batch lines, fixed monthly lines) for a DynamoDB conditional put + S3 blob design."""
    p = prices.price
    lines = traffic_lines("ingest", {"s3.PutObject": 1, "lambda.Invoke": 1}, a, prices,
                          gb_s=_gb_s(a.ingest_ms, a.ingest_memory_mb), log_bytes_per_invocation=a.ingest_log_bytes)
    wru = math.ceil(a.alt_item_bytes / 1024) * (1 + a.alt_gsi_count)
    lines.append(_line("ingest: DynamoDB conditional PutItem (+ GSI)", wru, "WRU",
                       wru / 1e6 * p("dynamodb.per_million_wru")))
    retained_months = _months(a.retention_days)
    table_gb_months = a.alt_item_bytes * (1 + a.alt_gsi_count) / 1e9 * retained_months
    pitr = p("dynamodb.pitr_gb_month") if a.alt_pitr else 0.0
    ddb_storage = table_gb_months * (p("dynamodb.storage_gb_month") + pitr)
    lines.append(_line("storage: DynamoDB table (+ PITR)", table_gb_months, "GB-months", ddb_storage))
    gb_months = frame_bytes / 1e9 * retained_months
    lines.append(_line("storage: frames (retention period)", gb_months, "GB-months",
                       gb_months * p("s3.storage_gb_month")))
    return lines, []


def group_of(item: str) -> str:
    """The part of the system a cost line belongs to: the text before ``": "``."""
    return item.split(": ", 1)[0]


def _design(lines: list[dict[str, Any]], fixed: list[dict[str, Any]], batches_per_month: float) -> dict[str, Any]:
    groups: dict[str, float] = {}
    for line in lines:
        line["group"] = group_of(line["item"])
        line["usd_per_million_batches"] = line["usd_per_batch"] * 1e6
        line["usd_per_month"] = line["usd_per_batch"] * batches_per_month
        groups[line["group"]] = groups.get(line["group"], 0.0) + line["usd_per_month"]
    for line in fixed:
        line["group"] = group_of(line["item"])
        line["quantity_per_month"] = line.pop("quantity_per_batch")
        line["usd_per_month"] = line.pop("usd_per_batch")
        groups[line["group"]] = groups.get(line["group"], 0.0) + line["usd_per_month"]
    per_month = sum(groups.values())
    outside = sum(v for g, v in groups.items() if g not in CORE_PARTS)
    return {
        "per_month_usd": per_month,
        # everything, the fixed monthly items included, per million batches at this rate
        "per_million_batches_usd": per_month / batches_per_month * 1e6,
        "fixed_per_month_usd": sum(line["usd_per_month"] for line in fixed),
        "by_part_per_month_usd": groups,
        "by_part_per_million_batches_usd": {g: v / batches_per_month * 1e6 for g, v in groups.items()},
        "outside_ingest_indexing_storage_share": outside / per_month if per_month else 0.0,
        "lines": lines,
        "fixed": fixed,
    }


def estimate(batches_per_second: float, frame_bytes: int, *, assumptions: Assumptions | None = None,
             prices: PriceTable = PRICE_TABLE) -> dict[str, Any]:
    """Both designs at ``batches_per_second`` with frames of ``frame_bytes``."""
    if batches_per_second <= 0 or frame_bytes <= 0:
        raise ValueError("batches_per_second and frame_bytes must be positive")
    a = assumptions or Assumptions()
    per_month = batches_per_second * MONTH_S
    ours = _design(*lightmetrics_lines(frame_bytes, a, prices, batches_per_second=batches_per_second), per_month)
    alt = _design(*alternative_lines(frame_bytes, a, prices, batches_per_second=batches_per_second), per_month)
    return {
        "batches_per_second": batches_per_second,
        "frame_bytes": frame_bytes,
        "retention_days": a.retention_days,
        "system_age_days": a.system_age_days,
        "batches_per_month": per_month,
        "assumptions": {**asdict(a), "reconcile_passes_per_entry": a.reconcile_passes_per_entry,
                        "reconcile_repairs_per_entry": a.reconcile_repairs_per_entry},
        "measured_requests": MEASURED_REQUESTS,
        "job_requests": JOB_REQUESTS,
        "job_units_per_month": job_units(batches_per_second, a),
        "prices": prices.to_json(),
        "designs": {"lightmetrics": ours, "dynamodb-dedupe": alt},
        "ratio_lightmetrics_to_alternative": (ours["per_month_usd"] / alt["per_month_usd"]
                                              if alt["per_month_usd"] else None),
    }
