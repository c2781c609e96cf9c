"""``lmctl bench reconcile``: accepted-by-time entries checked per second by the steady-state
reconciler, against the same reconciler with one S3 request in flight, in the same run.

Per repeat: two fresh systems (notifications off) are seeded alike with ``batches`` accepted
batches, indexed as the event path would (every derived entry present: the healthy steady state
the reconciler mostly sees; :func:`lightmetrics.harness.bench.workload.seed_indexed`, no injected
latency). On one, :class:`~lightmetrics.derived.reconcile.Reconciler` runs (``LocalSystem.reconciler``,
latency-injected clients, its own concurrency) until a run reports nothing left to continue (a run
is bounded; the next continues); on the other, the same runs with S3 clients built inside
:meth:`~lightmetrics.harness.bench.harness.BenchEnv.one_request_at_a_time` — the sequential per-entry loop
of the same check, request for request. Two systems, because a run records what it verified and
a second run over the same entries would skip them. The two alternate who goes first.

Figures: entries/s of each, their ratio, requests per entry (each run counted by a
:class:`~lightmetrics.aws.request_counter.RequestCounter`; the two must agree: the baseline does the
same work, only one request at a time).

Example:
    >>> with BenchEnv() as env:                                           # doctest: +SKIP
    ...     report = run_reconcile(env, batches=200, repeat=3)
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from typing import Any

from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.harness.bench.harness import BenchEnv, Figures
from lightmetrics.harness.bench.workload import batch_frames, seed_indexed
from lightmetrics.local.system import LocalSystem

#: runs one bench pass may take before it is called stuck (a run is bounded, the next continues)
MAX_RUNS = 1000


def reconcile_until_caught_up(system: LocalSystem, counter: RequestCounter) -> dict[str, Any]:
    """Reconciler runs on a fresh counted context until one leaves nothing to continue; entries
    checked (the units the runs ran: listed entries not verified earlier), outcomes, runs, and the
    seconds the runs took (building the clients is not timed: a Lambda's are built at its cold start)."""
    ctx = system.work_context(component="reconcile", counter=counter)
    reconciler = system.reconciler(ctx)
    t0 = time.perf_counter()
    outcomes: Counter[str] = Counter()
    listed = 0
    for runs in range(1, MAX_RUNS + 1):
        report = reconciler.run()
        outcomes.update(report.outcomes)
        listed += report.entries
        if not (getattr(report, "continues_from", "") or getattr(report, "continues_after", "")):
            return {"entries": sum(outcomes.values()), "listed": listed, "outcomes": dict(outcomes), "runs": runs,
                    "seconds": time.perf_counter() - t0}
    raise RuntimeError(f"the reconciler had not caught up after {MAX_RUNS} runs")


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_reconcile(env: BenchEnv, *, batches: int = 200, agents: int = 4, repeat: int = 3) -> dict[str, Any]:
    figures = Figures()
    details = []
    for rep in range(repeat):
        systems = {name: env.system(notifications=False) for name in ("reconciler", "sequential")}
        tag = uuid.uuid4().hex[:6]
        per = max(1, batches // agents)
        seeded = {}
        for name, system in systems.items():
            work = [b for a in range(agents) for b in batch_frames(f"rec-{tag}-{name[:3]}-{a}", "boot-1", per)]
            seeded[name] = seed_indexed(system, env.raw_s3(), work)["seconds"]
        counters = {name: RequestCounter() for name in systems}
        order = ("reconciler", "sequential") if rep % 2 == 0 else ("sequential", "reconciler")
        runs: dict[str, tuple[float, dict[str, Any]]] = {}
        for name in order:
            _progress(f"reconcile repeat {rep + 1}/{repeat}: {name} over {per * agents} entries")
            if name == "sequential":
                with env.one_request_at_a_time() as injector, injector.window() as seen:
                    result = reconcile_until_caught_up(systems[name], counters[name])
                # every S3 request of the baseline went through the cap of one
                result["one_at_a_time_requests"] = seen["requests"]
            else:
                with env.injector.window() as seen:
                    result = reconcile_until_caught_up(systems[name], counters[name])
            result["peak_inflight"] = seen["peak_inflight"]
            runs[name] = (result.pop("seconds"), result)
        (rec_s, rec), (seq_s, seq) = runs["reconciler"], runs["sequential"]
        rate, base = rec["entries"] / rec_s, seq["entries"] / seq_s
        figures.add("entries_per_s", rate)
        figures.add("sequential_entries_per_s", base)
        figures.add("speedup", rate / base if base else 0.0)
        figures.add("requests_per_entry", counters["reconciler"].totals.total() / max(1, rec["entries"]))
        details.append({
            "order": list(order), "seed_seconds": seeded,
            "reconciler_seconds": round(rec_s, 3), "sequential_seconds": round(seq_s, 3),
            "reconciler": rec, "sequential": seq,
            "reconciler_requests": dict(sorted(counters["reconciler"].totals.items())),
            "sequential_requests": dict(sorted(counters["sequential"].totals.items())),
            "s3_requests_per_entry": {n: round(_s3(counters[n]) / max(1, runs[n][1]["entries"]), 3) for n in runs},
        })
        for system in systems.values():
            system.stop()
    return {
        "target": "reconcile",
        "environment": env.describe(),
        "params": {"batches": batches, "agents": agents, "repeat": repeat},
        "baseline": "the same reconciler runs over the same kind of history with one S3 request in flight at a time",
        "figures": figures.summary(),
        "runs": details,
    }


def _s3(counter: RequestCounter) -> int:
    return sum(n for api, n in counter.totals.items() if api.startswith("s3."))


def reconcile_bars(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    f = report["figures"]
    return [("entries/s", f["entries_per_s"], f["sequential_entries_per_s"])]
