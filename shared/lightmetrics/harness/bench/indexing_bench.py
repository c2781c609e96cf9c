"""``lmctl bench indexing``: accepted manifests indexed per second, and sequential round trips per
SQS batch, against a sequential processor (one record after another) in the same run.

Per repeat: a fresh system with S3 -> SQS notifications on; ``batches`` batches are accepted
(seeding, no injected latency), which queues one ObjectCreated message per manifest on the
``index-accepted`` queue. The real indexer handler (Powertools batch processing, records
concurrently) is then fed those messages in SQS batches of 10, through the event pump; each
handler invocation is timed. The baseline then indexes the same manifests one record at a time
(:func:`lightmetrics.derived.indexing.index_accepted` per key: the "sequential processor"). Its writes
answer 412 where the handler's created: the same requests and round trips.

Sequential round trips per batch = handler seconds per full SQS batch / the effective RTT (one
conditional PUT on one caller, measured in the same repeat: injected delay + local per-request
cost). An estimate from wall-clock; exact request counts per record come from the request counter.

Example:
    >>> with BenchEnv() as env:                                           # doctest: +SKIP
    ...     report = run_indexing(env, batches=100, repeat=3)
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.derived.indexing import KIND_ACCEPTED, index_accepted
from lightmetrics.harness.bench.harness import BenchEnv, Figures
from lightmetrics.harness.bench.workload import batch_frames, seed_history
from lightmetrics.lambda_shell.sqs_batch import sqs_index_handler
from lightmetrics.local.pump import EventPump, Route
from lightmetrics.work.units import run_unit

SQS_BATCH = 10


def _one_repeat(env: BenchEnv, batches: int) -> dict[str, Any]:
    system = env.system(notifications=True)
    settings = system.settings
    assert settings is not None
    seed_history(settings, env.raw_s3(), batch_frames(f"idx-{uuid.uuid4().hex[:6]}", "boot-1", batches))
    counter = RequestCounter()
    q = system.made["queues"]["index-accepted"]
    handler = sqs_index_handler(kind=KIND_ACCEPTED, queue="index-accepted", settings_factory=lambda: settings,
                                work_context_factory=lambda s, **kw: system.work_context(
                                    component="index", counter=counter, **kw))
    handler_seconds: list[float] = []
    records: list[int] = []
    keys: list[str] = []

    def timed(event: dict[str, Any], context: Any) -> Any:
        for rec in event["Records"]:
            keys.extend(_manifest_keys(rec["body"]))
        t0 = time.perf_counter()
        with counter.operation("sqs-batch"):
            out = handler(event, context)
        handler_seconds.append(time.perf_counter() - t0)
        records.append(len(event["Records"]))
        return out

    pump = EventPump(system.runtime.boto3_client("sqs"), [], batch_size=SQS_BATCH)
    route = Route("index-accepted", q["url"], q["arn"], "index-accepted", timed)
    idle = 0
    while idle < 3:  # moto's SQS may hold a message back for a moment; stop after a few empty polls
        idle = 0 if pump.pump_once(route, wait_s=0) else idle + 1
    indexed = len(set(keys))
    seconds = sum(handler_seconds)

    # Baseline: the sequential processor over the same keys, in batches of 10.
    base_ctx = system.work_context(component="index-sequential", counter=counter)
    base_batches: list[float] = []
    unique = sorted(set(keys))
    for i in range(0, len(unique), SQS_BATCH):
        t0 = time.perf_counter()
        for key in unique[i:i + SQS_BATCH]:
            with counter.operation("sequential-record"):
                run_unit(base_ctx, kind=KIND_ACCEPTED, object_key=key, source="bench",
                         fn=lambda k=key: index_accepted(base_ctx, k))
        base_batches.append(time.perf_counter() - t0)
    full = [s for s, n in zip(handler_seconds, records) if n == SQS_BATCH]
    return {
        "effective_rtt_s": env.effective_rtt(system),
        "indexed": indexed,
        "objects_per_s": indexed / seconds if seconds else 0.0,
        "baseline_objects_per_s": len(unique) / sum(base_batches) if base_batches else 0.0,
        "batch_seconds": sorted(full or handler_seconds),
        "baseline_batch_seconds": sorted(base_batches),
        "sqs_batches": len(handler_seconds),
        "requests_per_batch": counter.requests_by_operation["sqs-batch"] / max(1, len(handler_seconds)),
        # per indexed manifest (the queue's s3:TestEvent message costs nothing); includes the
        # tombstone HEAD, once per hour per handler context
        "requests_per_record": counter.requests_by_operation["sqs-batch"] / max(1, indexed),
        "baseline_requests_per_record": counter.per_operation("sequential-record"),
        "by_api": dict(counter.totals),
    }


def _manifest_keys(body: str) -> list[str]:
    from lightmetrics.derived.event_path import parse_notification

    return [o.key for o in parse_notification(body) or []]


def run_indexing(env: BenchEnv, *, batches: int = 200, repeat: int = 3) -> dict[str, Any]:
    figures = Figures()
    last: dict[str, Any] = {}
    for _ in range(repeat):
        r = _one_repeat(env, batches)
        last = r
        med = r["batch_seconds"][len(r["batch_seconds"]) // 2] if r["batch_seconds"] else 0.0
        base_med = r["baseline_batch_seconds"][len(r["baseline_batch_seconds"]) // 2] if r["baseline_batch_seconds"] else 0.0
        figures.add("objects_per_s", r["objects_per_s"])
        figures.add("baseline_objects_per_s", r["baseline_objects_per_s"])
        figures.add("speedup", r["objects_per_s"] / r["baseline_objects_per_s"] if r["baseline_objects_per_s"] else 0.0)
        rtt = r["effective_rtt_s"]
        figures.add("effective_rtt_ms", rtt * 1000)
        figures.add("round_trips_per_sqs_batch", med / rtt)
        figures.add("baseline_round_trips_per_sqs_batch", base_med / rtt)
        figures.add("requests_per_record", r["requests_per_record"])
    return {
        "target": "indexing",
        "environment": env.describe(),
        "params": {"batches": batches, "sqs_batch": SQS_BATCH, "repeat": repeat},
        "baseline": "sequential processor: index_accepted one record after another, same keys, same run",
        "figures": figures.summary(),
        "counts": {"indexed_last_repeat": last.get("indexed"), "sqs_batches_last_repeat": last.get("sqs_batches"),
                   "requests_per_record": last.get("requests_per_record"),
                   "baseline_requests_per_record": last.get("baseline_requests_per_record"),
                   "by_api_last_repeat": last.get("by_api")},
    }


def indexing_bars(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    f = report["figures"]
    return [("objects/s", f["objects_per_s"], f["baseline_objects_per_s"]),
            ("round trips / SQS batch", f["round_trips_per_sqs_batch"], f["baseline_round_trips_per_sqs_batch"])]
