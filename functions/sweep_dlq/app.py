"""DLQ sweeper Lambda (EventBridge schedule): every dead-lettered message becomes a blocker."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger

from lightmetrics.observability import SwitchableMetrics
from aws_lambda_powertools.metrics import MetricUnit

from lightmetrics.blocker_actions import sweep_dlqs
from lightmetrics.config import Settings

logger = Logger(service="lightmetrics-sweep-dlq")
metrics = SwitchableMetrics(namespace="Lightmetrics", service="sweep-dlq")
_state: dict[str, Any] = {}


def reset() -> None:
    _state.clear()


@metrics.log_metrics
@logger.inject_lambda_context
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if "ctx" not in _state:
        from lightmetrics.services import work_context

        _state["ctx"] = work_context(Settings.from_env(), metrics=metrics)
    made = sweep_dlqs(_state["ctx"])
    metrics.add_metric(name="DlqMessagesSwept", unit=MetricUnit.Count, value=sum(made.values()))
    logger.info("swept DLQs", extra={"blockers_made": made})
    return {"blockers_made": made}
