"""Admin Lambda (Function URL, IAM auth): conflicts, resolutions, the denylist, blockers, status.

Thin shell: the routes are :func:`lightmetrics.admin.api.build_resolver` (Powertools'
``LambdaFunctionUrlResolver``) over the same core as ``lmctl conflicts``, ``lmctl blockers list``
and ``lmctl status``. AWS verifies the SigV4 signature before invoking (auth type ``AWS_IAM``);
locally, :mod:`lightmetrics.local.sigv4` does.
"""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.metrics import MetricUnit

from lightmetrics.admin.api import AdminCore, build_resolver
from lightmetrics.aws.metrics import SwitchableMetrics
from lightmetrics.lambda_shell.per_container import PerContainer

logger = Logger(service="lightmetrics-admin")
metrics = SwitchableMetrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Lightmetrics"), service="admin")
tracer = Tracer(service="lightmetrics-admin")



def _build_core() -> AdminCore:
    from lightmetrics.composition.services import queue_depths, work_context
    from lightmetrics.deployment.settings import Settings

    settings = Settings.from_env()
    ctx = work_context(settings, metrics=metrics, component="admin")
    return AdminCore(ctx, settings, queue_depths(ctx.sqs))  # its SQS client is made by the first status request


core = PerContainer(_build_core)
reset = core.reset


app = build_resolver(core)


@metrics.log_metrics
@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    out = app.resolve(event, context)
    status = int(out.get("statusCode", 200))
    if status >= 500:
        # The HTTP 5xx metric every Function URL's 5xxRate alarm reads (infra/components/observability.py).
        metrics.add_metric(name="Ingest5xx", unit=MetricUnit.Count, value=1)
    logger.info("admin answered", extra={"status": status, "path": event.get("rawPath"),
                                         "caller": ((event.get("requestContext") or {}).get("authorizer") or {})})
    return out
