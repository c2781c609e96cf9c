"""SQS queues with DLQs and the S3 notifications that feed them, one per ``QueueSpec`` of the spec.

Every queue and DLQ has SSE-SQS (S3 cannot notify a queue under the AWS-managed ``aws/sqs`` key) and
refuses requests without TLS. CDK's handler that applies the notification configuration at deploy
time logs to a group of its own with the stack's retention.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import CfnResource, Duration, Stack
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_notifications as s3n
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from lightmetrics.deployment.resource_types import QueueSpec, ShardQueueSpec

_EVENTS = {
    "s3:ObjectCreated:*": s3.EventType.OBJECT_CREATED,
    "s3:ObjectCreated:Put": s3.EventType.OBJECT_CREATED_PUT,
    "s3:ObjectCreated:CompleteMultipartUpload": s3.EventType.OBJECT_CREATED_COMPLETE_MULTIPART_UPLOAD,
}

#: CDK's singleton that writes bucket notification configurations (exists when QUEUES is non-empty).
NOTIFICATIONS_HANDLER_ID = "BucketNotificationsHandler050a0587b7544547bf325f094a3db834"

#: Dead letters wait this long for the sweeper (which turns each one into a blocker).
DLQ_RETENTION = Duration.days(14)


@dataclass(frozen=True)
class BuiltQueue:
    spec: QueueSpec | ShardQueueSpec
    queue: sqs.Queue
    dlq: sqs.Queue


class IndexQueues(Construct):
    """Builds every queue of ``specs``; ``self.by_name`` maps queue and DLQ names to queues."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        specs: tuple[QueueSpec, ...],
        bucket: s3.Bucket,
        namespace: str,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        self.built: list[BuiltQueue] = []
        self.by_name: dict[str, sqs.Queue] = {}
        for spec in specs:
            dlq = sqs.Queue(
                self,
                f"{spec.name}-dlq",
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
                retention_period=DLQ_RETENTION,
            )
            queue = sqs.Queue(
                self,
                spec.name,
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
                visibility_timeout=Duration.seconds(spec.visibility_timeout_s),
                dead_letter_queue=sqs.DeadLetterQueue(queue=dlq, max_receive_count=spec.max_receive_count),
            )
            for event in spec.events:
                if event not in _EVENTS:
                    raise ValueError(f"queue {spec.name!r}: unsupported S3 event {event!r}")
                bucket.add_event_notification(
                    _EVENTS[event],
                    s3n.SqsDestination(queue),
                    s3.NotificationKeyFilter(prefix=namespace + spec.prefix),
                )
            self.built.append(BuiltQueue(spec, queue, dlq))
            self.by_name[spec.name] = queue
            self.by_name[spec.dlq_name] = dlq
        self.handler_log_group = self._handler_logs(log_retention) if self.built else None

    def _handler_logs(self, retention: logs.RetentionDays) -> logs.LogGroup:
        """Without it, Lambda creates the handler's log group on first run, and that one never expires."""
        handler = Stack.of(self).node.find_child(NOTIFICATIONS_HANDLER_ID).node.find_child("Resource")
        assert isinstance(handler, CfnResource)
        log_group = logs.LogGroup(self, "NotificationsHandlerLogs", retention=retention)
        handler.add_property_override("LoggingConfig", {"LogGroup": log_group.log_group_name})
        return log_group


class ShardQueues(Construct):
    """The queues the functions' schedules fan out on (one message per reconciler shard), each with its
    DLQ; ``self.by_name`` maps queue and DLQ names to queues, ``self.built`` lists them. No S3
    notification feeds them. Their DLQs are alarmed like the index queues' (``DlqNotEmpty``): a dead
    letter is a shard message whose runs failed on every receive — no work is lost (the next fan-out
    sends the shard again), but a shard that keeps failing is worth a page beside ``ReconcilerStuck``,
    which reads the shard's checkpoint (docs/protocol.md §12 R8, R9)."""

    def __init__(self, scope: Construct, construct_id: str, *, specs: tuple[ShardQueueSpec, ...]) -> None:
        super().__init__(scope, construct_id)
        self.by_name: dict[str, sqs.Queue] = {}
        self.built: list[BuiltQueue] = []
        for spec in specs:
            dlq = sqs.Queue(self, spec.dlq_name, encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
                            retention_period=Duration.seconds(spec.dlq_retention_s))
            self.by_name[spec.name] = sqs.Queue(
                self, spec.name, encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
                visibility_timeout=Duration.seconds(spec.visibility_timeout_s),
                dead_letter_queue=sqs.DeadLetterQueue(queue=dlq, max_receive_count=spec.max_receive_count))
            self.by_name[spec.dlq_name] = dlq
            self.built.append(BuiltQueue(spec, self.by_name[spec.name], dlq))
