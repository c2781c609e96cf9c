"""Dollars per million accepted batches and per month at a rate: ``lmctl cost`` and docs/cost.md.

Inputs: the request counts per operation measured by the request counter
(:data:`MEASURED_REQUESTS`, checked against live counts by tests/test_bench.py and printed by
``lmctl bench cost-table``), stated assumptions (:class:`Assumptions`: Lambda durations, SQS batch
size, schedules, object sizes) and the dated price table (:mod:`lightmetrics.pricing`).

Two estimates side by side:

* ``lightmetrics``: this system on the happy path (every batch new): ingest, the S3 -> SQS event
  path and both indexers, the steady-state reconciler (which lists the open hours on every run and
  repairs each entry once, or twice when it lands within the margin of a run), the weekly bootstrap walk over retained history, one
  retention reap per batch, storage for the retention period, and fixed scheduled costs.
* ``dynamodb-dedupe``: what a team would otherwise build — one DynamoDB conditional PutItem per
  batch as the dedupe record (plus a GSI to enumerate by time), and the S3 blob. It leaves out
  whatever that team would add to reconcile blobs against records.

Example:
    >>> est = estimate(batches_per_second=100, frame_bytes=4096)
    >>> round(est["designs"]["lightmetrics"]["per_million_batches_usd"], 2) > 0
    True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from lightmetrics.pricing import PRICE_TABLE, PriceTable

MONTH_S = 30.4375 * 86400  # an average month

#: Requests per operation, by API (``lmctl bench cost-table``; verified live by tests/test_bench.py).
MEASURED_REQUESTS: dict[str, dict[str, int]] = {
    "accept.new": {"s3.PutObject": 2},
    "accept.duplicate": {"s3.GetObject": 1, "s3.HeadObject": 1, "s3.PutObject": 2},
    "accept.conflict": {"s3.GetObject": 1, "s3.HeadObject": 1, "s3.PutObject": 3},
    "accept.conflict_again": {"s3.GetObject": 1, "s3.HeadObject": 2, "s3.PutObject": 3},
    "index.accepted_manifest": {"s3.GetObject": 1, "s3.PutObject": 2},
    "index.raw_blob": {"s3.HeadObject": 1, "s3.PutObject": 1},
    "walk.repair_per_key": {"s3.GetObject": 1, "s3.HeadObject": 1, "s3.PutObject": 3},
}
#: S3 APIs billed at the PUT/LIST rate; everything else at the GET rate (DELETE is free).
_S3_PUT_CLASS = {"s3.PutObject", "s3.CopyObject", "s3.ListObjectsV2", "s3.CompleteMultipartUpload"}


@dataclass(frozen=True)
class Assumptions:
    """What the model cannot measure locally; every figure is an input to edit, not a fact."""

    ingest_ms: float = 120.0  # billed duration per accept: 2 sequential S3 round trips + auth/validation
    ingest_memory_mb: int = 1024  # resources.py: the ingest function
    index_batch_ms: float = 200.0  # per SQS batch of 10 records, records concurrent (~5-6 round trips)
    index_memory_mb: int = 512
    sqs_batch_size: int = 10
    reconcile_every_s: int = 300  # resources.py: rate(5 minutes)
    settle_s: int = 900  # LM_SETTLE_S default
    reconcile_margin_s: int = 120  # LM_RECONCILE_MARGIN_S default
    reconcile_entry_ms: float = 10.0  # billed ms per repaired entry (repairs run in a pool)
    reconcile_run_ms: float = 300.0  # fixed part of each scheduled run (checkpoint, probes, listing)
    reconcile_memory_mb: int = 512
    retention_days: float = 90.0  # LM_RETENTION_S default
    system_age_days: float = 365.0  # how long the system has accepted (the walk lists all of it)
    walks_per_month: float = 4.35  # the weekly schedule
    walk_page_size: int = 1000
    walk_key_ms: float = 10.0
    walk_memory_mb: int = 1024
    walk_transitions_per_page: float = 4.0  # Plan/Map/Page/Choice per page, amortized
    walk_wru_per_page: float = 2.0  # checkpoint update (+ lease renewals)
    # GC of the batch's blob: prove (HEAD blob, GET manifest, HEAD quarantine) and, after the grace,
    # check again (GET manifest, HEAD quarantine) — tests/test_reap.py::test_gc_proof_cost_matches_the_contract;
    # its deletes and those of the derived entries are free
    reap_requests_per_batch: int = 5
    manifest_bytes: int = 700
    derived_bytes: int = 1200  # accepted-by-time + accepted-by-blob + raw-blobs-by-time
    sqs_pollers_per_queue: int = 5  # Lambda's SQS event source, 20 s long polls when idle
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


def _gb_s(ms: float, memory_mb: int) -> float:
    return ms / 1000.0 * memory_mb / 1024.0


def _s3_lines(prefix: str, by_api: dict[str, float], prices: PriceTable, times: float = 1.0) -> list[dict[str, Any]]:
    puts = sum(n for api, n in by_api.items() if api in _S3_PUT_CLASS) * times
    gets = sum(n for api, n in by_api.items() if api not in _S3_PUT_CLASS) * times
    out = []
    if puts:
        out.append(_line(f"{prefix}: S3 PUT/LIST", puts, "requests", puts / 1000 * prices.price("s3.put_per_1000")))
    if gets:
        out.append(_line(f"{prefix}: S3 GET/HEAD", gets, "requests", gets / 1000 * prices.price("s3.get_per_1000")))
    return out


def _line(item: str, quantity: float, unit: str, usd_per_batch: float) -> dict[str, Any]:
    return {"item": item, "quantity_per_batch": quantity, "unit": unit, "usd_per_batch": usd_per_batch}


def _lambda_lines(name: str, invocations: float, ms: float, memory_mb: int, prices: PriceTable) -> list[dict[str, Any]]:
    return [
        _line(f"{name}: Lambda invocations", invocations, "invocations",
              invocations / 1e6 * prices.price("lambda.per_million_requests")),
        _line(f"{name}: Lambda duration", invocations * _gb_s(ms, memory_mb), "GB-s",
              invocations * _gb_s(ms, memory_mb) * prices.price("lambda.gb_second")),
    ]


def lightmetrics_lines(frame_bytes: int, a: Assumptions, prices: PriceTable) -> tuple[list[dict[str, Any]],
                                                                                      list[dict[str, Any]]]:
    """(per-batch lines, fixed monthly lines) for this system."""
    lines: list[dict[str, Any]] = []
    m = MEASURED_REQUESTS
    # ingest
    lines += _lambda_lines("ingest", 1, a.ingest_ms, a.ingest_memory_mb, prices)
    lines += _s3_lines("ingest (accept, new)", m["accept.new"], prices)
    # event path: 2 notifications (manifest, blob); per message a SendMessage by S3, and per SQS
    # batch one ReceiveMessage and one DeleteMessageBatch by the event source mapping
    sqs = 2 * (1 + 2 / a.sqs_batch_size)
    lines.append(_line("event path: SQS requests", sqs, "requests", sqs / 1e6 * prices.price("sqs.per_million")))
    lines += _lambda_lines("indexers", 2 / a.sqs_batch_size, a.index_batch_ms, a.index_memory_mb, prices)
    lines += _s3_lines("index accepted manifest", m["index.accepted_manifest"], prices)
    lines += _s3_lines("index raw blob", m["index.raw_blob"], prices)
    # steady-state reconciler: listed on every pass while the entry's hour is open, repaired once
    # (or twice, within the margin) — protocol §12 R4
    repairs = a.reconcile_repairs_per_entry
    lines += _s3_lines("reconciler repairs", m["walk.repair_per_key"], prices, times=repairs)
    lines += _s3_lines("reconciler listings", {"s3.ListObjectsV2": 1 / 1000}, prices,
                       times=a.reconcile_passes_per_entry)
    gbs = repairs * _gb_s(a.reconcile_entry_ms, a.reconcile_memory_mb)
    lines.append(_line("reconciler: Lambda duration", gbs, "GB-s", gbs * prices.price("lambda.gb_second")))
    # The weekly walk lists every acceptance record ever made (they are permanent): a batch inside
    # retention gets a full repair, a reaped one a GET + HEAD (its hour is tombstoned: no PUTs).
    # Amortized per accepted batch, so this line grows with the system's age, not with traffic.
    live_days = min(a.system_age_days, a.retention_days)
    reaped_days = max(0.0, a.system_age_days - a.retention_days)
    walked = a.walks_per_month * live_days * 86400 / MONTH_S
    walked_reaped = a.walks_per_month * reaped_days * 86400 / MONTH_S
    lines += _s3_lines("bootstrap walk (retained batches)",
                       {**m["walk.repair_per_key"], "s3.ListObjectsV2": 1 / a.walk_page_size}, prices, times=walked)
    if walked_reaped:
        lines += _s3_lines("bootstrap walk (reaped batches)",
                           {"s3.GetObject": 1, "s3.HeadObject": 1, "s3.ListObjectsV2": 1 / a.walk_page_size},
                           prices, times=walked_reaped)
    keys = walked + walked_reaped
    gbs = keys * _gb_s(a.walk_key_ms, a.walk_memory_mb)
    lines.append(_line("bootstrap walk: Lambda duration", gbs, "GB-s", gbs * prices.price("lambda.gb_second")))
    transitions = keys * a.walk_transitions_per_page / a.walk_page_size
    lines.append(_line("bootstrap walk: Step Functions transitions", transitions, "transitions",
                       transitions / 1000 * prices.price("stepfunctions.per_1000_transitions")))
    wru = keys * a.walk_wru_per_page / a.walk_page_size
    lines.append(_line("bootstrap walk: DynamoDB checkpoints", wru, "WRU",
                       wru / 1e6 * prices.price("dynamodb.per_million_wru")))
    # retention reap: the GC proof per batch (deletes are free); listing the hour
    lines += _s3_lines("retention reap", {"s3.HeadObject": a.reap_requests_per_batch, "s3.ListObjectsV2": 1 / 1000},
                       prices)
    # storage for the retention period
    gb_months = (frame_bytes + a.manifest_bytes + a.derived_bytes) / 1e9 * a.retention_days * 86400 / MONTH_S
    lines.append(_line("S3 storage (retention period)", gb_months, "GB-months",
                       gb_months * prices.price("s3.storage_gb_month")))
    # fixed: reconciler runs, idle SQS long polls on the 3 index queues
    runs = MONTH_S / a.reconcile_every_s
    fixed = [
        _line("reconciler: scheduled runs", runs, "invocations/month",
              runs / 1e6 * prices.price("lambda.per_million_requests")
              + runs * _gb_s(a.reconcile_run_ms, a.reconcile_memory_mb) * prices.price("lambda.gb_second")),
    ]
    polls = 3 * a.sqs_pollers_per_queue * MONTH_S / 20
    fixed.append(_line("SQS idle long polls (3 index queues)", polls, "requests/month",
                       polls / 1e6 * prices.price("sqs.per_million")))
    return lines, fixed


def alternative_lines(frame_bytes: int, a: Assumptions, prices: PriceTable) -> tuple[list[dict[str, Any]],
                                                                                     list[dict[str, Any]]]:
    """(per-batch lines, fixed monthly lines) for a DynamoDB conditional put + S3 blob design."""
    lines: list[dict[str, Any]] = []
    lines += _lambda_lines("ingest", 1, a.ingest_ms, a.ingest_memory_mb, prices)
    lines += _s3_lines("ingest (blob)", {"s3.PutObject": 1}, prices)
    wru = math.ceil(a.alt_item_bytes / 1024) * (1 + a.alt_gsi_count)
    lines.append(_line("ingest: DynamoDB conditional PutItem (+ GSI)", wru, "WRU",
                       wru / 1e6 * prices.price("dynamodb.per_million_wru")))
    retained_months = a.retention_days * 86400 / MONTH_S
    table_gb_months = a.alt_item_bytes * (1 + a.alt_gsi_count) / 1e9 * retained_months
    ddb_storage = table_gb_months * (prices.price("dynamodb.storage_gb_month")
                                     + (prices.price("dynamodb.pitr_gb_month") if a.alt_pitr else 0.0))
    lines.append(_line("DynamoDB storage (+ PITR)", table_gb_months, "GB-months", ddb_storage))
    gb_months = frame_bytes / 1e9 * retained_months
    lines.append(_line("S3 storage (retention period)", gb_months, "GB-months",
                       gb_months * prices.price("s3.storage_gb_month")))
    return lines, []


def group_of(item: str) -> str:
    """The part of the system a cost line belongs to."""
    for group, starts in (("ingest", ("ingest",)), ("indexing", ("event path", "indexers", "index ")),
                          ("reconciler", ("reconciler",)), ("walk", ("bootstrap walk",)), ("reap", ("retention reap",)),
                          ("storage", ("S3 storage", "DynamoDB storage")), ("fixed", ("SQS idle",))):
        if item.startswith(starts):
            return group
    return "other"


def _design(lines: list[dict[str, Any]], fixed: list[dict[str, Any]], batches_per_month: float) -> dict[str, Any]:
    per_batch = sum(line["usd_per_batch"] for line in lines)
    groups: dict[str, float] = {}
    for line in lines:
        line["group"] = group_of(line["item"])
        groups[line["group"]] = groups.get(line["group"], 0.0) + line["usd_per_batch"] * 1e6
    fixed_month = sum(line["usd_per_batch"] for line in fixed)
    for line in lines:
        line["usd_per_million_batches"] = line["usd_per_batch"] * 1e6
        line["usd_per_month"] = line["usd_per_batch"] * batches_per_month
    for line in fixed:
        line["usd_per_month"] = line.pop("usd_per_batch")
    return {
        "per_million_batches_usd": per_batch * 1e6,
        "per_month_usd": per_batch * batches_per_month + fixed_month,
        "fixed_per_month_usd": fixed_month,
        "per_million_batches_by_group_usd": groups,
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
    ours = _design(*lightmetrics_lines(frame_bytes, a, prices), per_month)
    alt = _design(*alternative_lines(frame_bytes, a, prices), per_month)
    return {
        "batches_per_second": batches_per_second,
        "frame_bytes": frame_bytes,
        "batches_per_month": per_month,
        "assumptions": {**asdict(a), "reconcile_passes_per_entry": a.reconcile_passes_per_entry,
                        "reconcile_repairs_per_entry": a.reconcile_repairs_per_entry},
        "measured_requests": MEASURED_REQUESTS,
        "prices": prices.to_json(),
        "designs": {"lightmetrics": ours, "dynamodb-dedupe": alt},
        "ratio_lightmetrics_to_alternative": ours["per_month_usd"] / alt["per_month_usd"] if alt["per_month_usd"] else None,
    }
