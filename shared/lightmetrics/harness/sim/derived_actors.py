"""The derived-state actors: the event path with delayed events, several reconciler shards, the walk.

* ``indexer`` — the event path (:func:`process_sqs_record`) fed the S3 events of the objects the run
  created, dropped, duplicated, reordered, and some held back until a reconciler run has ended (an
  event delivered after the reconcile that could have seen its object). It checks rule O1a as the
  event path's host sees it: a unit whose failure this process counted in its retry budget (RETRY_LATER
  or BLOCKED with the budget's ``UpdateItem`` landed) and that then succeeds in this process sends the
  ``DeleteItem`` of its retry budget.
* ``reconciler#i`` — shard i of ``reconcile_shards`` (the world's deployment has two, under a range
  plan an operator wrote before the run), a few scheduled runs each, with small caps on a run's
  entries and on its saves' spacing (the run's own parameters: a bucket of a few dozen keys
  exercises the cursor and progress saves that a real hour of 50,000 entries would).
* ``walk`` — :mod:`lightmetrics.harness.sim.walk_driver`.

Services that fan out to a thread pool (the reconciler's units, a walk page's keys) run on
:class:`~lightmetrics.harness.sim.scheduler.InlineExecutor` inside the simulation
(:func:`~lightmetrics.harness.sim.scheduler.serial_pools`), so the schedule stays the seed's; the
pools are the services' module attributes, not a switch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightmetrics.admin.blocker_actions import skip
from lightmetrics.derived.event_path import process_sqs_record
from lightmetrics.derived.hour_ranges import RangePlans
from lightmetrics.derived.indexing import KIND_FOR_KEY
from lightmetrics.derived.reconcile import INDEXING_KINDS, Reconciler
from lightmetrics.harness.sim import actors
from lightmetrics.harness.sim.actors import TASK_ATTEMPTS, QuietQueues
from lightmetrics.harness.sim.scheduler import Actor, SimCrash
from lightmetrics.harness.sim.world import World
from lightmetrics.protocol.errors import KeyLayoutError
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.work.outcome import Outcome

_NS = 1_000_000_000
#: shards of the simulated deployment (LM_RECONCILE_SHARDS) and the range plan's cut
SHARDS = 2
PLAN_CUT = "8"


@dataclass
class Derived:
    """What the derived actors share in one schedule."""

    reconcile_runs: int = 0  # reconciler runs ended (delayed events wait for one)
    walk_outcomes: list[str] = field(default_factory=list)
    side: Any = None  # side_actors.Side: conflicts, the denylist, the audit


def operator_settles(world: World) -> None:
    """Before the last reconciler runs: an operator skips the indexing blockers of a record a newer
    writer wrote (upgrading the readers is theirs to do, §17 E2; the skip is audited), and the hours
    settle (the clock moves past the settle window of the hour the run ended in)."""
    ctx = world.work_context(world.clock_for(0))
    for blocker in ctx.blockers.list(status="open"):
        if blocker.object_key in world.newer_records and blocker.kind in INDEXING_KINDS:
            skip(ctx, blocker.work_key, who="sim-operator", reason="written by a newer version; readers upgrade later")
    world.clock.advance(world.system.settings.settle_s + 3600)


def plant_range_plan(world: World) -> None:
    """The operator's range plan of two ranges, written three hours before the run (MIN_LEAD_HOURS
    ahead of its writing): every hour the run scans has two ranges, one per shard."""
    now = world.clock.now_ns()
    written = now - 3 * 3600 * _NS
    plans = RangePlans(world.system.table)
    plans.propose([PLAN_CUT], effective_from=plans.earliest(written), now_ns=written)


def settings_with_shards(world: World, shards: int) -> Any:
    return world.system.settings.model_copy(update={"reconcile_shards": shards})


def reconciler_shard(world: World, shared: Derived, shard: int, *, runs: int, delay: int = 40,
                     shards: int = SHARDS, caps: bool = True) -> Any:
    """Shard ``shard``'s scheduled runs (one Lambda container: one context for all its runs)."""
    settings = settings_with_shards(world, shards)

    def body(actor: Actor) -> None:
        rng = world.rng
        ctx = world.work_context(world.clock_for())
        ctx.settings = settings
        reconciler = Reconciler(ctx, settings, QuietQueues(), shard=shard)
        for _run in range(runs):
            for _ in range(rng.randrange(delay) if delay else 0):
                world.scheduler.pause("Schedule")  # the schedule fires later
            max_entries = rng.choice((2, 3, 5, 50_000, 50_000, 50_000)) if caps else 50_000
            save_every = rng.choice((1, 2, 5_000, 5_000)) if caps else 5_000
            for _attempt in range(TASK_ATTEMPTS):
                actor.crashed = False
                mark = len(world.scheduler.trace)
                try:
                    report = reconciler.run(max_entries=max_entries, save_every=save_every)
                    world.scheduler.note(f"reconciled shard {shard}: {report.checkpoint_before} -> "
                                         f"{report.checkpoint_after} ({report.not_closed_because})")
                    _closed_only_scanned(world, actor, shard, report, mark)
                    break
                except SimCrash:
                    continue
                except Exception as exc:  # noqa: BLE001 - a failed run: the next schedule runs again
                    world.scheduler.note(f"reconciler shard {shard} failed {type(exc).__name__}: {exc}")
                    break
            shared.reconcile_runs += 1
    return body


