"""What operators (and the DLQ sweeper) do with blockers: sweep, retry, resume, skip, redrive.

The operator verbs of docs/protocol.md §11 on top of :class:`lightmetrics.work.blockers.BlockerStore`:

* ``sweep_dlqs`` — every message in a DLQ becomes a blocker (written before the message is
  deleted), so nothing sits unseen in a dead-letter queue;
* ``retry`` — run the unit now against live state; a success resolves the blocker;
* ``resume`` — clear the blocker and its retry budget and let the worker try again (work that
  came from a queue is sent back to it);
* ``skip`` — stop working on it, audited with who, when and why;
* ``redrive`` — resume every open blocker that came from a DLQ.

What a job does by itself (§11 O4: run a blocked unit again, a success resolves it) is
:mod:`lightmetrics.derived.rerun`'s; ``retry`` runs the unit the same way.

Example:
    >>> retry(ctx, "index-accepted:accepted/v1/...", who="alice")     # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightmetrics.derived.event_path import parse_notification, process_sqs_record
from lightmetrics.derived.indexing import RUNNERS
from lightmetrics.derived.rerun import rerun
from lightmetrics.work.blockers import OPEN, Blocker
from lightmetrics.work.outcome import Outcome, PermanentWorkError, WorkResult
from lightmetrics.work.units import WorkContext

DLQ_SUFFIX = "-dlq"
#: index queue name -> the kind of work its messages carry
QUEUE_KINDS = {"index-accepted": "index-accepted", "index-raw-blobs": "index-raw-blob",
               "index-quarantine": "index-quarantine"}


class ActionError(Exception):
    """An operator action that cannot be done (unknown blocker, wrong state)."""


@dataclass
class ActionResult:
    work_key: str
    action: str
    status: str
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"work_key": self.work_key, "action": self.action, "status": self.status, "detail": self.detail}


def _queue_urls(ctx: WorkContext) -> dict[str, str]:
    return dict(ctx.settings.queue_urls)


def sweep_dlqs(ctx: WorkContext, *, max_messages: int = 1000) -> dict[str, int]:
    """Turn every DLQ message into a blocker, then delete it. Returns blockers made per DLQ."""
    made: dict[str, int] = {}
    for name, url in _queue_urls(ctx).items():
        if not name.endswith(DLQ_SUFFIX):
            continue
        source = name[: -len(DLQ_SUFFIX)]
        made[name] = 0
        while made[name] < max_messages:
            batch = ctx.sqs().receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                              AttributeNames=["All"]).get("Messages", [])
            if not batch:
                break
            for msg in batch:
                object_key = _first_key(msg.get("Body", "")) or f"sqs:{name}:{msg['MessageId']}"
                ctx.blockers.block(
                    f"dlq:{object_key}", kind="dlq", object_key=object_key,
                    reason=f"message exhausted its receives on {source} and reached {name}", source="dlq",
                    payload={"queue": source, "body": msg.get("Body", "")},
                )  # durable first ...
                ctx.sqs().delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])  # ... then forget
                made[name] += 1
    return made


def _first_key(body: str) -> str | None:
    try:
        objects = parse_notification(body)
    except PermanentWorkError:
        return None
    return objects[0].key if objects else None


def _send_back(ctx: WorkContext, blocker: Blocker) -> str:
    if not blocker.payload or not blocker.payload.get("queue"):
        return ""
    queue = blocker.payload["queue"]
    url = _queue_urls(ctx).get(queue)
    if url is None:
        raise ActionError(f"queue {queue!r} is not configured (LM_QUEUE_URLS)")
    ctx.sqs().send_message(QueueUrl=url, MessageBody=blocker.payload["body"])
    return f"re-enqueued on {queue}"


def retry(ctx: WorkContext, work_key: str, *, who: str) -> ActionResult:
    blocker = ctx.blockers.get(work_key)
    if blocker.payload and blocker.kind in ("dlq", "event-parse"):
        kind = QUEUE_KINDS.get(blocker.payload.get("queue", ""))
        if kind is None:
            raise ActionError(f"{work_key}: no indexer for queue {blocker.payload.get('queue')!r}")
        results = process_sqs_record(ctx, {"body": blocker.payload["body"], "messageId": work_key}, kind=kind,
                                     bucket=ctx.settings.bucket, queue=blocker.payload["queue"])
        outcome = _worst(results)
        detail = "; ".join(f"{r.work_key}: {r.outcome.value} {r.detail}".strip() for r in results)
    else:
        if blocker.kind not in RUNNERS:
            raise ActionError(f"{work_key}: kind {blocker.kind!r} cannot be retried from here")
        result = rerun(ctx, blocker, source=blocker.source)
        outcome, detail = result.outcome, result.detail
    if outcome in (Outcome.DONE, Outcome.NOOP_RESOLVED):
        ctx.blockers.transition(work_key, "resolved", who=who, action="retry", reason=outcome.value)
        return ActionResult(work_key, "retry", "resolved", detail or outcome.value)
    return ActionResult(work_key, "retry", OPEN, f"{outcome.value}: {detail}")


def _worst(results: list[WorkResult]) -> Outcome:
    order = [Outcome.BLOCKED, Outcome.RETRY_LATER, Outcome.DONE, Outcome.NOOP_RESOLVED]
    return min((r.outcome for r in results), key=order.index, default=Outcome.NOOP_RESOLVED)


def resume(ctx: WorkContext, work_key: str, *, who: str, action: str = "resume") -> ActionResult:
    blocker = ctx.blockers.get(work_key)
    if blocker.status != OPEN:
        raise ActionError(f"{work_key} is {blocker.status}, not open")
    detail = _send_back(ctx, blocker)
    ctx.budget.clear(f"{blocker.kind}:{blocker.object_key}")
    ctx.blockers.transition(work_key, "resumed", who=who, action=action, reason=detail)
    return ActionResult(work_key, action, "resumed", detail or "the worker will retry it")


def skip(ctx: WorkContext, work_key: str, *, who: str, reason: str) -> ActionResult:
    if not reason.strip():
        raise ActionError("skip needs a reason")
    blocker = ctx.blockers.get(work_key)
    if blocker.status != OPEN:
        raise ActionError(f"{work_key} is {blocker.status}, not open")
    ctx.blockers.transition(work_key, "skipped", who=who, reason=reason, action="skip")
    return ActionResult(work_key, "skip", "skipped", reason)


def redrive(ctx: WorkContext, *, who: str) -> list[ActionResult]:
    return [resume(ctx, b.work_key, who=who, action="redrive") for b in ctx.blockers.list(status=OPEN)
            if b.source == "dlq"]


__all__ = ["sweep_dlqs", "retry", "resume", "skip", "redrive", "ActionError", "ActionResult"]
