"""One schedule for every reconciler shard (docs/protocol.md §12 R8): a scheduled run fans out one
message ``{"shard": i, "fanout_ns": t}`` per shard to the shards queue (t: the fan-out's time), each
delayed by its own random jitter in ``[0, LM_RECONCILE_JITTER_S)``, and the same function runs each
shard as its message arrives.

One EventBridge rule whatever the shard count (not one per shard: 300 rules per bus by default), and
the shards start spread over the jitter instead of in the same second. Sends go ten to a
``SendMessageBatch`` (its most), so a fan-out of N shards costs ceil(N / 10) requests.

A message is only a reminder to run a shard: running one twice, or two runs of one shard at once,
is safe (every checkpoint save is conditional on the version the run read, R2; every repair is a
conditional create), so a batch whose answer was lost and which boto3 sent again, SQS's
at-least-once delivery and a redelivery after a failed run all cost a run and nothing else. A message
for a shard that no longer exists (``LM_RECONCILE_SHARDS`` lowered between the send and the
receive) is dropped with a log line, not retried.

A message carries its fan-out's time (``fanout_ns``), and one whose shard finished a run that began
after it (:func:`served`) is stale: a late redelivery (a visibility timeout, a throttled function)
is dropped, not run again as if scheduled. Not an age limit: under a backlog longer than the period
every message would be older than it and no shard would ever run; a message is dropped only when a
later run of its shard did its work. A message without the field (sent before it) still runs.

Example:
    >>> class Sqs:
    ...     def send_message_batch(self, QueueUrl, Entries):
    ...         return {"Successful": [{"Id": e["Id"]} for e in Entries]}
    >>> report = fan_out(Sqs(), "https://q", shards=12, jitter_s=20, fanout_ns=0, rng=random.Random(7))
    >>> report.sent, report.requests, all(0 <= d < 20 for d in report.delays)
    (12, 2, True)
    >>> read_shard_message(shard_message(3, fanout_ns=5), 4), read_shard_message('{"shard": 5}', 4)
    (ShardMessage(shard=3, fanout_ns=5), None)
"""

from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lightmetrics.derived.reconcile_state import Checkpoint, ShardError, check_shard
from lightmetrics.protocol.errors import LightmetricsError

__all__ = ["SEND_BATCH", "FanoutError", "FanoutReport", "ShardMessage", "fan_out", "fanout_requests",
           "read_shard_message", "served", "shard_message"]

LOG = logging.getLogger(__name__)

#: SendMessageBatch's most entries per request
SEND_BATCH = 10
#: sends of one batch's failed entries, the first included (SQS answers a throttled entry as failed)
_ATTEMPTS = 3


class FanoutError(LightmetricsError):
    """Some shards' messages were not sent (the others were): the failed invocation is the alarm,
    and the next scheduled run sends every shard again."""


@dataclass
class FanoutReport:
    """What one fan-out sent: ``delays[i]`` is shard i's delay in seconds; ``requests`` the
    SendMessageBatch calls it took."""

    shards: int
    sent: int = 0
    requests: int = 0
    delays: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"fanout": True, "shards": self.shards, "sent": self.sent, "requests": self.requests,
                "max_delay_s": max(self.delays, default=0)}


def fanout_requests(shards: int) -> dict[str, int]:
    """SQS requests of one fan-out to ``shards`` shards: SendMessageBatch ten messages at a time
    (counted: tests/test_reconcile_fanout.py), then for each shard's message Lambda's event source
    receives it and deletes it (batch size 1). The cost model prices these.

    >>> fanout_requests(96)
    {'sqs.SendMessageBatch': 10, 'sqs.ReceiveMessage': 96, 'sqs.DeleteMessage': 96}
    """
    return {"sqs.SendMessageBatch": math.ceil(shards / SEND_BATCH), "sqs.ReceiveMessage": shards,
            "sqs.DeleteMessage": shards}


class ShardMessage(NamedTuple):
    """A shard message read: its shard, and when its fan-out ran (None: a message sent before the field)."""

    shard: int
    fanout_ns: int | None


def shard_message(shard: int, *, fanout_ns: int | None) -> str:
    """The body of shard ``shard``'s message from the fan-out that ran at ``fanout_ns`` (None: the
    old format, without it)."""
    return json.dumps({"shard": shard} if fanout_ns is None else {"shard": shard, "fanout_ns": fanout_ns})


