"""One simulated schedule per seed, and many: the run phase (faults on), then quiescence (faults off,
every job run to completion), the checks after every step and at the end, and the figures.

Example:
    >>> run_seed(3, steps=60).seed
    3
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from collections import Counter
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.harness.sim import actors, derived_actors, derived_checks, reap_world, side_actors
from lightmetrics.harness.sim.checks import SafetyWatch, quiescence
from lightmetrics.harness.sim.reap_driver import reap
from lightmetrics.harness.sim.scheduler import SimCrash, serial_pools
from lightmetrics.harness.sim.source_watch import SourceWatch
from lightmetrics.harness.sim.walk_driver import walk
from lightmetrics.harness.sim.world import World, build_world
from lightmetrics.reaps.params import LATEST_AUDIT
from lightmetrics.work import crashpoints

#: the figures of one schedule: storage calls in the run phase before the step budget stops it
DEFAULT_STEPS = 300
#: the share of seeds whose world also has the conflict, denylist and audit actors (side_actors): in
#: the others the reaps, the walk and the shards get the whole run phase, as the defects in their
#: long tasks need (drawn from the seed apart from the world's generator, so a seed without them
#: schedules exactly as before they existed)
SIDE_RATE = 0.5
#: the share of seeds whose GC runs (if the seed has any) prove the planted audit run's orphan
#: candidates (source ``audit``) instead of a scan or the blob index: drawn apart from the world's
#: generator too
AUDIT_SOURCE_RATE = 0.4
DEFAULT_FAULT_RATE = 0.06
CRASH_POINT_RATE = 0.2
CLOCK_JUMP_RATE = 0.004
_REAPERS = ("gc", "retention")


@dataclass
class SimResult:
    seed: int
    steps: int
    calls: int
    violations: list[str]
    trace: list[str]
    coverage: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    crash_points: set[str] = field(default_factory=set)
    clock_jumps: int = 0
    actors: list[str] = field(default_factory=list)  # the run phase's actors the seed spawns (all of them)


@contextmanager
def _seeded_uuids(seed: int) -> Iterator[None]:
    """Request tokens and owners from the seed, so a replay writes the same items."""
    rng, original = random.Random(seed ^ 0x5EED), uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)  # type: ignore[assignment]
    try:
        yield
    finally:
        uuid.uuid4 = original  # type: ignore[assignment]


@dataclass
class _CrashPoints:
    """The crash points reached while armed. Quiescence's first pass of the reaps arms them too,
    storage faults off, each name the run phase did not reach crashing there at most once (so every
    task still ends within its retries): a reap's late stages, which the run phase's step budget
    often ends before, die there as well, and are run to completion after."""

    hit: set[str] = field(default_factory=set)
    quiet: bool = False
    quiet_crashed: set[str] = field(default_factory=set)


def _crash_hook(world: World, points: _CrashPoints) -> Any:
    def hook(name: str) -> None:
        actor = world.scheduler.current()
        faults = world.faults.enabled
        if actor is None or not (faults or points.quiet):
            return
        points.hit.add(name)
        if (faults or name not in points.quiet_crashed) and world.rng.random() < CRASH_POINT_RATE:
            if not faults:
                points.quiet_crashed.add(name)
            world.scheduler.note(f"crash point {name}")
            world.faults.coverage[(actor.name.split("#")[0], name, "crash-point")] += 1
            actor.crashed = True
            raise SimCrash(name)
    return hook


def _spawn_run_phase(world: World, derived: derived_actors.Derived, *, side: bool, audit_source: bool) -> None:
    s, rng = world.scheduler, world.rng
    for n, plan in enumerate(actors.collector_plans(world, 3, 3)):
        s.spawn(f"collector#{n}", actors.collector(world, n, plan))
    derived_actors.plant_range_plan(world)
    s.spawn("indexer", derived_actors.indexer(world, derived))
    for shard in range(derived_actors.SHARDS):
        s.spawn(f"reconciler#{shard}", derived_actors.reconciler_shard(world, derived, shard, runs=rng.randint(1, 2)))
    if rng.random() < 0.5:
        s.spawn("walk", walk(world, [{"page_size": rng.choice((1, 2, 3)), "parallelism": rng.choice((1, 2)),
                                      "max_rounds_per_execution": rng.choice((1, 2, 100))}],
                             delay=rng.randrange(60), outcomes=derived.walk_outcomes))
    gc_runs = reap_world.gc_inputs(rng)
    if audit_source:
        gc_runs = [{**run, "source": "audit", "audit_run": LATEST_AUDIT} for run in gc_runs]
    s.spawn("gc", reap(world, gc_runs, delay=rng.randrange(40)))
    s.spawn("retention", reap(world, reap_world.retention_inputs(rng, world.reaps), delay=rng.randrange(2)))
    if side:
        derived.side = side_actors.spawn(world)  # conflicts, the denylist, the audit's watermarks


def _quiesce(world: World, derived: derived_actors.Derived, points: _CrashPoints) -> None:
    """Faults off; every job once more, one after another, to completion (the first pass of the
    reaps with crashes at crash points, each task retried as the state machine does)."""
    world.faults.enabled = False
    world.scheduler.jump_rate = 0.0
    world.clock.advance(3600)  # every lease a dead task held has expired
    before, after = reap_world.quiesce_inputs(world.reaps)
    first, last = side_actors.quiesce_jobs(world, derived.side) if derived.side is not None else ([], [])
    first_pass = reap(world, before)

    def crashing(actor: Any) -> None:
        points.quiet, points.quiet_crashed = True, set(points.hit)  # only where the run phase did not reach
        try:
            first_pass(actor)
        finally:
            points.quiet = False

    jobs = [*first, derived_actors.indexer(world, derived, drop=0.0, duplicate=0.0, delay=0.0, idle_limit=1),
            crashing, lambda actor: reap_world.operator_skips(world, world.reaps), reap(world, after),
            # a first pass cut short (a task's retries spent at crash points) leaves the stray key's
            # hour to the second: its blocker is opened only then, and the operator skips it then
            lambda actor: reap(world, after)(actor) if reap_world.operator_skips(world, world.reaps) else None,
            # an operator resumes a walk the run phase left unfinished (or walks again), then every
            # shard runs once the hours have settled
            walk(world, [{"resume": True}, {}], outcomes=derived.walk_outcomes),
            lambda actor: derived_actors.operator_settles(world),
            *[derived_actors.reconciler_shard(world, derived, shard, runs=runs, delay=0, caps=caps)
              for caps, runs in ((True, 2), (False, 2)) for shard in range(derived_actors.SHARDS)], *last]
    s = world.scheduler
    s.actors, s.stopping, s.max_steps = [], False, s.steps + 1_000_000
    s.spawn("quiesce", lambda actor: [job(actor) for job in jobs])
    s.run()


def run_seed(seed: int, *, steps: int = DEFAULT_STEPS, fault_rate: float = DEFAULT_FAULT_RATE,
             actors: Collection[str] | None = None) -> SimResult:
    """``actors``: run only these of the run phase's actors (the others are built, drawing what they
    draw from the seed, but not started): what :mod:`~lightmetrics.harness.sim.shrink` varies."""
    world = build_world(seed, fault_rate=fault_rate, max_steps=steps)
    violations: list[str] = []
    points = _CrashPoints()
    watch = SafetyWatch(world)
    sources = SourceWatch(world)

    def check() -> None:
        running = any(a.name.split("#")[0] in _REAPERS and not a.done for a in world.scheduler.actors)
        found = world.scheduler.flagged + watch.check(reap_running=running) + sources.check()
        if found and not violations:
            violations.extend(found)
            world.scheduler.note(f"VIOLATION {found[0]}")
            world.scheduler.stopping = True

    world.scheduler.after_step = check
    world.scheduler.jump_rate = CLOCK_JUMP_RATE
    derived = derived_actors.Derived()
    with _seeded_uuids(seed), serial_pools(), crashpoints.hooked(_crash_hook(world, points)):
        _spawn_run_phase(world, derived, side=random.Random(f"side-{seed}").random() < SIDE_RATE,
                         audit_source=random.Random(f"gc-audit-{seed}").random() < AUDIT_SOURCE_RATE)
        spawned = [a.name for a in world.scheduler.actors]
        if actors is not None:
            if unknown := sorted(set(actors) - set(spawned)):
                raise ValueError(f"no such actor: {', '.join(unknown)} (the seed spawns {', '.join(spawned)})")
            world.scheduler.actors = [a for a in world.scheduler.actors if a.name in actors]
        world.scheduler.run()
        run_steps = world.scheduler.steps
        errors = [f"actor {a.name} escaped: {a.error}" for a in world.scheduler.actors if a.error]
        violations.extend(errors)
        if not violations:
            _quiesce(world, derived, points)
            violations.extend(world.scheduler.flagged + quiescence(world)
                              + derived_checks.quiescence(world, derived, derived_actors.SHARDS)
                              + (side_actors.quiescence(world, derived.side) if derived.side is not None else []))
            violations.extend(f"actor {a.name} escaped: {a.error}" for a in world.scheduler.actors if a.error)
    return SimResult(seed, run_steps, world.scheduler.calls, violations, world.scheduler.trace, world.faults.coverage,
                     points.hit, world.scheduler.jumps, spawned)


def run_many(seeds: list[int] | None = None, *, minutes: float | None = None, steps: int = DEFAULT_STEPS,
             stop_at_first: bool = True, fresh: random.Random | None = None,
             keep: list[SimResult] | None = None, fault_rate: float = DEFAULT_FAULT_RATE,
             actors: Collection[str] | None = None) -> dict[str, Any]:
    """Seeds in order (or fresh ones until ``minutes`` pass): the figures of ``lmctl sim --json``.
    ``keep`` receives every result (the CLI prints a failing one's trace)."""
    started, cpu = time.monotonic(), time.process_time()
    pick = fresh or random.Random()
    results: list[SimResult] = [] if keep is None else keep
    queue = list(seeds or [])
    while queue or (minutes is not None and time.monotonic() - started < minutes * 60):
        seed = queue.pop(0) if queue else pick.randrange(2**32)
        results.append(run_seed(seed, steps=steps, fault_rate=fault_rate, actors=actors))
        if results[-1].violations and stop_at_first:
            break
    return summary(results, time.monotonic() - started, cpu_s=time.process_time() - cpu)


def summary(results: list[SimResult], elapsed_s: float, *, cpu_s: float | None = None) -> dict[str, Any]:
    """The figures; ``cpu_s`` (the process's CPU time for them) gives ``schedules_per_cpu_min``,
    the speed a busy machine does not change."""
    coverage: Counter[tuple[str, str, str]] = Counter()
    points: set[str] = set()
    for r in results:
        coverage.update(r.coverage)
        points |= r.crash_points
    steps = sum(r.steps for r in results)
    calls = sum(r.calls for r in results)
    kinds = Counter({k: 0 for k in ("fail", "lost", "crash-before", "crash-after", "crash-point", "refused")})
    kinds["clock-jump"] = sum(r.clock_jumps for r in results)
    for (_actor, _call, kind), n in coverage.items():
        kinds[kind] += n
    return {
        "seeds": [r.seed for r in results], "schedules": len(results), "steps": steps,
        "trace_sha256": {str(r.seed): hashlib.sha256("\n".join(r.trace).encode()).hexdigest() for r in results},
        "storage_calls": calls, "calls_per_schedule": round(calls / len(results), 1) if results else 0.0,
        "elapsed_s": round(elapsed_s, 3), "steps_per_s": round(steps / elapsed_s, 1) if elapsed_s else 0.0,
        "schedules_per_min": round(len(results) * 60 / elapsed_s, 1) if elapsed_s else 0.0,
        **({"cpu_s": round(cpu_s, 3), "schedules_per_cpu_min": round(len(results) * 60 / cpu_s, 1)}
           if cpu_s else {}),
        "violations": [{"seed": r.seed, "found": r.violations, "trace_tail": r.trace[-40:]}
                       for r in results if r.violations],
        "coverage": {"fault_kinds": dict(kinds),
                     "combinations": sorted(f"{a} {c} {k}" for (a, c, k) in coverage),
                     "crash_points_hit": sorted(points),
                     "crash_points_missed": sorted(set(crashpoints.REGISTRY) - points)},
    }


__all__ = ["SimResult", "run_many", "run_seed", "summary"]
