"""DLQ sweeper Lambda (EventBridge schedule): every dead-lettered message becomes a blocker."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import MetricUnit

from lightmetrics.admin.blocker_actions import sweep_dlqs
from lightmetrics.aws.metrics import SwitchableMetrics
from lightmetrics.deployment.settings import Settings
from lightmetrics.lambda_shell.per_container import PerContainer

logger = Logger(service="lightmetrics-sweep-dlq")
metrics = SwitchableMetrics(namespace="Lightmetrics", service="sweep-dlq")


def _build_context() -> Any:
    from lightmetrics.composition.services import work_context

    return work_context(Settings.from_env(), metrics=metrics)


work = PerContainer(_build_context)
reset = work.reset


@metrics.log_metrics
@logger.inject_lambda_context
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    made = sweep_dlqs(work())
    metrics.add_metric(name="DlqMessagesSwept", unit=MetricUnit.Count, value=sum(made.values()))
    logger.info("swept DLQs", extra={"blockers_made": made})
    return {"blockers_made": made}
