"""System status for operators: the one core behind ``lmctl status`` and the admin API's ``GET /status``.

Queue and DLQ depths, the reconciler's checkpoint and lag (the slowest of its
``LM_RECONCILE_SHARDS`` shards, and which one: protocol §12 R8), open blockers, the completeness
watermarks and the number of unresolved identity conflicts. ``ok`` is False when something is
stuck (an open blocker or a dead letter); unresolved conflicts are reported, not "stuck": they
wait for an operator decision by design.

Example:
    >>> report = system_status(ctx, settings, sqs)          # doctest: +SKIP
    >>> report["ok"], report["open_blockers"]               # doctest: +SKIP
    (True, 0)
"""

from __future__ import annotations

from typing import Any

from lightmetrics.composition.config import Settings
from lightmetrics.ops.work import WorkContext
from lightmetrics.protocol.clock import utc_text
from lightmetrics.protocol.keys import KeyKind


def system_status(ctx: WorkContext, settings: Settings, sqs: Any) -> dict[str, Any]:
    """Read everything (one LIST, GetQueueAttributes per queue, a few GetItems — one per reconciler
    shard —, two Queries); raise on failure — a missing bucket, table or queue is
    :class:`~lightmetrics.protocol.errors.ResourceAccessError`."""
    from lightmetrics.aws.sqs_queues import queue_depth
    from lightmetrics.derived.reconcile_state import read_shard_checkpoints
    from lightmetrics.derived.walk import read_watermarks
    from lightmetrics.ops.conflict_records import CONFLICTS_PK, UNRESOLVED

    table = ctx.blockers.table
    # Status reads no object, so without this a deleted bucket would look healthy. quarantine/v1/
    # is a prefix every caller of status (the admin function, operators) may list.
    ctx.store.require_bucket(ctx.codec.root(KeyKind.QUARANTINE))
    depths = {name: queue_depth(sqs, url) for name, url in sorted(settings.queue_urls.items())}
    shards = read_shard_checkpoints(table, settings.reconcile_shards)  # overall = the slowest shard (R8)
    cp = shards.checkpoints[shards.slowest]
    lag = shards.lag_s(ctx.clock.now_ns())
    open_blockers = len(ctx.blockers.list())
    watermarks = read_watermarks(table)
    unresolved = sum(1 for i in table.query(CONFLICTS_PK) if i.get("resolution", UNRESOLVED) == UNRESOLVED)
    dlq_messages = sum(v for k, v in depths.items() if k.endswith("-dlq"))
    return {
        "queues": depths,
        "reconciler": {"checkpoint": str(cp.hour) if cp else None, "lag_s": None if lag is None else round(lag, 1),
                       "last_run": utc_text(cp.last_run_ns) if cp else None,
                       "shards": settings.reconcile_shards, "slowest_shard": shards.slowest},
        "open_blockers": open_blockers,
        "watermarks": {index: utc_text(w) for index, w in watermarks.items()},
        "unresolved_conflicts": unresolved,
        "ok": not (open_blockers > 0 or dlq_messages > 0),
    }


__all__ = ["system_status"]
