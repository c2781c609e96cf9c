"""``lmctl bench accept``: accept throughput and latency at 1, 8 and 32 concurrent callers.

Per caller count and repeat: every caller accepts its own new batches through the collector's
accept path (:func:`lightmetrics.acceptance.accept.accept_batch`, latency-injected S3 client). Figures:
batches/s, p50/p99 latency, p50 latency divided by the injected RTT (2 sequential round trips on
the happy path: target about 2; also divided by the effective RTT, one conditional PUT on one
caller measured in the same repeat, which adds this machine's per-request cost), and throughput
against the local ceiling — the conditional-PUT rate of the same runtime, same client, same
callers, measured in the same repeat, divided by 2
(an accept is two conditional PUTs).

Example:
    >>> with BenchEnv(latency_ms=20, max_inflight=8) as env:             # doctest: +SKIP
    ...     report = run_accept(env, callers=(1, 8), batches_per_caller=10, repeat=3)
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lightmetrics.acceptance.accept import AcceptStatus, accept_batch
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import accept_context, s3_client
from lightmetrics.harness.bench.harness import BenchEnv, Figures, percentile
from lightmetrics.harness.bench.workload import batch_frames

CALLERS = (1, 8, 32)


def _accept_round(ctx: Any, counter: RequestCounter, callers: int, per_caller: int) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    work = [batch_frames(f"bench-{run}-{c}", "boot-1", per_caller) for c in range(callers)]
    latencies: list[float] = []
    requests: list[int] = []
    statuses: set[AcceptStatus] = set()
    lock = threading.Lock()
    start = threading.Barrier(callers)

    def caller(batches: list[Any]) -> None:
        start.wait()
        for ident, frame in batches:
            t0 = time.perf_counter()
            with counter.operation("accept") as op:
                status = accept_batch(ctx, ident, frame).status
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                requests.append(op.total)
                statuses.add(status)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(caller, work))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "batches": callers * per_caller, "latencies": latencies, "requests": requests,
            "statuses": sorted(s.value for s in statuses)}


def _ceiling_round(client: Any, bucket: str, callers: int, puts: int) -> float:
    """Conditional PUTs per second of new small keys with ``callers`` threads (no protocol logic)."""
    run = uuid.uuid4().hex[:8]
    per = max(1, puts // callers)
    start = threading.Barrier(callers)

    def caller(c: int) -> None:
        start.wait()
        for k in range(per):
            client.put_object(Bucket=bucket, Key=f"bench-ceiling/{run}/{c}/{k}", Body=b"x" * 64, IfNoneMatch="*")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(caller, range(callers)))
    return callers * per / (time.perf_counter() - t0)


def run_accept(env: BenchEnv, *, callers: tuple[int, ...] = CALLERS, batches_per_caller: int = 20,
               repeat: int = 3) -> dict[str, Any]:
    system = env.system()
    assert system.settings is not None
    counter = RequestCounter()
    ctx = accept_context(system.settings, session=env.session, counter=counter)
    ceiling_client = s3_client(system.settings, session=env.session, component="bench-ceiling")
    figures = Figures()
    counts: dict[str, Any] = {"requests_per_accept": set(), "statuses": set()}
    injected_before = env.injector.snapshot()["requests"]
    for _ in range(repeat):
        rtt = env.effective_rtt(system)
        figures.add("effective_rtt_ms", rtt * 1000)
        for c in callers:
            # Ceiling and accept alternate within a repeat, so drift hits both alike.
            put_rate = _ceiling_round(ceiling_client, system.bucket, c, max(2 * c * batches_per_caller, 16))
            r = _accept_round(ctx, counter, c, batches_per_caller)
            rate = r["batches"] / r["seconds"]
            p50, p99 = percentile(r["latencies"], 0.5), percentile(r["latencies"], 0.99)
            ceiling = put_rate / 2
            figures.add(f"c{c}.batches_per_s", rate)
            figures.add(f"c{c}.p50_ms", p50 * 1000)
            figures.add(f"c{c}.p99_ms", p99 * 1000)
            figures.add(f"c{c}.p50_over_rtt", p50 / env.rtt_s if env.rtt_s else 0.0)
            figures.add(f"c{c}.p50_over_effective_rtt", p50 / rtt)
            figures.add(f"c{c}.ceiling_batches_per_s", ceiling)
            figures.add(f"c{c}.ratio_to_ceiling", rate / ceiling)
            counts["requests_per_accept"].update(r["requests"])
            counts["statuses"].update(r["statuses"])
    summary = figures.summary()
    rows = []
    for c in callers:
        rows.append({
            "callers": c,
            "batches_per_s": summary[f"c{c}.batches_per_s"],
            "p50_ms": summary[f"c{c}.p50_ms"],
            "p99_ms": summary[f"c{c}.p99_ms"],
            "p50_over_rtt": summary[f"c{c}.p50_over_rtt"],
            "p50_over_effective_rtt": summary[f"c{c}.p50_over_effective_rtt"],
            "ceiling_batches_per_s": summary[f"c{c}.ceiling_batches_per_s"],
            "ratio_to_ceiling": summary[f"c{c}.ratio_to_ceiling"],
        })
    return {
        "target": "accept",
        "environment": env.describe(),
        "params": {"callers": list(callers), "batches_per_caller": batches_per_caller, "repeat": repeat},
        "baseline": "local ceiling = conditional PUTs/s of the same runtime and client at the same callers, / 2",
        "rows": rows,
        "figures": summary,
        "counts": {"requests_per_accept": sorted(counts["requests_per_accept"]),
                   "statuses": sorted(counts["statuses"]),
                   "accepts": counter.operations["accept"],
                   "injected_requests": env.injector.snapshot()["requests"] - injected_before,
                   "peak_inflight": env.injector.snapshot()["peak_inflight"]},
    }


def accept_bars(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    f = report["figures"]
    return [(f"{r['callers']} caller(s)", f[f"c{r['callers']}.batches_per_s"],
             f[f"c{r['callers']}.ceiling_batches_per_s"]) for r in report["rows"]]
