"""The reconcile function's handler: one schedule fans out to every shard, and the shards queue runs
each (docs/protocol.md §12 R8; :mod:`lightmetrics.derived.reconcile_fanout`).

Its events:

* an SQS event from the shards queue (``Records``, batch size 1): run each message's shard;
  a failed run is a partial-batch failure (with one record, the failed invocation is the alarm,
  and SQS retries it, then dead-letters it); a message naming no shard is dropped with a log line,
  and a stale one (its shard finished a run begun after its fan-out) is dropped with a warning and
  the ``ReconcilerStaleShardMessages`` metric;
* ``{"shard": i}`` (an operator's ``lmctl invoke``): run shard i now, here;
* anything else (EventBridge's scheduled event): the fan-out, one delayed message per shard to
  ``LM_RECONCILE_SHARDS_QUEUE_URL``; without that queue, shard 0's run when it is the only shard,
  else a :class:`~lightmetrics.protocol.errors.ConfigError` (the other shards would never run).

Example (functions/reconcile/app.py):
    >>> handler = reconcile_handler()                                      # doctest: +SKIP
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from lightmetrics.aws.metrics import SwitchableMetrics
from lightmetrics.derived.reconcile import Reconciler
from lightmetrics.derived.reconcile_fanout import ShardMessage, fan_out, read_shard_message
from lightmetrics.derived.reconcile_state import UnownedRangesError, check_shard
from lightmetrics.lambda_shell.per_container import LambdaHandler, PerContainer
from lightmetrics.protocol.errors import ConfigError

__all__ = ["Shards", "reconcile_handler"]


class Shards:
    """The settings, work context and queue probe of this container, and each shard's reconciler
    as it is first asked for."""

    def __init__(self, settings: Any, ctx: Any, probe: Any) -> None:
        self.settings, self.ctx, self.probe = settings, ctx, probe
        self.built: dict[int, Reconciler] = {}

    def reconciler(self, shard: object) -> Reconciler:
        shard = check_shard(shard, self.settings.reconcile_shards)
        if shard not in self.built:
            self.built[shard] = Reconciler(self.ctx, self.settings, self.probe, shard=shard)
        return self.built[shard]


def _from_environment(metrics: Any) -> Shards:
    from lightmetrics.composition.services import queue_probe, work_context
    from lightmetrics.deployment.settings import Settings

    settings = Settings.from_env()
    return Shards(settings, work_context(settings, metrics=metrics), queue_probe(settings))


def reconcile_handler(*, build: Callable[[Any], Shards] | None = None,
                      rng: random.Random | None = None) -> LambdaHandler:
    """The reconcile handler; ``build(metrics)`` makes the container's :class:`Shards` (default:
    from ``LM_*``; the local runtime binds its own settings and role), ``rng`` draws the jitter."""
    logger = Logger(service="lightmetrics-reconcile")
    metrics = SwitchableMetrics(namespace="Lightmetrics", service="reconcile")
    shards = PerContainer(lambda: (build or _from_environment)(metrics))

    def run(shard: object, message: ShardMessage | None = None) -> dict[str, Any]:
        try:
            report = shards().reconciler(shard).run(message=message).to_json()
        except UnownedRangesError as exc:  # the run saved its work; the failed invocation is the alarm
            logger.error(str(exc), extra=exc.report.to_json())
            raise
        if report["stale"]:  # acknowledged: a later run did its work (R8); many say the queue lags
            logger.warning("reconcile shard message stale, dropped: its shard finished a run begun after "
                           "the fan-out that sent it", extra={"fanout_ns": message.fanout_ns if message else None, **report})
            metrics.add_metric(name="ReconcilerStaleShardMessages", unit=MetricUnit.Count, value=1)
        else:
            logger.info("reconcile run", extra=report)
        return report

    def run_message(record: SQSRecord) -> None:
        message = read_shard_message(record.body, shards().settings.reconcile_shards)
        if message is not None:
            run(message.shard, message)

    @metrics.log_metrics
    @logger.inject_lambda_context
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        state = shards()  # configuration errors fail the invocation
        if isinstance(event, dict) and "Records" in event:
            return dict(process_partial_response(event=event, record_handler=run_message,
                                                 processor=BatchProcessor(event_type=EventType.SQS), context=context))
        if isinstance(event, dict) and "shard" in event:
            return run(event["shard"])
        url = state.settings.reconcile_shards_queue_url
        if not url:
            if state.settings.reconcile_shards > 1:  # shard 0 alone would leave the others unrun, silently
                raise ConfigError(f"LM_RECONCILE_SHARDS is {state.settings.reconcile_shards}: a scheduled run fans "
                                  "out to the shards queue, and LM_RECONCILE_SHARDS_QUEUE_URL is not set")
            return run(0)
        report = fan_out(state.ctx.sqs(), url, shards=state.settings.reconcile_shards,
                         jitter_s=state.settings.reconcile_jitter_s, fanout_ns=state.ctx.clock.now_ns(),
                         rng=rng).to_json()
        logger.info("reconcile fan-out", extra=report)
        return report

    return LambdaHandler(handler, shards)
