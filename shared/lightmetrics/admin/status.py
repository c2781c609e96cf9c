"""System status for operators: the one core behind ``lmctl status`` and the admin API's ``GET /status``.

Queue and DLQ depths (the index queues', and the reconciler's shards queue's under
``shard_queues``), the reconciler's checkpoint and lag (the slowest of its
``LM_RECONCILE_SHARDS`` shards, and which one: protocol §12 R8), open blockers, the completeness
watermarks and the number of unresolved identity conflicts. ``ok`` is False exactly when
``causes`` is not empty: one line for each thing that is stuck (protocol §12 R9) — an open
blocker, a dead letter, a reconciler shard that never ran, failed its last run or finished none
for an hour, a checkpoint lag above the ``ReconcilerLag`` alarm's threshold, a walk or reap whose
last execution failed or stopped without finishing (its lease lapsed), a retention run that failed,
a retention hour that cannot finish. Unresolved conflicts are reported, not
"stuck": they wait for an operator decision by design.

Example:
    >>> report = system_status(ctx, settings, queue_depths(ctx.sqs))  # doctest: +SKIP
    >>> report["ok"], report["causes"]                      # doctest: +SKIP
    (False, ['reconciler shard 1 has never run: ...'])
"""

from __future__ import annotations

from typing import Any, Protocol

from lightmetrics.deployment.resources import SPEC
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.clock import utc_text
from lightmetrics.protocol.control_store import ControlStore, plain
from lightmetrics.protocol.keys import KeyKind
from lightmetrics.protocol.queue_probe import QueueDepths
from lightmetrics.work.units import WorkContext


class StatusQueues(QueueDepths, Protocol):
    """The queue reads of status: an index queue's depth, and the shards queue's with its DLQ's
    (``{"messages": n, "dead_letters": m}``: only its own URL is configured, by ``setting``)."""

    def depth_with_dead_letters(self, url: str, setting: str) -> dict[str, int]: ...


def shard_queue_depths(settings: Settings, queues: StatusQueues) -> dict[str, dict[str, int]]:
    """The reconciler's shards queue (protocol §12 R8) by name, with its depth and its DLQ's; none
    without ``LM_RECONCILE_SHARDS_QUEUE_URL``. Never stuck: its dead letters hold no work (the next
    fan-out sends every shard again) and the shards' checkpoints say whether a shard is stuck (R9)."""
    url = settings.reconcile_shards_queue_url
    if not url:
        return {}
    name = SPEC.function("reconcile").shard_queue or "reconcile-shards"
    return {name: queues.depth_with_dead_letters(url, Settings.env_name("reconcile_shards_queue_url"))}


def system_status(ctx: WorkContext, settings: Settings, queues: StatusQueues) -> dict[str, Any]:
    """Read everything (one LIST, GetQueueAttributes per queue and two for the shards queue, a few
    GetItems — one per reconciler shard, the walk's and the reap's summaries, each retention scope's last outcome, and a job's
    lease only while its summary says running —, four Queries: conflicts, blockers, and the
    retention records of both scopes); raise on failure — a missing bucket, table or queue is
    :class:`~lightmetrics.protocol.errors.ResourceAccessError`."""
    from lightmetrics.acceptance.conflict_records import CONFLICTS_PK, UNRESOLVED
    from lightmetrics.derived.reconcile_state import read_shard_checkpoints
    from lightmetrics.derived.walk import read_watermarks
    from lightmetrics.derived.walk.state import walk_failure

    table = ctx.blockers.table
    # Status reads no object, so without this a deleted bucket would look healthy. quarantine/v1/
    # is a prefix every caller of status (the admin function, operators) may list.
    ctx.store.require_bucket(ctx.codec.root(KeyKind.QUARANTINE))
    depths = {name: queues.depth(url) for name, url in sorted(settings.queue_urls.items())}
    now = ctx.clock.now_ns()
    shards = read_shard_checkpoints(table, settings.reconcile_shards)  # overall = the slowest shard (R8)
    cp = shards.checkpoints[shards.slowest]
    lag = shards.lag_s(now)
    open_blockers = len(ctx.blockers.list())
    watermarks = read_watermarks(table)
    unresolved = sum(1 for i in table.query(CONFLICTS_PK) if i.get("resolution", UNRESOLVED) == UNRESOLVED)
    causes = [f"{open_blockers} open blocker(s): work stopped (lmctl blockers list)"] if open_blockers else []
    causes += [f"{name} holds {n} dead letter(s) (lmctl blockers list; lmctl blockers redrive)"
               for name, n in depths.items() if name.endswith("-dlq") and n]
    causes += shards.shard_causes(now) + [c for c in (shards.lag_cause(now, settings.settle_s),
                                                      walk_failure(table, now)) if c]
    causes += reap_causes(table, now)
    return {
        "queues": depths,
        "shard_queues": shard_queue_depths(settings, queues),
        "reconciler": {"checkpoint": str(cp.hour) if cp else None, "lag_s": None if lag is None else round(lag, 1),
                       "last_run": utc_text(cp.last_run_ns) if cp else None,
                       "shards": settings.reconcile_shards, "slowest_shard": shards.slowest},
        "open_blockers": open_blockers,
        "watermarks": {index: utc_text(w) for index, w in watermarks.items()},
        "unresolved_conflicts": unresolved,
        "causes": causes,
        "ok": not causes,
    }


