"""Steady-state reconciler Lambda (EventBridge schedule). Thin shell over lightmetrics.derived.reconcile.

One schedule per shard (docs/protocol.md §12 R8), each with the input ``{"shard": i}``; an event
without ``shard`` (a plain scheduled event, ``lmctl invoke``) runs shard 0. A shard that is not one
of ``0 .. LM_RECONCILE_SHARDS - 1`` fails the invocation with a message saying which exist.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger

from lightmetrics.aws.metrics import SwitchableMetrics
from lightmetrics.deployment.settings import Settings
from lightmetrics.derived.reconcile import Reconciler
from lightmetrics.derived.reconcile_state import UnownedRangesError, check_shard
from lightmetrics.lambda_shell.per_container import PerContainer

logger = Logger(service="lightmetrics-reconcile")
metrics = SwitchableMetrics(namespace="Lightmetrics", service="reconcile")


class _Shards:
    """The settings, work context and queue probe of this container, and each shard's reconciler
    as it is first asked for (one schedule per shard: a container usually serves one)."""

    def __init__(self) -> None:
        from lightmetrics.composition.services import queue_probe, work_context

        self.settings = Settings.from_env()
        self.ctx, self.probe = work_context(self.settings, metrics=metrics), queue_probe(self.settings)
        self.built: dict[int, Reconciler] = {}

    def reconciler(self, shard: object) -> Reconciler:
        shard = check_shard(shard, self.settings.reconcile_shards)
        if shard not in self.built:
            self.built[shard] = Reconciler(self.ctx, self.settings, self.probe, shard=shard)
        return self.built[shard]


shards = PerContainer(_Shards)
reset = shards.reset


def reconciler(shard: object = 0) -> Reconciler:
    """Shard ``shard``'s reconciler (built once per container)."""
    return shards().reconciler(shard)


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
