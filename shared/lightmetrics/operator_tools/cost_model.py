"""Dollars per month and per million accepted batches at a rate: ``lmctl cost`` and docs/cost.md.

Every recurring component is priced as (requests per unit of work, by API) x (units per month):

* the hot path (accept, the S3 -> SQS event path, both indexers) from :data:`MEASURED_REQUESTS`,
  checked against live counts by tests/test_bench.py;
* the background jobs (steady-state reconciler, the walk — weekly only on a bucket without S3
  Inventory: ``walks_per_month``, 0 by default —, daily incremental GC, daily retention) from
  :data:`JOB_REQUESTS`: requests by API, Step Functions state transitions
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
from dataclasses import asdict
from typing import Any

from lightmetrics.deployment.pricing import PRICE_TABLE, PriceTable
from lightmetrics.derived.reconcile_fanout import fanout_requests
from lightmetrics.operator_tools.cost_workload import (
    DAY_S,
    HOUR_CLOSE_REQUESTS,
    JOB_REQUESTS,
    MEASURED_REQUESTS,
    MONTH_S,
    Assumptions,
    inventory_objects,
    job_requests,
    job_units,
    retention_marks_capacity,
)
from lightmetrics.operator_tools.indexer_invocations import index_cpu_ms, index_messages_per_invocation

#: S3 APIs billed at the PUT/LIST rate; DELETE is free (DeleteObjects priced as its deletes: at the
#: PUT rate it would be 6 requests a 1,000 batches, $0.03 a million); everything else at the GET rate.
_S3_PUT_CLASS = {"s3.PutObject", "s3.CopyObject", "s3.ListObjectsV2", "s3.CompleteMultipartUpload"}
_S3_FREE = {"s3.DeleteObject", "s3.DeleteObjects"}
_DDB_WRITES = {"dynamodb.PutItem", "dynamodb.UpdateItem", "dynamodb.DeleteItem"}
_DDB_READS = {"dynamodb.GetItem", "dynamodb.Query"}
#: Parts that are not "ingest, indexing and storage" (the target: at most 15 % of the total).
CORE_PARTS = ("ingest", "indexing", "storage")
#: Derived-state upkeep: everything that keeps the derived indexes, indexing included (GC reaps
#: blobs, not derived state, and is left out).
UPKEEP_PARTS = ("indexing", "reconciler", "walk", "retention", "audit")


# --- lines -------------------------------------------------------------------------------------------
def _line(item: str, quantity: float, unit: str, usd_per_batch: float) -> dict[str, Any]:
    return {"item": item, "quantity_per_batch": quantity, "unit": unit, "usd_per_batch": usd_per_batch}


def _gb_s(ms: float, memory_mb: int) -> float:
    return ms / 1000.0 * memory_mb / 1024.0


def _months(days: float) -> float:
    return days * DAY_S / MONTH_S


def _s3_requests(requests: Mapping[str, float]) -> float:
    return sum(n for api, n in requests.items() if api.startswith("s3."))


def control_table_units(requests: Mapping[str, float]) -> tuple[float, float]:
    """(WRU, RRU) of ``requests``: items are small (<= 1 KB, <= 4 KB read); a transaction writes 2
    of them at 2 WRU each.

    >>> control_table_units({"dynamodb.UpdateItem": 2, "dynamodb.TransactWriteItems": 1, "dynamodb.Query": 3})
    (6.0, 3.0)
    """
    wru = sum(n for api, n in requests.items() if api in _DDB_WRITES) \
        + 4 * requests.get("dynamodb.TransactWriteItems", 0.0)
    rru = sum(n for api, n in requests.items() if api in _DDB_READS)
    return float(wru), float(rru)


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
    wru, rru = control_table_units(requests)
    wru, rru = wru + extra_wru, rru + extra_rru
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


def _hot_path(a: Assumptions, batches_per_second: float) -> dict[str, dict[str, float]]:
    """Per-batch requests of ingest and indexing."""
    m = MEASURED_REQUESTS
    ingest: dict[str, float] = {**m["accept.new"], "lambda.Invoke": 1}
    indexing: dict[str, float] = {}
    for op in ("index.accepted_manifest", "index.raw_blob"):
        for api, n in m[op].items():
            indexing[api] = indexing.get(api, 0) + n
    # 2 notifications (manifest, blob) on 2 queues at the batch rate each: a SendMessage by S3
    # each, and per SQS batch (sqs_batching: from the window and the rate) one ReceiveMessage and
    # one DeleteMessageBatch by the event source mapping
    per_invocation = index_messages_per_invocation(batches_per_second, a)
    indexing["sqs.messages"] = 2 * (1 + 2 / per_invocation)
    indexing["lambda.Invoke"] = 2 / per_invocation
    indexing["sqs.messages_per_invocation"] = per_invocation
    return {"ingest": ingest, "indexing": dict(indexing)}


def lightmetrics_lines(frame_bytes: int, a: Assumptions, prices: PriceTable, *, batches_per_second: float = 100.0,
                       reconcile_shards: int = 1) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(per-batch lines, fixed monthly lines) for this system."""
    p = prices.price
    per_month = batches_per_second * MONTH_S
    hot = _hot_path(a, batches_per_second)
    per_invocation = hot["indexing"].pop("sqs.messages_per_invocation")
    lines = traffic_lines("ingest", hot["ingest"], a, prices, gb_s=_gb_s(a.ingest_ms, a.ingest_memory_mb),
                          log_bytes_per_invocation=a.ingest_log_bytes)
    # an indexer invocation: its round trips, then its CPU (measured: fixed, and per record with
    # the SDK's per S3 request; Lambda's CPU follows memory below one vCPU)
    invocations = hot["indexing"]["lambda.Invoke"]
    s3_per_record = _s3_requests(hot["indexing"]) / (invocations * per_invocation)
    cpu_ms = index_cpu_ms(a, per_invocation, s3_per_record)
    lines += traffic_lines("indexing", hot["indexing"], a, prices,
                           gb_s=invocations * _gb_s(a.index_io_ms + cpu_ms, a.index_memory_mb),
                           log_bytes_per_invocation=a.task_log_bytes)

    units = job_units(batches_per_second, a)
    overhead = _gb_s(a.task_overhead_ms, 512)
    # reconciler (its runs are in the fixed lines)
    u = units["reconciler"]
    req = _per_batch(job_requests("reconciler", u), per_month)
    lines += traffic_lines("reconciler", req, a, prices,
                           gb_s=u["entry.verified"] / per_month * _gb_s(a.reconcile_entry_ms, a.reconcile_memory_mb))
    # the walk: weekly only on a bucket without S3 Inventory (walks_per_month; none by default)
    u = units["walk"]
    req = _per_batch(job_requests("walk", u), per_month)
    probed = u["key.retained"] / per_month
    lines += traffic_lines("walk", req, a, prices, log_bytes_per_invocation=a.task_log_bytes,
                           gb_s=probed * _gb_s(a.walk_key_ms, a.walk_memory_mb)
                           + u["page"] / per_month * _gb_s(a.walk_page_ms, a.walk_memory_mb)
                           + req.get("lambda.Invoke", 0.0) * overhead)
    # the daily GC of the audit's orphan candidates (the audit's own confirmation of each, a HEAD of
    # the blob, a GET of the record and a HEAD of the evidence, is counted with it)
    u = units["gc"]
    req = _per_batch(job_requests("gc-audit", u), per_month)
    req["s3.HeadObject"] = req.get("s3.HeadObject", 0.0) + 2 * u["candidate.orphan"] / per_month
    req["s3.GetObject"] = req.get("s3.GetObject", 0.0) + u["candidate.orphan"] / per_month
    lines += traffic_lines("GC", req, a, prices, log_bytes_per_invocation=a.task_log_bytes,
                           gb_s=u["candidate.orphan"] / per_month * _gb_s(a.gc_blob_ms, a.reap_memory_mb)
                           + req.get("lambda.Invoke", 0.0) * overhead)
    # daily retention; its marks items are priced by size: a mark is written with its page's
    # intent, again as marked, and deleted when settled (3 transactional writes, 2 WRU per KB), and
    # every task of a settle round reads all pending marks (consistent reads, 1 RRU per 4 KB)
    u = units["retention"]
    if u:
        req = _per_batch(job_requests("retention", u), per_month)
        marks_wru, marks_rru = retention_marks_capacity(a)
        lines += traffic_lines("retention", req, a, prices, log_bytes_per_invocation=a.task_log_bytes,
                               gb_s=_gb_s(a.retention_batch_ms, a.retention_memory_mb) + req["lambda.Invoke"] * overhead,
                               extra_wru=marks_wru, extra_rru=marks_rru)
    # the inventory audit: S3 Inventory of every version, its Parquet reports in the ops bucket,
    # the Spark audit over them on EMR Serverless, audits_per_month times
    objects = inventory_objects(batches_per_second, a)
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
    return lines, _fixed_lines(a, prices, reconcile_shards)