def _closed_only_scanned(world: World, actor: Actor, shard: int, report: Any, mark: int) -> None:
    """R5: a run closes only hours it scanned to their end — not one it did not list (shard 0 owns
    range 0 of every hour), nor the hour it stopped in and continues from."""
    codec = world.system.ctx.codec
    listed = {line.split(" ", 3)[3] for line in world.scheduler.trace[mark:]
              if line.split(" ", 2)[1] == actor.name and " ListObjectsV2 " in line}
    until = UtcHour.parse(report.continues_from) if report.continues_from else None
    for text in report.closed:
        hour = UtcHour.parse(text)
        if (until is not None and not hour < until) or (shard == 0 and codec.accepted_by_time_hour(hour) not in listed):
            world.scheduler.flag(f"R5: shard {shard} closed hour {hour}, which its run did not scan to its end "
                                 f"(continues from {report.continues_from or '-'})")


def indexer(world: World, shared: Derived, *, drop: float = 0.1, duplicate: float = 0.15, delay: float = 0.15,
            idle_limit: int = 30) -> Any:
    """The event path; see the module docstring."""
    ctx = world.work_context(world.clock_for())
    rng = world.rng

    def body(actor: Actor) -> None:
        queue: list[tuple[str, int]] = []
        held: list[tuple[str, int]] = []  # delayed until a reconciler run has ended
        failed_here: set[str] = set()  # work keys this process saw fail
        seen, idle, release_at = 0, 0, shared.reconcile_runs + 1
        while idle < idle_limit or held:
            for key in world.store.created[seen:]:
                if rng.random() >= drop:
                    for _ in range(2 if rng.random() < duplicate else 1):
                        (held if rng.random() < delay else queue).append((key, 1))
            seen = len(world.store.created)
            if held and (shared.reconcile_runs >= release_at or idle >= idle_limit):
                queue.extend(held)
                held.clear()
            if not queue:
                idle += 1
                world.scheduler.pause("Receive")  # a poll of an empty queue
                continue
            idle = 0
            key, receives = queue.pop(rng.randrange(len(queue)))  # SQS standard: no order
            if not _deliver(world, ctx, actor, key, receives, failed_here):
                queue.append((key, receives + 1))  # not acknowledged: visible again later
    return body


def _deliver(world: World, ctx: Any, actor: Actor, key: str, receives: int, failed_here: set[str]) -> bool:
    """One delivery of ``key``'s event; True when the message was acknowledged (deleted)."""
    try:
        kind = KIND_FOR_KEY.get(ctx.codec.parse(key).kind)
    except KeyLayoutError:
        kind = None
    if kind is None:
        return True  # not an indexed prefix: no notification is configured for it
    actor.crashed = False
    mark = len(world.scheduler.trace)
    try:
        results = process_sqs_record(ctx, actors._sqs_record(world, key, receives), kind=kind, bucket=world.store.bucket)
    except SimCrash:
        return receives >= 5  # the Lambda died; after maxReceiveCount the message goes to the DLQ
    world.scheduler.note(f"indexed {key} {[r.outcome.value for r in results]}")
    for r in results:
        counted = _budget_counted(world.scheduler.trace[mark:], r.work_key)
        if counted is not None:  # this delivery counted a failure, or cleared the budget
            (failed_here.add if counted else failed_here.discard)(r.work_key)
        if r.outcome in (Outcome.RETRY_LATER, Outcome.BLOCKED) or r.work_key not in failed_here:
            continue
        sent = f" DeleteItem budget#{r.work_key}/budget"  # a clear refused is logged and waits for O1b
        if not any(line.endswith(sent) for line in world.scheduler.trace[mark:]):
            failed_here.discard(r.work_key)
            world.scheduler.flag(f"O1a: {r.work_key} succeeded after a failure this process saw and its "
                                 f"retry budget was not cleared")
    return all(r.acknowledged for r in results) or receives >= 5


def _budget_counted(lines: list[str], work_key: str) -> bool | None:
    """What this delivery last did to the unit's retry budget and landed: True after a counted failure
    (its ``UpdateItem``), False after a clear (its ``DeleteItem``), None if neither. A unit can fail
    without a count — its blocker's resolve refused after the unit itself succeeded and cleared the
    budget — and then there is none to clear."""
    state: bool | None = None
    before: bool | None = None
    for line in lines:
        for op, value in (("UpdateItem", True), ("DeleteItem", False)):
            call = f" {op} budget#{work_key}/budget"
            if not line.endswith(call):
                continue
            if " fault fail " in line:
                state = before  # refused before landing: as if never sent
            elif " fault " not in line:
                before, state = state, value
    return state


__all__ = ["Derived", "indexer", "plant_range_plan", "reconciler_shard"]
