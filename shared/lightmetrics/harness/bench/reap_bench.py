"""``lmctl bench reap``: a GC ``by-time`` pass (blobs proven per second) and a retention reap of
``hours`` expired hours (batches reaped per second), against the same reaps with one S3 request
in flight, in the same run.

Per repeat: two fresh systems are seeded alike: ``hours`` consecutive acceptance hours ten days
back, ``batches_per_hour`` accepted batches in each over ``agents`` agents, indexed as the event
path would (:func:`lightmetrics.harness.bench.workload.seed_indexed`, no injected latency), and the
completeness watermark set over them (what a clean walk leaves). The system clock runs two hours
ahead, so the blobs' ``raw-blobs-by-time`` hour (S3's clock: now) is past the retry horizon.
On each system, through :class:`~lightmetrics.reaps.ReapControl` (the reap state machine on moto's
Step Functions, its Lambda tasks hosted in this process):

1. GC ``source: by-time`` until a run reports nothing more: every blob is referenced, so each is
   proven and kept (the steady state of the daily GC);
2. retention of every expired hour (``tombstone_wait_s`` 0 and ``LM_GC_GRACE_S`` 0: waits are
   time, not work; a local host does not enforce rule D1's minimum).

The baseline system runs the same two reaps with S3 clients built inside
:meth:`~lightmetrics.harness.bench.harness.BenchEnv.one_request_at_a_time`: the same tasks, request for
request, one after another. The two systems alternate who goes first.

Example:
    >>> with BenchEnv() as env:                                           # doctest: +SKIP
    ...     report = run_reap(env, hours=2, batches_per_hour=40, repeat=3)
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.derived.walk import INDEXES, set_watermark
from lightmetrics.harness.bench.harness import BenchEnv, Figures
from lightmetrics.harness.bench.workload import batch_frames, seed_indexed
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.clock import OffsetClock
from lightmetrics.reaps.report import ReapReport

_NS = 1_000_000_000
#: how far the systems' clock runs ahead: the seeded blobs' hour must be past the retry horizon
CLOCK_AHEAD_S = 7200
RETRY_HORIZON_S = 60
RETENTION_S = 86400
#: GC runs one bench pass may take (each run is bounded by its page budget; the next continues)
MAX_RUNS = 100


def _old_hour_ns(h: int) -> int:
    """The start of acceptance hour ``h`` of the seeded history, ten days back (plus 10 minutes)."""
    return (time.time_ns() // (3600 * _NS)) * 3600 * _NS - 10 * 86400 * _NS + (h * 3600 + 600) * _NS


def seed_expired_hours(env: BenchEnv, system: LocalSystem, tag: str, *, hours: int, batches_per_hour: int,
                       agents: int) -> dict[str, Any]:
    """Accepted and indexed history in ``hours`` expired hours, and a watermark that covers them."""
    per = max(1, batches_per_hour // agents)
    t0 = time.perf_counter()
    blobs = 0
    for h in range(hours):
        work = [b for a in range(agents) for b in batch_frames(f"reap-{tag}-{a}", "boot-1", per, start=h * per)]
        blobs += len(seed_indexed(system, env.raw_s3(), work, accepted_at_ns=_old_hour_ns(h))["blobs"])
    table = system.work_context().table
    now = system.clock.now_ns()
    for index in INDEXES:
        set_watermark(table, index, now - 3600 * _NS, epoch=1, now_ns=now)
    return {"batches": blobs, "seconds": round(time.perf_counter() - t0, 3)}


def _reap(system: LocalSystem, counter: RequestCounter, **inp: Any) -> tuple[float, list[ReapReport]]:
    """Reap runs with ``inp`` until one reports nothing more (GC's page budget); seconds, reports."""
    system.register_task_functions(counter=counter)  # a fresh task context, built on its first task
    control = system.reap_control()
    reports = []
    t0 = time.perf_counter()
    for _ in range(MAX_RUNS):
        followed = control.follow(control.start(**inp), poll_s=0.02, timeout_s=600)
        if followed.status != "finished" or followed.report is None:
            raise RuntimeError(f"bench reap {inp} did not finish: {followed.status} {followed.detail}")
        reports.append(followed.report)
        if not followed.report.more:
            return time.perf_counter() - t0, reports
    raise RuntimeError(f"bench reap {inp} had more to do after {MAX_RUNS} runs")


def _both(system: LocalSystem) -> dict[str, Any]:
    gc_counter, ret_counter = RequestCounter(), RequestCounter()
    gc_s, gc_reports = _reap(system, gc_counter, mode="gc", dry_run=False, source="by-time")
    ret_s, ret_reports = _reap(system, ret_counter, mode="retention", dry_run=False, tombstone_wait_s=0)
    return {"gc_seconds": gc_s, "gc_examined": sum(r.examined for r in gc_reports),
            "gc_kept": sum(sum(r.kept.values()) for r in gc_reports), "gc_runs": len(gc_reports),
            "gc_requests": dict(sorted(gc_counter.totals.items())),
            "retention_seconds": ret_s, "hours_reaped": sorted(h for r in ret_reports for h in r.hours_reaped),
            "retention_purged": sum(r.purged for r in ret_reports),
            "retention_requests": dict(sorted(ret_counter.totals.items()))}


def run_reap(env: BenchEnv, *, hours: int = 2, batches_per_hour: int = 40, agents: int = 4,
             repeat: int = 3) -> dict[str, Any]:
    figures = Figures()
    details = []
    for rep in range(repeat):
        systems = {name: env.system(notifications=False, clock=OffsetClock(CLOCK_AHEAD_S * _NS),
                                    retry_horizon_s=RETRY_HORIZON_S, gc_grace_s=0, retention_s=RETENTION_S)
                   for name in ("reap", "sequential")}
        tag = uuid.uuid4().hex[:6]
        seeded = {name: seed_expired_hours(env, s, f"{tag}{name[:3]}", hours=hours, batches_per_hour=batches_per_hour,
                                           agents=agents) for name, s in systems.items()}
        order = ("reap", "sequential") if rep % 2 == 0 else ("sequential", "reap")
        out: dict[str, dict[str, Any]] = {}
        for name in order:
            print(f"reap repeat {rep + 1}/{repeat}: {name}: GC by-time, then retention of {hours} hour(s)",
                  file=sys.stderr, flush=True)
            if name == "sequential":
                with env.one_request_at_a_time() as injector, injector.window() as seen:
                    out[name] = _both(systems[name])
            else:
                with env.injector.window() as seen:
                    out[name] = _both(systems[name])
            out[name]["peak_inflight"] = seen["peak_inflight"]
        batches = seeded["reap"]["batches"]
        for job, unit, seconds_key, units in (("gc", "blobs", "gc_seconds", "gc_examined"),
                                              ("retention", "batches", "retention_seconds", None)):
            rate = (out["reap"][units] if units else batches) / out["reap"][seconds_key]
            base = (out["sequential"][units] if units else seeded["sequential"]["batches"]) / out["sequential"][seconds_key]
            figures.add(f"{job}_{unit}_per_s", rate)
            figures.add(f"sequential_{job}_{unit}_per_s", base)
            figures.add(f"{job}_speedup", rate / base if base else 0.0)
        figures.add("gc_requests_per_blob", _total(out["reap"]["gc_requests"]) / max(1, out["reap"]["gc_examined"]))
        figures.add("retention_requests_per_batch", _total(out["reap"]["retention_requests"]) / max(1, batches))
        details.append({"order": list(order), "seeded": seeded,
                        **{f"{name}.{k}": (round(v, 3) if isinstance(v, float) else v)
                           for name, r in out.items() for k, v in r.items()}})
        for system in systems.values():
            system.stop()
    return {
        "target": "reap",
        "environment": env.describe(),
        "params": {"hours": hours, "batches_per_hour": batches_per_hour, "agents": agents, "repeat": repeat},
        "baseline": "the same reaps (GC by-time, retention) over the same kind of history with one S3 request in "
                    "flight at a time",
        "figures": figures.summary(),
        "runs": details,
    }


def _total(by_api: dict[str, int]) -> int:
    return sum(v for k, v in by_api.items() if k.startswith(("s3.", "dynamodb.")))


def reap_bars(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    f = report["figures"]
    return [("GC by-time blobs/s", f["gc_blobs_per_s"], f["sequential_gc_blobs_per_s"]),
            ("retention batches/s", f["retention_batches_per_s"], f["sequential_retention_batches_per_s"])]
