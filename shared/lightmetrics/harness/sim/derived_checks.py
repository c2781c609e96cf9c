"""The derived-state checks at quiescence (after every job ran to completion with faults off).

* every hour with an accepted-by-time entry before the current hour is closed by every shard
  (R1, R8: the checkpoint of each shard is past it);
* the walk an operator resumed (or started again) finished, and no one holds the walk lease;
* the range plan governs: every shard's run found no unowned range.
"""

from __future__ import annotations

from lightmetrics.derived.reconcile import Reconciler
from lightmetrics.derived.walk import LEASE_PK, checkpoint_pk, read_walk
from lightmetrics.harness.sim.actors import QuietQueues
from lightmetrics.harness.sim.derived_actors import Derived, settings_with_shards
from lightmetrics.harness.sim.world import World
from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.errors import KeyLayoutError
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.work import leases


def hours_left_open(world: World, shards: int) -> list[str]:
    """Liveness (R1, R8): at quiescence every shard's checkpoint is past every hour with an
    accepted-by-time entry before the current hour."""
    ctx = world.system.ctx
    now = world.clock.now_ns()
    current = UtcHour.of_unix_ns(now)
    hours = sorted(_entry_hours(world), key=lambda h: h.start_unix_s)
    found = []
    for shard in range(shards):
        cp = Reconciler(ctx, settings_with_shards(world, shards), QuietQueues(), shard=shard).checkpoint()
        for hour in hours:
            if hour < current and (cp is None or not hour < cp.hour):
                found.append(f"liveness: shard {shard} left hour {hour} open (checkpoint "
                             f"{cp.hour if cp else '-'})")
                break
    return found


def _entry_hours(world: World) -> set[UtcHour]:
    """The hours of the accepted-by-time entries now present (an expired, reaped hour has none)."""
    codec, store = world.system.ctx.codec, world.system.store
    hours = set()
    for key in store.keys(codec.root(KeyKind.ACCEPTED_BY_TIME)):
        try:
            hour = codec.parse(key).hour
        except KeyLayoutError:  # a stray upload (the reaps' world plants one): no entry of an hour
            continue
        if hour is not None:
            hours.add(hour)
    return hours


def quiescence(world: World, derived: Derived, shards: int) -> list[str]:
    found = hours_left_open(world, shards)
    lease = leases.read(world.system.table, LEASE_PK)
    if leases.is_live(lease, world.clock.now_ns()):
        found.append(f"liveness: the walk lease is held after every walk ended: {lease}")
    cp, _parts = read_walk(world.system.table, checkpoint_pk(None))
    if cp is None or cp.status is not JobStatus.FINISHED or derived.walk_outcomes[-1:] != ["finished"]:
        found.append(f"liveness: the operator's walk did not finish: {derived.walk_outcomes[-2:]} "
                     f"(checkpoint {None if cp is None else cp.status})")
    return found


__all__ = ["hours_left_open", "quiescence"]
