"""``lmctl bench walk``: keys walked per second by the bootstrap walk against a straightforward
sequential walker in the same run.

Per repeat: two fresh systems with notifications off are seeded alike with ``batches`` accepted
batches over ``agents`` agents (so there are partitions to walk in parallel), with no derived
entries: the bootstrap case, every key repaired. The walk is the real thing: an execution of the
BootstrapWalk state machine on moto's Step Functions (``parallelism`` = ``agents``, at most 10),
its Lambda tasks hosted in this process with latency-injected S3 clients. The baseline, on the
other system, lists ``accepted/v1/`` one page (1,000 keys) at a time and repairs one key at a time
(:func:`lightmetrics.derived.indexing.repair_accepted` under :func:`lightmetrics.work.units.run_unit`, what a
walk does per key whose entries are missing). Each gets its own history because a walker that
finds a key's ``accepted-by-time`` entry present does less for it (docs/protocol.md §13 W4, W5);
``per_key_requests`` (GETs and PUTs per key) shows both did the same repairs. They alternate who
goes first.

The in-flight cap (``--max-inflight``, 32 for this target) stands for the page tasks' connection
pools: in AWS each of the ``parallelism`` page tasks of a round is its own Lambda invocation with
its own HTTP pool; here they share this process, so the cap is their sum (4 × 8), not one pool's.
The sequential walker never has more than 2 requests in flight, so the cap does not touch it.
The injected delay (``--latency-ms``, 40 for this target) must dwarf this process's own time per
request: here the four page "Lambdas" and moto share one interpreter lock (~15 ms of wall clock
per request under load), in AWS they are four processes and S3's work is not on them.

Example:
    >>> with BenchEnv() as env:                                           # doctest: +SKIP
    ...     report = run_walk(env, batches=400, agents=4, repeat=3)
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.derived.indexing import KIND_REPAIR, repair_accepted
from lightmetrics.derived.walk import MAX_PARALLELISM
from lightmetrics.harness.bench.harness import BenchEnv, Figures
from lightmetrics.harness.bench.workload import batch_frames, seed_history
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.keys import KeyKind, layout_root
from lightmetrics.work.units import run_unit


def sequential_walk(system: LocalSystem, counter: RequestCounter) -> dict[str, Any]:
    """One LIST page, then one repair at a time; returns keys and outcomes."""
    ctx = system.work_context(component="walk-sequential", counter=counter)
    root = ctx.codec.accepted_root()
    after: str | None = None
    keys = 0
    outcomes: dict[str, int] = {}
    while True:
        with counter.operation("sequential-list"):
            page = ctx.store.list_page(root, max_keys=1000, start_after=after)
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
        # Two systems seeded alike: a walk leaves the derived entries present, and a walker that
        # finds them present does less per key (rules W4, W5), so each run gets its own history.
        systems = {name: env.system(notifications=False) for name in ("walk", "sequential")}
        tag = uuid.uuid4().hex[:6]
        per = max(1, batches // agents)
        seeds = {}
        for name, system in systems.items():
            assert system.settings is not None
            work = [b for a in range(agents) for b in batch_frames(f"walk-{tag}-{name[:3]}-{a}", "boot-1", per)]
            seeds[name] = seed_history(system.settings, env.raw_s3(), work)
        walk_counter, seq_counter = RequestCounter(), RequestCounter()
        walk_system = systems["walk"]
        walk_system.register_task_functions(counter=walk_counter)

        def real_walk() -> Any:
            control = walk_system.walk_control()
            result = control.follow(control.start(page_size=page_size, parallelism=min(agents, MAX_PARALLELISM)),
                                    poll_s=0.05, timeout_s=600)
            if result.status != "finished":
                raise RuntimeError(f"bench walk did not finish: {result.status} {result.detail}")
            return result

        runs: dict[str, tuple[float, Any]] = {}
        peaks: dict[str, int] = {}
        order = ("walk", "sequential") if rep % 2 == 0 else ("sequential", "walk")
        for name in order:
            print(f"walk repeat {rep + 1}/{repeat}: {name} over {per * agents} keys", file=sys.stderr, flush=True)
            with env.injector.window() as seen:
                if name == "walk":
                    runs[name] = _timed(real_walk)
                else:
                    runs[name] = _timed(lambda: sequential_walk(systems["sequential"], seq_counter))
            peaks[name] = seen["peak_inflight"]
        walk_s, walk_result = runs["walk"]
        seq_s, seq_result = runs["sequential"]
        walked = int(walk_result.summary_json().get("keys", per * agents))
        figures.add("walk_keys_per_s", walked / walk_s)
        figures.add("sequential_keys_per_s", seq_result["keys"] / seq_s)
        figures.add("speedup", (walked / walk_s) / (seq_result["keys"] / seq_s))
        details.append({"order": list(order), "seeded": seeds, "walk_seconds": round(walk_s, 3),
                        "sequential_seconds": round(seq_s, 3), "walk_keys": walked, "sequential_keys": seq_result["keys"],
                        "walk_outcomes": walk_result.summary_json().get("outcomes"), "peak_inflight": peaks,
                        "sequential_outcomes": seq_result["outcomes"],
                        "walk_requests_per_key": round(walk_counter.totals.total() / max(1, walked), 2),
                        "walk_requests": dict(walk_counter.totals),
                        "sequential_requests_per_key": round(sum(seq_counter.totals.values()) / max(1, seq_result["keys"]), 2),
                        "sequential_requests": dict(seq_counter.totals),
                        "per_key_requests": {n: _per_key(c, k) for n, c, k in (
                            ("walk", walk_counter, walked), ("sequential", seq_counter, seq_result["keys"]))}})
        for system in systems.values():
            system.stop()
    return {
        "target": "walk",
        "environment": env.describe(),
        "params": {"batches": batches, "agents": agents, "page_size": page_size, "repeat": repeat,
                   "parallelism": min(agents, MAX_PARALLELISM)},
        "baseline": "sequential walker over the same kind of history (its own system): one LIST page of "
                    f"{layout_root(KeyKind.ACCEPTED)}, "
                    "then one repair at a time, same run",
        "figures": figures.summary(),
        "runs": details,
    }


#: the requests a walk spends on a key itself (a repair), not on listings or its checkpoints
PER_KEY_APIS = ("s3.GetObject", "s3.PutObject")


def _per_key(counter: RequestCounter, keys: int) -> dict[str, float]:
    """GETs and PUTs per key: the repair's own requests, which the two walkers must share."""
    return {api: round(counter.totals.get(api, 0) / max(1, keys), 3) for api in PER_KEY_APIS}


def walk_bars(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    f = report["figures"]
    return [("keys/s", f["walk_keys_per_s"], f["sequential_keys_per_s"])]


