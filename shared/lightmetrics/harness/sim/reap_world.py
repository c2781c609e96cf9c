"""The reaps' part of the simulated world: expired history for retention to reap, and the reap inputs.

Planted before the run (no faults, no scheduling), with the real service code:

* the hour before the world's expired ``old_hour`` holds an indexed batch and a write-once range
  plan of :data:`RANGES` key ranges (effective from that hour;
  ``old_hour``'s plan has one range again), so a retention of it runs the ``Ranges`` Map;
* ``old_hour`` also holds a stray key under its ``accepted-by-time`` prefix (a key outside the
  layout): retention must block on that entry alone and keep the hour tombstoned, unreaped, until
  an operator skips the blocker (:func:`operator_skips`);
* rollup chunks, a chunk index and a generation manifest of ``old_hour``, for rollup retention;
* two reaps that failed before the run (:mod:`~lightmetrics.harness.sim.reap_history`): a retention
  stopped after emptying its hour (two hours before ``old_hour``), and a GC that left a raced blob
  hidden under its marks.

The reap inputs: each run-phase reap may get a small ``max_tasks_per_execution`` (rule G-B2), so a
reap continues across executions as the state machine does (Continue starts the next execution with
the continuation input, :mod:`lightmetrics.harness.sim.reap_driver`); a retention without ``hour``
takes on every expired hour (the scheduled run). At quiescence an operator's dry runs come first,
then the scheduled runs (no ``hour``: an unfinished hour must be found from its control-table record,
its emptied prefixes no longer list), the operator's skip of the stray key's blocker, and the runs again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.admin.blocker_actions import skip
from lightmetrics.derived.hour_ranges import PLAN_PK
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.harness.sim.reap_history import plant_failed_gc, plant_stopped_retention
from lightmetrics.harness.testing.memory import MemorySystem
from lightmetrics.protocol.keys import ROLLUP_WINDOWS, UtcHour
from lightmetrics.reaps.gc_marks import stored_marks_items
from lightmetrics.reaps.retention import KIND_RETENTION

_NS = 1_000_000_000
#: key ranges of the expired hour's plan (a retention of it runs the Ranges Map)
RANGES = 2
#: the plan's one cut: range 0 holds the names up to it (none of the hour), range 1 the others
CUT = "0"
#: small execution budgets: a reap continues into the next execution (G-B2); 0: the default
MAX_TASKS = (0, 0, 2, 4)
STRAY_NAME = "stray-upload.json"
#: rule L1's shortest reap lease: the longest reap task (600 s) plus LEASE_MARGIN_S
MIN_LEASE_S = 660


@dataclass
class ReapWorld:
    """What the reap checks expect: every raw hour in ``hours`` and every rollup hour reaped."""

    hours: list[UtcHour]
    rollup_hours: list[UtcHour]
    #: keys outside the layout under an expired hour: an operator skips their blockers
    stray_keys: list[str] = field(default_factory=list)
    #: blobs a failed GC left hidden under its marks while a record names them (G-I8: the next reap
    #: that is not a dry run settles them before it ends)
    raced_blobs: list[str] = field(default_factory=list)
    #: (storage calls when read, whether a marks# item was left): the checks read it once a step
    marks_read: tuple[int, bool] = (-1, False)


def plant_reaps(system: MemorySystem, clock: Any, old_ns: int, identity: Any, frame: Any) -> ReapWorld:
    """The expired history of the module docstring (``clock`` is set back to where it was)."""
    now = clock.now_ns()
    old_hour = UtcHour.of_unix_ns(old_ns)
    ranged = UtcHour.of_unix_ns(old_ns - 3600 * _NS)
    ctx, codec = system.ctx, system.ctx.codec
    for n in (80,):
        clock._now = ranged.start_unix_s * _NS + n * _NS
        ident = identity(n, "agent-old")
        result = accept_batch(system.accept, ident, frame(ident))
        index_accepted(ctx, result.manifest_key)
        index_raw_blob(ctx, result.blob_key)
    clock._now = now
    # a plan governs many hours: one of its ranges may hold nothing in this one (the first, here)
    cuts = [CUT]
    written = ranged.start_unix_s * _NS - 3 * 3600 * _NS  # MIN_LEAD_HOURS before the hour it governs
    for hour, plan_cuts in ((ranged, list(cuts)), (old_hour, None)):
        system.table.put({"pk": PLAN_PK, "sk": f"from#{hour}", "cuts": plan_cuts, "ranges": len(plan_cuts or ()) + 1,
                          "written_at_ns": written})
    stray = codec.accepted_by_time_hour(old_hour) + STRAY_NAME
    system.store.put_if_absent(stray, b"{}")
    rollups = [codec.rollup_window_hour(ROLLUP_WINDOWS[0], old_hour) + "part-0000.bin",
               codec.rollup_index_hour(old_hour) + "index.json", codec.rollup_manifest_hour(old_hour) + "gen-1.json"]
    for key in rollups:
        system.store.put_if_absent(key, b"rollup")
    stopped = UtcHour.of_unix_ns(old_ns - 2 * 3600 * _NS)
    plant_stopped_retention(system, clock, stopped, identity, frame, run_at_ns=now - 30 * 3600 * _NS)
    raced = plant_failed_gc(system, clock, now - 3 * 3600 * _NS, identity, frame, run_at_ns=now - 5400 * _NS)
    clock._now = now
    return ReapWorld([ranged, old_hour, stopped], [old_hour], [stray], [raced])


def _budget(rng: Any) -> dict[str, int]:
    """A small execution budget (G-B2) maybe, and maybe the shortest lease rule L1 allows."""
    n = rng.choice(MAX_TASKS)
    lease = {"lease_seconds": MIN_LEASE_S} if rng.random() < 0.5 else {}
    return {**({"max_tasks_per_execution": n} if n else {}), **lease}


def gc_inputs(rng: Any) -> list[dict[str, Any]]:
    """Two GC runs; in 60% of the schedules none (GC's schedule is not due while retention runs:
    a ranged hour's retention then has the run phase to itself)."""
    if rng.random() < 0.6:
        return []
    return [{"mode": "gc", "dry_run": rng.random() < 0.3, "source": rng.choice(("scan", "by-time")), "concurrency": 1,
             **_budget(rng)} for _ in range(2)]


def retention_inputs(rng: Any, reaps: ReapWorld) -> list[dict[str, Any]]:
    """One or two retentions (the first maybe a dry run), each of the ranged hour, the blocked one,
    every expired hour (the scheduled run) or the rollups of the expired hour."""
    out = []
    for dry in [rng.random() < 0.3] + ([False] if rng.random() < 0.5 else []):
        pick = rng.random()
        what: dict[str, Any] = ({"hour": str(reaps.hours[0])} if pick < 0.6 else {"hour": str(reaps.hours[1])}
                                if pick < 0.72 else {} if pick < 0.8 else {"scope": "rollup"})
        out.append({"mode": "retention", "dry_run": dry, "concurrency": 1, **what, **_budget(rng)})
    return out


def quiesce_inputs(reaps: ReapWorld) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The reaps at quiescence, before and after the operator's skip (:func:`operator_skips`)."""
    scheduled = [{"mode": "gc", "dry_run": False, "source": "scan", "concurrency": 1},
                 {"mode": "retention", "dry_run": False, "concurrency": 1},
                 {"mode": "retention", "dry_run": False, "scope": "rollup", "concurrency": 1}]
    # an operator's dry run first: what a reap the run phase cut short left must stay untouched
    dry = [{"mode": "retention", "dry_run": True, "hour": str(reaps.hours[0]), "concurrency": 1}]
    return dry + scheduled, scheduled[1:2]


def operator_skips(world: Any, reaps: ReapWorld) -> int:
    """``lmctl blockers skip`` of each open ``reap-retention`` blocker of a stray key (an operator's
    decision); how many it skipped."""
    ctx = world.work_context(world.clock_for())
    skipped = 0
    for blocker in ctx.blockers.list():
        if blocker.kind == KIND_RETENTION and blocker.object_key in reaps.stray_keys:
            skip(ctx, blocker.work_key, who="operator", reason="a stray upload, not an entry of the layout")
            skipped += 1
    return skipped


def awaiting_settle(world: Any, blob_key: str) -> bool:
    """A blob the planted failed GC hid, while its marks wait for the next reap (not a running one's);
    the marks are read once a step."""
    if blob_key not in world.reaps.raced_blobs:
        return False
    reaps = world.reaps
    if reaps.marks_read[0] != world.scheduler.calls:
        reaps.marks_read = (world.scheduler.calls, bool(marks_left(world)))
    return reaps.marks_read[1]


def marks_left(world: Any) -> list[str]:
    return [str(i["sk"]) for i in stored_marks_items(world.system.table)]


def reap_liveness(world: Any, reaps: ReapWorld) -> list[str]:
    """Every expired hour reaped, and no reap's marks left, once every job ran to completion (G-I8)."""
    found = [f"liveness: marks left after every reap ended: {sk}" for sk in marks_left(world)]
    for scope, hours in (("raw", reaps.hours), ("rollup", reaps.rollup_hours)):
        for hour in hours:
            item = world.system.ctx.table.get(f"retention#{scope}", str(hour))
            if item is None or item.get("status") != "reaped":
                found.append(f"liveness: {scope} retention of expired hour {hour} did not finish: {item}")
    return found


__all__ = ["ReapWorld", "awaiting_settle", "gc_inputs", "marks_left", "operator_skips", "plant_reaps",
           "quiesce_inputs", "reap_liveness", "retention_inputs"]
