"""Steady-state reconciler Lambda (EventBridge schedule). Thin shell over lightmetrics.reconcile."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger

from lightmetrics.observability import SwitchableMetrics

from lightmetrics.config import Settings
from lightmetrics.reconcile import Reconciler

logger = Logger(service="lightmetrics-reconcile")
metrics = SwitchableMetrics(namespace="Lightmetrics", service="reconcile")
_state: dict[str, Any] = {}


def reconciler() -> Reconciler:
    if "r" not in _state:
        from lightmetrics.services import queue_probe, work_context

        settings = Settings.from_env()
        _state["r"] = Reconciler(work_context(settings, metrics=metrics), settings, queue_probe(settings))
    return _state["r"]


def reset() -> None:
    _state.clear()


@metrics.log_metrics
@logger.inject_lambda_context
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    report = reconciler().run().to_json()
    logger.info("reconcile run", extra=report)
    return report