def _fixed_lines(a: Assumptions, prices: PriceTable, reconcile_shards: int = 1) -> list[dict[str, Any]]:
    """Monthly costs that do not follow the batch rate (the reconciler's runs: one schedule whose run
    fans out a message to each shard, and a run a shard)."""
    p = prices.price
    fanouts = MONTH_S / a.reconcile_every_s
    runs = fanouts * reconcile_shards
    fanout_sqs = fanouts * sum(fanout_requests(reconcile_shards).values())
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
    shard_polls = a.sqs_pollers_per_queue * MONTH_S / 20
    return [
        _line("reconciler: shard runs", runs, "invocations",
              runs * (invoke + _gb_s(a.reconcile_run_ms, a.reconcile_memory_mb) * p("lambda.gb_second")
                      + log_gb * log_price)),
        _line("reconciler: fan-out (send, receive, delete per shard)", fanout_sqs,
              "SQS requests", fanout_sqs / 1e6 * p("sqs.per_million")
              + fanouts * (invoke + _gb_s(a.reconcile_fanout_ms, a.reconcile_memory_mb) * p("lambda.gb_second")
                           + log_gb * log_price)),
        _line("reconciler: SQS idle long polls (shards queue)", shard_polls, "requests",
              shard_polls / 1e6 * p("sqs.per_million")),
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
        "derived_state_upkeep_share": (sum(v for g, v in groups.items() if g in UPKEEP_PARTS) / per_month
                                       if per_month else 0.0),
        "lines": lines,
        "fixed": fixed,
    }


def estimate(batches_per_second: float, frame_bytes: int, *, assumptions: Assumptions | None = None,
             prices: PriceTable = PRICE_TABLE, reconcile_shards: int = 1) -> dict[str, Any]:
    """Both designs at ``batches_per_second`` with frames of ``frame_bytes`` (``reconcile_shards``
    scheduled reconciler runs every period)."""
    if batches_per_second <= 0 or frame_bytes <= 0:
        raise ValueError("batches_per_second and frame_bytes must be positive")
    a = assumptions or Assumptions()
    per_month = batches_per_second * MONTH_S
    ours = _design(*lightmetrics_lines(frame_bytes, a, prices, batches_per_second=batches_per_second,
                                       reconcile_shards=reconcile_shards), per_month)
    alt = _design(*alternative_lines(frame_bytes, a, prices, batches_per_second=batches_per_second), per_month)
    return {
        "batches_per_second": batches_per_second,
        "frame_bytes": frame_bytes,
        "retention_days": a.retention_days,
        "system_age_days": a.system_age_days,
        "batches_per_month": per_month,
        "sqs_messages_per_invocation": index_messages_per_invocation(batches_per_second, a),
        "reconcile_shards": reconcile_shards,
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
