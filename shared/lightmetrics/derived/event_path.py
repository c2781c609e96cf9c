"""The event path: S3 ObjectCreated notifications, delivered through SQS, into the indexers.

Parsing is defensive (docs/protocol.md §10): an SQS body may be an S3 notification with any number of
records, the ``s3:TestEvent`` S3 sends when notifications are configured, or garbage. Keys are
URL-encoded in notifications (``+`` for space). A key outside the layout, or of a kind this
queue does not carry, is not dropped: it becomes a blocker so an operator sees it.

Example:
    >>> results = process_sqs_record(ctx, record, kind="index-accepted")        # doctest: +SKIP
    >>> [r.outcome for r in results]                                             # doctest: +SKIP
    [<Outcome.DONE: 'DONE'>]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from lightmetrics.derived.indexing import KIND_FOR_KEY, RUNNERS
from lightmetrics.protocol.errors import KeyLayoutError
from lightmetrics.work.outcome import Outcome, PermanentWorkError, WorkResult
from lightmetrics.work.units import WorkContext, run_unit


@dataclass(frozen=True)
class ObjectCreated:
    bucket: str
    key: str


def parse_notification(body: str) -> list[ObjectCreated] | None:
    """The created objects in one SQS message body; None for ``s3:TestEvent``.

    Raises PermanentWorkError for a body that is not an S3 notification.
    """
    try:
        doc = json.loads(body)
    except (TypeError, ValueError):
        raise PermanentWorkError("message body is not JSON", kind="event-parse") from None
    if not isinstance(doc, dict):
        raise PermanentWorkError("message body is not a JSON object", kind="event-parse")
    if doc.get("Event") == "s3:TestEvent":
        return None
    records = doc.get("Records")
    if not isinstance(records, list):
        raise PermanentWorkError("message is not an S3 notification (no Records)", kind="event-parse")
    out = []
    for rec in records:
        try:
            if not str(rec.get("eventName", "")).startswith("ObjectCreated"):
                continue  # we subscribe to creates only; anything else is not ours to index
            out.append(ObjectCreated(rec["s3"]["bucket"]["name"], unquote_plus(rec["s3"]["object"]["key"])))
        except (AttributeError, KeyError, TypeError):
            raise PermanentWorkError("S3 record without bucket/key", kind="event-parse") from None
    return out


def process_sqs_record(ctx: WorkContext, record: dict[str, Any], *, kind: str, bucket: str,
                       queue: str = "") -> list[WorkResult]:
    """Run every object of one SQS message through the indexer for ``kind``."""
    body = record.get("body", "")
    message_key = f"sqs:{queue}:{record.get('messageId', '?')}"
    previously_failed = int(record.get("attributes", {}).get("ApproximateReceiveCount", "1")) > 1
    payload = {"queue": queue, "body": body}
    try:
        objects = parse_notification(body)
    except PermanentWorkError as exc:
        error = exc  # the closure outlives the except block's name

        def poisoned() -> Outcome:
            raise error
        return [run_unit(ctx, kind="event-parse", object_key=message_key, source="event", fn=poisoned,
                         payload=payload)]
    if objects is None:
        return [WorkResult(Outcome.NOOP_RESOLVED, message_key, "s3:TestEvent")]
    results = []
    for obj in objects:
        results.append(_one(ctx, obj, kind, bucket, payload, previously_failed))
    return results


def _one(ctx: WorkContext, obj: ObjectCreated, kind: str, bucket: str, payload: dict[str, Any],
         previously_failed: bool) -> WorkResult:
    def work() -> Outcome:
        if obj.bucket != bucket:
            raise PermanentWorkError(f"event for bucket {obj.bucket}, this indexer serves {bucket}", kind="event-parse")
        try:
            parsed = ctx.codec.parse(obj.key)
        except KeyLayoutError as exc:
            raise PermanentWorkError(str(exc), kind="layout") from None
        if KIND_FOR_KEY.get(parsed.kind) != kind:
            raise PermanentWorkError(f"{obj.key} ({parsed.kind.value}) does not belong on the {kind} queue",
                                     kind="layout")
        return RUNNERS[kind](ctx, obj.key)

    return run_unit(ctx, kind=kind, object_key=obj.key, source="event", fn=work, payload=payload,
                    previously_failed=previously_failed)
