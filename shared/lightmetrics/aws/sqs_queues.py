"""The SQS adapter: queue depths for the reconciler's probe and ``lmctl status``.

A queue named in ``LM_QUEUE_URLS`` (or ``LM_RECONCILE_SHARDS_QUEUE_URL``) that does not exist (or
refuses us) is a configuration error, :class:`~lightmetrics.protocol.errors.ResourceAccessError`,
never a queue with no messages.

Example:
    >>> queue_depth(boto3.client("sqs"), url)        # doctest: +SKIP
    0
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from lightmetrics.aws.errors import refused_access
from lightmetrics.protocol.errors import ResourceAccessError

_MISSING = ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")
_DENIED = ("AccessDenied", "AccessDeniedException")


_COUNTS = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed")


def queue_error(exc: ClientError, url: str, setting: str = "LM_QUEUE_URLS") -> ResourceAccessError | None:
    """The configuration error an SQS answer means for the queue at ``url`` (named by ``setting``), or None."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if code in _MISSING:
        return ResourceAccessError("queue", url, setting, "does not exist")
    if code in _DENIED:
        return ResourceAccessError("queue", url, setting, refused_access(exc))
    return None


def _attributes(sqs: Any, url: str, names: tuple[str, ...], setting: str) -> dict[str, str]:
    try:
        return dict(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(names))["Attributes"])
    except ClientError as exc:
        refused = queue_error(exc, url, setting)
        if refused is None:
            raise
        raise refused from exc


def queue_depth(sqs: Any, url: str, setting: str = "LM_QUEUE_URLS") -> int:
    """Visible, in-flight and delayed messages of the queue at ``url`` (only the reconciler's shards
    queue delays its messages: a fan-out's jitter)."""
    attrs = _attributes(sqs, url, _COUNTS, setting)
    return sum(int(attrs.get(name, 0)) for name in _COUNTS)


def depth_with_dead_letters(sqs: Any, url: str, setting: str) -> dict[str, int]:
    """``{"messages": n, "dead_letters": m}`` of the queue at ``url`` and of the DLQ its redrive
    policy names (0 without one), in two GetQueueAttributes. A redrive DLQ is in the queue's
    account and region, so its URL is the queue's with the DLQ's name: no GetQueueUrl."""
    attrs = _attributes(sqs, url, (*_COUNTS, "RedrivePolicy"), setting)
    out = {"messages": sum(int(attrs.get(name, 0)) for name in _COUNTS), "dead_letters": 0}
    if attrs.get("RedrivePolicy"):
        dlq_name = str(json.loads(attrs["RedrivePolicy"])["deadLetterTargetArn"]).rsplit(":", 1)[1]
        out["dead_letters"] = queue_depth(sqs, f"{url.rsplit('/', 1)[0]}/{dlq_name}", setting)
    return out


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

    def depth_with_dead_letters(self, url: str, setting: str) -> dict[str, int]:
        """The queue's depth and its DLQ's (:func:`depth_with_dead_letters`): the shards queue,
        which is no index queue, its DLQ's URL not configured."""
        return depth_with_dead_letters(self.client(), url, setting)


__all__ = ["SqsQueueDepths", "depth_with_dead_letters", "queue_depth", "queue_error"]
