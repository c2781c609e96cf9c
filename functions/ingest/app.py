"""Ingest Lambda (Function URL, payload 2.0; also API Gateway HTTP/REST events).

Thin shell: parse the event, call :class:`lightmetrics.acceptance.http_contract.IngestService`, report.
Configuration is read and validated once per cold start; an invalid configuration fails the
cold start loudly rather than answering requests wrongly.
"""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.metrics import MetricUnit

from lightmetrics.acceptance.http_contract import HttpResponse, IngestService, parse_lambda_event
from lightmetrics.aws.metrics import SwitchableMetrics
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import ingest_service
from lightmetrics.deployment.settings import Settings
from lightmetrics.lambda_shell.per_container import PerContainer
from lightmetrics.protocol.errors import InvalidIdentityError

logger = Logger(service="lightmetrics-ingest")
metrics = SwitchableMetrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Lightmetrics"), service="ingest")
tracer = Tracer(service="lightmetrics-ingest")

_counter = RequestCounter()
service: PerContainer[IngestService] = PerContainer(
    lambda: ingest_service(Settings.from_env(), counter=_counter, metrics=metrics))
reset = service.reset


@metrics.log_metrics
@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    svc = service()
    try:
        request = parse_lambda_event(event)
    except InvalidIdentityError as exc:
        return HttpResponse(400, {"status": "invalid", "duplicate": False, "reason": str(exc)}).to_lambda()
    with _counter.operation("accept") as op:
        response = svc.handle(request)
    metrics.add_metric(name="S3RequestsPerAccept", unit=MetricUnit.Count, value=op.total)
    if response.status >= 500:
        metrics.add_metric(name="Ingest5xx", unit=MetricUnit.Count, value=1)
    logger.info(
        "ingest answered",
        extra={"status": response.status, "result": response.body.get("status"), "s3_requests": op.total},
    )
    return response.to_lambda()
