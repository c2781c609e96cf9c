"""One schedule for every reconciler shard (docs/protocol.md §12 R8): a scheduled run fans out one
message ``{"shard": i}`` per shard to the shards queue, each delayed by its own random jitter in
``[0, LM_RECONCILE_JITTER_S)``, and the same function runs each shard as its message arrives.

One EventBridge rule whatever the shard count (not one per shard: 300 rules per bus by default), and
the shards start spread over the jitter instead of in the same second. Sends go ten to a
``SendMessageBatch`` (its most), so a fan-out of N shards costs ceil(N / 10) requests.

A message is only a reminder to run a shard: running one twice, or two runs of one shard at once,
is safe (every checkpoint save is conditional on the version the run read, R2; every repair is a
conditional create), so a batch whose answer was lost and which boto3 sent again, SQS's
at-least-once delivery and a redelivery after a failed run all cost a run and nothing else. A message
for a shard that no longer exists (``LM_RECONCILE_SHARDS`` lowered between the send and the
receive) is dropped with a log line, not retried.

Example:
    >>> class Sqs:
    ...     def send_message_batch(self, QueueUrl, Entries):
    ...         return {"Successful": [{"Id": e["Id"]} for e in Entries]}
    >>> report = fan_out(Sqs(), "https://q", shards=12, jitter_s=20, rng=random.Random(7))
    >>> report.sent, report.requests, all(0 <= d < 20 for d in report.delays)
    (12, 2, True)
    >>> shard_of_message('{"shard": 3}', 4), shard_of_message('{"shard": 5}', 4)
    (3, None)
"""

from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.derived.reconcile_state import ShardError, check_shard
from lightmetrics.protocol.errors import LightmetricsError

__all__ = ["SEND_BATCH", "FanoutError", "FanoutReport", "fan_out", "fanout_requests", "shard_message",
           "shard_of_message"]

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


def shard_message(shard: int) -> str:
    """The body of shard ``shard``'s message."""
    return json.dumps({"shard": shard})


def fan_out(sqs: Any, queue_url: str, *, shards: int, jitter_s: int,
            rng: random.Random | None = None) -> FanoutReport:
    """Send one message per shard of ``shards`` to ``queue_url``, each delayed a whole number of
    seconds drawn from ``rng`` in ``[0, jitter_s)`` (0 when ``jitter_s`` is 0). Every batch is tried
    (a failed entry is sent again, at most three sends in all) before :class:`FanoutError` names the
    shards left unsent."""
    rng = rng or random.Random()  # noqa: S311 (spreading load, not a secret)
    report = FanoutReport(shards=shards)
    entries: list[dict[str, Any]] = []
    for shard in range(shards):
        delay = rng.randrange(jitter_s) if jitter_s > 0 else 0
        report.delays.append(delay)
        entries.append({"Id": str(shard), "MessageBody": shard_message(shard), "DelaySeconds": delay})
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


def shard_of_message(body: str, shards: int) -> int | None:
    """The shard a message body names, or None (logged) for one naming no shard of ``0 .. shards - 1``:
    ``LM_RECONCILE_SHARDS`` changed since it was sent, or it is no shard message. Such a message is
    dropped, not retried: no delivery would ever make it valid."""
    try:
        shard = json.loads(body).get("shard")
        return check_shard(shard, shards)
    except (ValueError, AttributeError) as exc:  # ShardError is a ValueError, as is bad JSON
        reason = str(exc) if isinstance(exc, ShardError) else f"not a shard message ({exc})"
        LOG.error("reconciler shard message dropped, not retried: %s; body %.200s", reason, body)
        return None
