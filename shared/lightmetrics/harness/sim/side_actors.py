"""The actors and checks of identity conflicts, the denylist and the audit's watermark step, as one
side of the world the runner spawns: :mod:`~lightmetrics.harness.sim.conflict_actors` with
:mod:`~lightmetrics.harness.sim.conflict_checks`, and :mod:`~lightmetrics.harness.sim.audit_actor`.
Their watches run after every step (chained before the runner's own check, so a violation they
flag stops the run at that step)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightmetrics.harness.sim import conflict_actors, conflict_checks
from lightmetrics.harness.sim.audit_actor import AuditWatch, audit
from lightmetrics.harness.sim.world import World


@dataclass
class Side:
    conflicts: conflict_actors.Conflicts
    watch: conflict_checks.ConflictWatch
    audits: AuditWatch


def spawn(world: World) -> Side:
    shared = conflict_actors.Conflicts()
    side = Side(shared, conflict_checks.ConflictWatch(world, shared), AuditWatch(world))
    conflict_actors.spawn(world, shared)
    world.scheduler.spawn("audit", audit(world, side.audits, 0))
    before = world.scheduler.after_step

    def after() -> None:
        side.watch.step()
        side.audits.step()
        before()
    world.scheduler.after_step = after
    return side


def quiesce_jobs(world: World, side: Side) -> tuple[list[Any], list[Any]]:
    """First the operators' unfinished commands and the parked re-sends; the audits come last: today's
    report, then an older report re-run by the same image (it proves less: no watermark may move back)."""
    upgraded = world.rng.random() < 0.5
    return [conflict_actors.quiesce(world, side.conflicts)], [
        audit(world, side.audits, 9, delay=0, upgraded=upgraded, back_s=0),
        audit(world, side.audits, 10, delay=0, upgraded=upgraded, back_s=5400)]


def quiescence(world: World, side: Side) -> list[str]:
    return conflict_checks.quiescence(world, side.conflicts)


__all__ = ["Side", "quiesce_jobs", "quiescence", "spawn"]