def served(message: ShardMessage, checkpoint: Checkpoint | None) -> bool:
    """Whether ``message`` is stale: its shard's last finished run (``finished_ns``, when that run
    began) began after the message's fan-out, so that run did what the message asks. Never for a
    message without ``fanout_ns``, nor for a shard whose runs since have not finished (a failed run's
    retry still runs), nor when the last run saved a ``failure`` (ranges no shard owns, R8): that run
    did not do the work, and its retries must fail on to the DLQ and its alarm.

    >>> from lightmetrics.protocol.keys import UtcHour
    >>> cp = Checkpoint(UtcHour(0), version=3, last_run_ns=20, finished_ns=20)
    >>> served(ShardMessage(1, 10), cp), served(ShardMessage(1, 20), cp), served(ShardMessage(1, None), cp)
    (True, False, False)
    >>> served(ShardMessage(1, 10), Checkpoint(UtcHour(0), 3, 20, finished_ns=20, failure="unowned"))
    False
    """
    return (message.fanout_ns is not None and checkpoint is not None and not checkpoint.failure
            and checkpoint.finished_ns > message.fanout_ns)


def fan_out(sqs: Any, queue_url: str, *, shards: int, jitter_s: int, fanout_ns: int,
            rng: random.Random | None = None) -> FanoutReport:
    """Send one message per shard of ``shards`` to ``queue_url``, stamped ``fanout_ns`` (now), each
    delayed a whole number of seconds drawn from ``rng`` in ``[0, jitter_s)`` (0 when ``jitter_s``
    is 0). Every batch is tried (a failed entry is sent again, at most three sends in all) before
    :class:`FanoutError` names the shards left unsent."""
    rng = rng or random.Random()  # noqa: S311 (spreading load, not a secret)
    report = FanoutReport(shards=shards)
    entries: list[dict[str, Any]] = []
    for shard in range(shards):
        delay = rng.randrange(jitter_s) if jitter_s > 0 else 0
        report.delays.append(delay)
        entries.append({"Id": str(shard), "MessageBody": shard_message(shard, fanout_ns=fanout_ns),
                        "DelaySeconds": delay})
    unsent: dict[str, str] = {}
    for start in range(0, len(entries), SEND_BATCH):
        pending = entries[start:start + SEND_BATCH]
        for _ in range(_ATTEMPTS):
            answer = sqs.send_message_batch(QueueUrl=queue_url, Entries=pending)
            report.requests += 1
            report.sent += len(answer.get("Successful", []))
            failed: dict[str, dict[str, Any]] = {f["Id"]: f for f in answer.get("Failed", [])}
            pending = [e for e in pending if e["Id"] in failed]
            # a sender's fault (a malformed entry) fails again the same way: not worth a resend
            if not pending or any(f.get("SenderFault") for f in failed.values()):
                break
        unsent.update({str(e["Id"]): str(failed[e["Id"]].get("Code", "?")) for e in pending})
    if unsent:
        raise FanoutError(f"reconciler fan-out: {len(unsent)} of {shards} shard messages not sent "
                          f"(shard: error {unsent}); the next scheduled run sends every shard again")
    return report


def read_shard_message(body: str, shards: int) -> ShardMessage | None:
    """The shard a message body names and its fan-out's time, or None (logged) for one naming no
    shard of ``0 .. shards - 1``: ``LM_RECONCILE_SHARDS`` changed since it was sent, or it is no shard
    message. Such a message is dropped, not retried: no delivery would ever make it valid."""
    try:
        message = json.loads(body)
        fanout_ns = message.get("fanout_ns")
        if fanout_ns is not None and (type(fanout_ns) is not int or fanout_ns < 0):
            raise ValueError(f"fanout_ns must be a whole number of nanoseconds, got {fanout_ns!r}")
        return ShardMessage(check_shard(message.get("shard"), shards), fanout_ns)
    except (ValueError, AttributeError) as exc:  # ShardError is a ValueError, as is bad JSON
        reason = str(exc) if isinstance(exc, ShardError) else f"not a shard message ({exc})"
        LOG.error("reconciler shard message dropped, not retried: %s; body %.200s", reason, body)
        return None
