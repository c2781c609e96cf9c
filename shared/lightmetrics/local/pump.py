"""Local stand-ins for Lambda's event source mappings and EventBridge schedules.

:class:`EventPump` polls each SQS queue and calls its handler with a Lambda SQS event (the same
record shape Lambda delivers), deletes what the handler acknowledged and leaves partial-batch
failures for redelivery — visibility timeouts, receive counts and the DLQ redrive are moto's
real SQS behaviour. The only liberty taken: a failed message is made visible again after
``retry_delay_s`` instead of the queue's full visibility timeout, so local runs converge fast.

:class:`Scheduler` calls scheduled handlers every ``interval_s`` with an EventBridge
``Scheduled Event``.

``drop`` is a chaos knob: a predicate on the message body; a matching message is deleted
without being delivered — exactly what a lost S3 event looks like downstream. ``duplicate`` is
another: a matching message is delivered twice (a second handler call with the same record), as
SQS's at-least-once delivery may do.

Example:
    >>> pump = EventPump(sqs, {"index-accepted": (url, arn, handler)}).start()   # doctest: +SKIP
    >>> drain(sqs, [url], timeout_s=30)                                          # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lightmetrics.aws.sqs_queues import queue_depth
from lightmetrics.local.function_host import LambdaContext
from lightmetrics.local.server import ACCOUNT_ID, REGION

LOG = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any], Any], Any]


@dataclass
class Route:
    queue_name: str
    url: str
    arn: str
    function_name: str
    handler: Handler
    #: the client this route polls and acknowledges with (Lambda's event source mapping uses the
    #: function's role); None: the pump's own
    sqs: Any = None
    #: the event source mapping's batch size (None: the pump's)
    batch_size: int | None = None
    #: whether ``drop`` and ``duplicate`` apply: they stand for lost and repeated S3 events, so only
    #: on the index queues, not on the reconciler's shards queue
    chaos: bool = True


def lambda_sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    """Messages from ReceiveMessage, in the shape Lambda's SQS event source delivers."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": {k: str(v) for k, v in m.get("Attributes", {}).items()},
                "messageAttributes": {},
                "md5OfBody": m.get("MD5OfBody") or hashlib.md5(m["Body"].encode()).hexdigest(),  # noqa: S324
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": REGION,
            }
            for m in messages
        ]
    }


class EventPump:
    def __init__(
        self,
        sqs: Any,
        routes: Iterable[Route],
        *,
        batch_size: int = 10,
        retry_delay_s: int = 1,
        drop: Callable[[str], bool] | None = None,
        duplicate: Callable[[str], bool] | None = None,
        pollers_per_queue: int = 4,
    ) -> None:
        self.sqs = sqs
        self.routes = list(routes)
        self.batch_size = batch_size
        self.retry_delay_s = retry_delay_s
        self.drop = drop
        self.duplicate = duplicate
        self.duplicated = 0
        # Lambda's SQS event source polls with several concurrent pollers; so do we, which also
        # keeps queues shallow (moto's ReceiveMessage scans every queued message).
        self.pollers_per_queue = pollers_per_queue
        self.dropped: list[str] = []
        self.delivered = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> "EventPump":
        for route in self.routes:
            for n in range(self.pollers_per_queue):
                t = threading.Thread(target=self._loop, args=(route,), daemon=True,
                                     name=f"lm-pump-{route.queue_name}-{n}")
                t.start()
                self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()

    def _loop(self, route: Route) -> None:
        while not self._stop.is_set():
            try:
                if not self.pump_once(route, wait_s=1):
                    self._stop.wait(0.05)
            except Exception as exc:  # the runtime stopping under us, or a handler crash
                if not self._stop.is_set():
                    LOG.warning("pump %s: %s", route.queue_name, exc)
                    self._stop.wait(0.5)

    def pump_once(self, route: Route, *, wait_s: int = 0) -> int:
        """Receive one batch and deliver it; returns how many messages were received."""
        sqs = route.sqs or self.sqs
        messages = sqs.receive_message(
            QueueUrl=route.url, MaxNumberOfMessages=route.batch_size or self.batch_size, WaitTimeSeconds=wait_s,
            AttributeNames=["All"]
        ).get("Messages", [])
        if not messages:
            return 0
        if self.drop is not None and route.chaos:
            keep = []
            for m in messages:
                if self.drop(m["Body"]):
                    sqs.delete_message(QueueUrl=route.url, ReceiptHandle=m["ReceiptHandle"])
                    with self._lock:
                        self.dropped.append(m["Body"])
                else:
                    keep.append(m)
            messages = keep
            if not messages:
                return 1
        if self.duplicate is not None and route.chaos:
            again = [m for m in messages if self.duplicate(m["Body"])]
            if again:
                try:  # the first delivery; its outcome is not acknowledged, as if the ack was lost
                    route.handler(lambda_sqs_event(again, route.arn), LambdaContext(route.function_name))
                except Exception as exc:
                    LOG.warning("%s failed on a duplicated delivery: %s", route.function_name, exc)
                with self._lock:
                    self.duplicated += len(again)
        failed: set[str] = {m["MessageId"] for m in messages}
        try:
            response = route.handler(lambda_sqs_event(messages, route.arn), LambdaContext(route.function_name))
            failures = (response or {}).get("batchItemFailures", [])
            failed = {f["itemIdentifier"] for f in failures}
        except Exception as exc:  # an unhandled error fails the whole batch, as on Lambda
            LOG.warning("%s failed on a batch of %d: %s", route.function_name, len(messages), exc)
        done = [m for m in messages if m["MessageId"] not in failed]
        if done:
            sqs.delete_message_batch(
                QueueUrl=route.url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)],
            )
        for m in messages:
            if m["MessageId"] in failed:
                sqs.change_message_visibility(
                    QueueUrl=route.url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=self.retry_delay_s
                )
        with self._lock:
            self.delivered += len(done)
        return len(messages)


