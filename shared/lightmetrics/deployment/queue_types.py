"""The resource spec's queues: the index queues S3 notifications feed, and the reconciler's shards queue
that its one schedule fans out on (docs/protocol.md §12 R8). Plain frozen dataclasses, stdlib only.

Example:
    >>> ShardQueueSpec("shards", "shards-dlq").redrive_policy("arn:dlq")
    '{"deadLetterTargetArn": "arn:dlq", "maxReceiveCount": "3"}'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["OBJECT_CREATED_EVENT", "QueueSpec", "ShardQueueSpec", "redrive_policy"]

#: The only S3 event the system subscribes to: every write is a create (docs/protocol.md §10).
OBJECT_CREATED_EVENT = "s3:ObjectCreated:*"


def redrive_policy(dlq_arn: str, max_receive_count: int) -> str:
    """A queue's ``RedrivePolicy`` attribute (a JSON string, as SQS wants it)."""
    return json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)})


@dataclass(frozen=True)
class QueueSpec:
    """An SQS queue fed by S3 ``ObjectCreated`` notifications under one key prefix, with a DLQ.

    ``prefix`` is relative to the prefix namespace (``LM_PREFIX``); the notification filter is
    ``namespace + prefix``.
    """

    name: str
    prefix: str
    dlq_name: str
    max_receive_count: int = 5
    visibility_timeout_s: int = 60
    events: tuple[str, ...] = (OBJECT_CREATED_EVENT,)

    def s3_notification(self, queue_arn: str, *, namespace: str = "") -> dict[str, Any]:
        """One ``QueueConfigurations`` entry of ``PutBucketNotificationConfiguration``."""
        return {
            "Id": self.name,
            "QueueArn": queue_arn,
            "Events": list(self.events),
            "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": namespace + self.prefix}]}},
        }

    def redrive_policy(self, dlq_arn: str) -> str:
        """The queue's ``RedrivePolicy`` attribute (a JSON string, as SQS wants it)."""
        return redrive_policy(dlq_arn, self.max_receive_count)


@dataclass(frozen=True)
class ShardQueueSpec:
    """The queue a scheduled function fans out on (``FunctionSpec.shard_queue``): one message
    ``{"shard": i, "fanout_ns": t}`` per reconciler shard, each delayed by its own jitter, consumed
    by the same function one message at a time. No S3 notification feeds it, and it is no index
    queue: the reconciler's queue probe and the DLQ sweeper do not read it, and ``lmctl status``
    shows its depth and its DLQ's apart (``shard_queues``), never as a cause (its settings key is
    ``LM_RECONCILE_SHARDS_QUEUE_URL``, not ``LM_QUEUE_URLS``). Its DLQ has the ``DlqNotEmpty`` alarm.

    A message holds no work of its own: the next scheduled fan-out sends every shard again. So a
    shard whose run keeps failing is retried ``max_receive_count`` times and then dead-lettered,
    where it waits ``dlq_retention_s`` for a person reading why (the shard's checkpoint records the
    failed run: that, not the dead letter, is what ``ReconcilerStuck`` and ``lmctl status`` report).
    """

    name: str
    dlq_name: str
    max_receive_count: int = 3
    #: at least the consuming function's timeout (CDK checks it): a run in progress is not redelivered
    visibility_timeout_s: int = 960
    dlq_retention_s: int = 4 * 86400

    def redrive_policy(self, dlq_arn: str) -> str:
        """The queue's ``RedrivePolicy`` attribute (a JSON string, as SQS wants it)."""
        return redrive_policy(dlq_arn, self.max_receive_count)
