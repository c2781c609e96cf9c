"""SQS-triggered Lambda shell for the indexers: Powertools batch processing, concurrently.

Records of one SQS batch are processed concurrently (Powertools' ``AsyncBatchProcessor`` over a
bounded thread pool, since the core is synchronous boto3), so a batch of 10 costs about the
round trips of one record, not ten. A record whose work ended RETRY_LATER is reported as a
partial-batch failure and comes back after the visibility timeout; DONE, NOOP_RESOLVED and
BLOCKED records are acknowledged (a BLOCKED one has its blocker already).

Example (functions/index_accepted/app.py):
    >>> handler = sqs_index_handler(kind=KIND_ACCEPTED, queue="index-accepted")    # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import AsyncBatchProcessor, EventType, async_process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from lightmetrics.aws.metrics import SwitchableMetrics
from lightmetrics.derived.event_path import process_sqs_record
from lightmetrics.lambda_shell.per_container import LambdaHandler, PerContainer
from lightmetrics.work.outcome import Outcome

_EXECUTOR = ThreadPoolExecutor(max_workers=10, thread_name_prefix="lm-sqs-record")


class RetryLater(Exception):
    """Raised for a record to be redelivered (a partial-batch failure)."""


def sqs_index_handler(
    *, kind: str, queue: str, settings_factory: Callable[[], Any] | None = None, work_context_factory: Any = None
) -> LambdaHandler:
    """Build the Lambda handler of one indexer queue.

    Configuration comes from the environment (``LM_*``) unless ``settings_factory`` is given —
    the local runtime passes one so that several systems can share a process.
    """
    logger = Logger(service=f"lightmetrics-{queue}")
    metrics = SwitchableMetrics(namespace="Lightmetrics", service=queue)

    def build() -> tuple[Any, Any]:
        from lightmetrics.composition.services import work_context
        from lightmetrics.deployment.settings import Settings

        settings = settings_factory() if settings_factory else Settings.from_env()
        return (work_context_factory or work_context)(settings, metrics=metrics), settings

    context = PerContainer(build)

    async def record_handler(record: SQSRecord) -> None:
        ctx, settings = context()
        loop = asyncio.get_running_loop()
        call = contextvars.copy_context().run
        results = await loop.run_in_executor(
            _EXECUTOR,
            lambda: call(process_sqs_record, ctx, record.raw_event, kind=kind, bucket=settings.bucket, queue=queue),
        )
        for r in results:
            metrics.add_metric(name=f"Outcome_{r.outcome.value}", unit=MetricUnit.Count, value=1)
        retry = [r for r in results if r.outcome is Outcome.RETRY_LATER]
        if retry:
            raise RetryLater("; ".join(f"{r.work_key}: {r.detail}" for r in retry))

    @metrics.log_metrics
    @logger.inject_lambda_context
    def handler(event: dict[str, Any], lambda_context: Any) -> dict[str, Any]:
        context()  # configuration errors fail the invocation, not each record
        processor = AsyncBatchProcessor(event_type=EventType.SQS)
        return dict(async_process_partial_response(
            event=event, record_handler=record_handler, processor=processor, context=lambda_context
        ))

    return LambdaHandler(handler, context)
