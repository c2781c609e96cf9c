"""``lmctl bench walk``: keys walked per second by the bootstrap walk against a straightforward
sequential walker in the same run.

Per repeat: a fresh system with notifications off is seeded with ``batches`` accepted batches
over ``agents`` agents (so there are partitions to walk in parallel), with no derived entries.
The walk is the real thing: an execution of the BootstrapWalk state machine on moto's Step
Functions, its Lambda tasks hosted in this process with latency-injected S3 clients. The
baseline lists ``accepted/v1/`` one page (1,000 keys) at a time and repairs one key at a time
(:func:`lightmetrics.indexing.repair_accepted` under :func:`lightmetrics.work.run_unit`, what a
walk does per key). They alternate who goes first; whoever goes second finds the derived entries
present, and its conditional PUTs answer 412: the same requests and round trips.

Example:
    >>> with BenchEnv() as env:                                           # doctest: +SKIP
    ...     report = run_walk(env, batches=400, agents=4, repeat=3)
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from lightmetrics.bench.harness import BenchEnv, Figures
from lightmetrics.bench.workload import batch_frames, seed_history
from lightmetrics.indexing import KIND_REPAIR, repair_accepted
from lightmetrics.local.system import LocalSystem
from lightmetrics.request_counter import RequestCounter
from lightmetrics.work import run_unit


def sequential_walk(system: LocalSystem, counter: RequestCounter) -> dict[str, Any]:
    """One LIST page, then one repair at a time; returns keys and outcomes."""
    ctx = system.work_context(component="walk-sequential", counter=counter)
    root = ctx.codec.accepted_root()
    after: str | None = None
    keys = 0
    outcomes: dict[str, int] = {}
    while True:
        with counter.operation("sequential-list"):
            page = ctx.store.list_page(root, max_keys=1000, start_after=after)  # type: ignore[attr-defined]
        for key in page.keys:
            with counter.operation("sequential-repair"):
                outcome = run_unit(ctx, kind=KIND_REPAIR, object_key=key, source="bench",
                                   fn=lambda k=key: repair_accepted(ctx, k)).outcome
            outcomes[outcome.value] = outcomes.get(outcome.value, 0) + 1
            keys += 1
        if not page.truncated or not page.keys:
            return {"keys": keys, "outcomes": outcomes}
        after = page.keys[-1]


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_walk(env: BenchEnv, *, batches: int = 400, agents: int = 4, page_size: int = 100,
             repeat: int = 3) -> dict[str, Any]:
    figures = Figures()
    details = []
    for rep in range(repeat):
        system = env.system(notifications=False)
        assert system.settings is not None
        tag = uuid.uuid4().hex[:6]
        per = max(1, batches // agents)
        work = [b for a in range(agents) for b in batch_frames(f"walk-{tag}-{a}", "boot-1", per)]
        seed = seed_history(system.settings, env.raw_s3(), work)
        walk_counter, seq_counter = RequestCounter(), RequestCounter()
        system.register_task_functions(counter=walk_counter)

        def real_walk() -> Any:
            control = system.walk_control()
            result = control.follow(control.start(page_size=page_size), poll_s=0.05, timeout_s=600)
            if result.status != "finished":
                raise RuntimeError(f"bench walk did not finish: {result.status} {result.detail}")
            return result

        runs: dict[str, tuple[float, Any]] = {}
        order = ("walk", "sequential") if rep % 2 == 0 else ("sequential", "walk")
        for name in order:
            runs[name] = _timed(real_walk) if name == "walk" else _timed(lambda: sequential_walk(system, seq_counter))
        walk_s, walk_result = runs["walk"]
        seq_s, seq_result = runs["sequential"]
        walked = int(walk_result.summary.get("keys", len(work)))
        figures.add("walk_keys_per_s", walked / walk_s)
        figures.add("sequential_keys_per_s", seq_result["keys"] / seq_s)
        figures.add("speedup", (walked / walk_s) / (seq_result["keys"] / seq_s))
        details.append({"order": list(order), "seeded": seed, "walk_seconds": round(walk_s, 3),
                        "sequential_seconds": round(seq_s, 3), "walk_keys": walked, "sequential_keys": seq_result["keys"],
                        "walk_outcomes": walk_result.summary.get("outcomes"),
                        "sequential_outcomes": seq_result["outcomes"],
                        "walk_requests_per_key": round(walk_counter.totals.total() / max(1, walked), 2),
                        "walk_requests": dict(walk_counter.totals),
                        "sequential_requests_per_key": round(sum(seq_counter.totals.values()) / max(1, seq_result["keys"]), 2),
                        "sequential_requests": dict(seq_counter.totals)})
        system.stop()
    return {
        "target": "walk",
        "environment": env.describe(),
        "params": {"batches": batches, "agents": agents, "page_size": page_size, "repeat": repeat},
        "baseline": "sequential walker: one LIST page of accepted/v1/, then one repair at a time, same run",
        "figures": figures.summary(),
        "runs": details,
    }


def walk_bars(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    f = report["figures"]
    return [("keys/s", f["walk_keys_per_s"], f["sequential_keys_per_s"])]


