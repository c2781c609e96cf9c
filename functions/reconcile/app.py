"""Steady-state reconciler Lambda (EventBridge schedule). Thin shell over lightmetrics.reconcile.

One schedule per shard (docs/protocol.md §12 R8), each with the input ``{"shard": i}``; an event
without ``shard`` (a plain scheduled event, ``lmctl invoke``) runs shard 0. A shard that is not one
of ``0 .. LM_RECONCILE_SHARDS - 1`` fails the invocation with a message saying which exist.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger

from lightmetrics.observability import SwitchableMetrics

from lightmetrics.config import Settings
from lightmetrics.reconcile import Reconciler, UnownedRangesError, check_shard

logger = Logger(service="lightmetrics-reconcile")
metrics = SwitchableMetrics(namespace="Lightmetrics", service="reconcile")
_state: dict[str, Any] = {}


def reconciler(shard: object = 0) -> Reconciler:
    """Shard ``shard``'s reconciler; the settings, work context and probe are built once per container."""
    if "settings" not in _state:
        from lightmetrics.services import queue_probe, work_context

        settings = Settings.from_env()
        _state.update(settings=settings, ctx=work_context(settings, metrics=metrics), probe=queue_probe(settings),
                      shards={})
    shard = check_shard(shard, _state["settings"].reconcile_shards)
    if shard not in _state["shards"]:
        _state["shards"][shard] = Reconciler(_state["ctx"], _state["settings"], _state["probe"], shard=shard)
    return _state["shards"][shard]


def reset() -> None:
    _state.clear()


@metrics.log_metrics
@logger.inject_lambda_context
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    shard = event.get("shard", 0) if isinstance(event, dict) else 0
    try:
        report = reconciler(shard).run().to_json()
    except UnownedRangesError as exc:  # the run saved its work; the failed invocation is the alarm
        logger.error(str(exc), extra=exc.report.to_json())
        raise
    logger.info("reconcile run", extra=report)
    return report
