"""The SQS adapter: queue depths for the reconciler's probe and ``lmctl status``.

A queue named in ``LM_QUEUE_URLS`` that does not exist (or refuses us) is a configuration error,
:class:`~lightmetrics.protocol.errors.ResourceAccessError`, never a queue with no messages.

Example:
    >>> queue_depth(boto3.client("sqs"), url)        # doctest: +SKIP
    0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from lightmetrics.aws.errors import refused_access
from lightmetrics.protocol.errors import ResourceAccessError

_MISSING = ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")
_DENIED = ("AccessDenied", "AccessDeniedException")


def queue_error(exc: ClientError, url: str) -> ResourceAccessError | None:
    """The configuration error an SQS answer means for the queue at ``url``, or None."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if code in _MISSING:
        return ResourceAccessError("queue", url, "LM_QUEUE_URLS", "does not exist")
    if code in _DENIED:
        return ResourceAccessError("queue", url, "LM_QUEUE_URLS", refused_access(exc))
    return None


def queue_depth(sqs: Any, url: str) -> int:
    """Visible, in-flight and delayed messages of the queue at ``url`` (only the reconciler's shards
    queue delays its messages: a fan-out's jitter)."""
    try:
        attrs = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                                          "ApproximateNumberOfMessagesDelayed"]
        )["Attributes"]
    except ClientError as exc:
        refused = queue_error(exc, url)
        if refused is None:
            raise
        raise refused from exc
    return sum(int(attrs.get(name, 0)) for name in ("ApproximateNumberOfMessages",
                                                      "ApproximateNumberOfMessagesNotVisible",
                                                      "ApproximateNumberOfMessagesDelayed"))


class SqsQueueDepths:
    """The port :class:`~lightmetrics.protocol.queue_probe.QueueDepths` on SQS; ``client`` makes the
    SQS client (the admin function's on its first status request).

    >>> SqsQueueDepths(lambda: sqs).depth(url)        # doctest: +SKIP
    0
    """

    def __init__(self, client: Callable[[], Any]) -> None:
        self.client = client

    def depth(self, url: str) -> int:
        return queue_depth(self.client(), url)


__all__ = ["SqsQueueDepths", "queue_depth", "queue_error"]