def scheduled_event(rule: str) -> dict[str, Any]:
    return {
        "version": "0",
        "id": "local",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT_ID,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": REGION,
        "resources": [f"arn:aws:events:{REGION}:{ACCOUNT_ID}:rule/{rule}"],
        "detail": {},
    }


class Scheduler:
    """Runs ``handler(scheduled_event, context)`` for each job every ``interval_s`` seconds."""

    def __init__(self, jobs: Mapping[str, tuple[float, Handler]]) -> None:
        self.jobs = dict(jobs)
        self.runs: dict[str, int] = {name: 0 for name in self.jobs}
        self.last: dict[str, Any] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> "Scheduler":
        for name, (interval, handler) in self.jobs.items():
            t = threading.Thread(target=self._loop, args=(name, interval, handler), daemon=True,
                                 name=f"lm-schedule-{name}")
            t.start()
            self._threads.append(t)
        return self

    def run_now(self, name: str) -> Any:
        _interval, handler = self.jobs[name]
        result = handler(scheduled_event(name), LambdaContext(name))
        self.runs[name] += 1
        self.last[name] = result
        return result

    def _loop(self, name: str, interval: float, handler: Handler) -> None:
        while not self._stop.wait(interval):
            try:
                self.run_now(name)
            except Exception as exc:
                LOG.warning("scheduled %s failed: %s", name, exc)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        self._threads.clear()


def running_executions(sfn: Any, machines: Iterable[str] | None = None) -> int:
    """Running executions of ``machines`` (ARNs; default: every state machine, listed)."""
    arns = list(machines) if machines is not None else [
        m["stateMachineArn"] for m in sfn.list_state_machines().get("stateMachines", [])]
    return sum(len(sfn.list_executions(stateMachineArn=arn, statusFilter="RUNNING").get("executions", []))
               for arn in arns)


def drain(sqs: Any, urls: Iterable[str], *, sfn: Any = None, timeout_s: float = 60.0, settle_checks: int = 2,
          machines: Iterable[str] | None = None) -> bool:
    """Wait until every queue is empty (visible + in-flight = 0) and no execution (of ``machines``,
    default every state machine) runs."""
    urls = list(urls)
    machines = list(machines) if machines is not None else None
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while time.monotonic() < deadline:
        busy = any(queue_depth(sqs, u) for u in urls) or (sfn is not None and running_executions(sfn, machines) > 0)
        quiet = 0 if busy else quiet + 1
        if quiet >= settle_checks:
            return True
        time.sleep(0.2)
    return False