def reap_causes(table: ControlStore, now_ns: int) -> list[str]:
    """Why reaps are stuck (R9): the last reap's execution failed (its checkpoint says ``failed``),
    or stopped without finishing (``running``, its lease lapsed: ``leases.stopped_cause``); a retention
    hour tombstoned but not reaped that no running retention is working on (R-I5, R-I6: the next
    run retries it, but it cannot finish while its cause holds); an hour the last retention run of
    a scope skipped or left blocked, and that run failing — from ``retention-last#<scope>``, which
    GC's runs do not replace. GetItems of the checkpoint, both scopes' last outcomes (and of the
    lease, only while a run is recorded running), and a Query of each scope's retention records
    (one item per reaped hour: a page holds years of them)."""
    from lightmetrics.reaps.params import CHECKPOINT_PK, CHECKPOINT_SK, LEASE_PK
    from lightmetrics.work import leases

    cp = plain(table.get(CHECKPOINT_PK, CHECKPOINT_SK) or {})
    causes = []
    mode = cp.get("mode")
    if cp.get("status") == "failed":
        causes.append(f"reap ({mode}) epoch {cp.get('epoch')}: its last execution failed: "
                      f"{cp.get('error') or '(no error recorded)'} (start it again: lmctl reap {mode} "
                      f"--execute --wait; lmctl reap status)")
    elif cp.get("status") == "running":
        causes += leases.stopped_cause(leases.read(table, LEASE_PK), now_ns, f"reap ({mode}) epoch {cp.get('epoch')}",
                                       f"start it again: lmctl reap {mode} --execute --wait; lmctl reap status")
    for scope in ("raw", "rollup"):
        causes += _retention_causes(table, cp, scope)
    return causes


def _retention_causes(table: ControlStore, cp: dict[str, Any], scope: str) -> list[str]:
    """One scope's retention causes: its hours left tombstoned, and those its last run skipped or
    left blocked. The last run is the current checkpoint while it is that scope's retention (and
    ``running``: its hours still in hand are not stuck), else ``retention-last#<scope>``."""
    from lightmetrics.reaps.params import CHECKPOINT_PK
    from lightmetrics.reaps.report import hour_unfinished, retention_last_sk
    from lightmetrics.reaps.retention import unfinished_hours

    last = plain(table.get(CHECKPOINT_PK, retention_last_sk(scope)) or {})
    current = cp.get("mode") == "retention" and (cp.get("scope") or "raw") == scope \
        and int(cp.get("epoch") or 0) >= int(last.get("epoch") or 0)
    run, causes = (cp if current else last), []
    if not current and last.get("status") in ("failed", "stopped"):
        causes.append(f"retention ({scope}) epoch {last.get('epoch')}: its last run {last['status']}: "
                      f"{last.get('error') or '(no error recorded)'} "
                      f"(lmctl reap status; lmctl reap retention --scope {scope} --execute --wait)")
    statuses: dict[str, str] = dict(run.get("hour_status") or {})
    running = current and cp.get("status") == "running"
    in_hand = set((cp.get("hours") or [])[int(cp.get("hour_index") or 0):]) if running else set()
    stuck = {str(h): statuses.get(str(h), "") for h in unfinished_hours(table, scope)}
    if not running:
        stuck.update({h: s for h, s in statuses.items() if hour_unfinished(s)})
    for hour, why in sorted(stuck.items()):
        if hour not in in_hand:
            causes.append(f"retention ({scope}) hour {hour} cannot finish: "
                          f"{why or 'tombstoned, not reaped: its retention stopped part-way'} "
                          f"(lmctl reap status; lmctl reap retention --scope {scope} --execute --wait)")
    return causes


__all__ = ["reap_causes", "system_status"]
