"""Counts the requests a boto3 client sends, per logical operation.

The cost contract is measured, not timed: attach a :class:`RequestCounter` to the S3 (and
DynamoDB) clients, wrap each logical operation in :meth:`RequestCounter.operation`, and read the
exact number of HTTP attempts it made. The hook sits on botocore's ``before-send`` event, so
retries and requests answered by an injected fault count too.

Example:
    >>> counter = RequestCounter()
    >>> counter.attach(s3_client)                                        # doctest: +SKIP
    >>> with counter.operation("accept") as op:                          # doctest: +SKIP
    ...     accept_batch(...)
    >>> op.total, op.by_api                                              # doctest: +SKIP
    (2, {'s3.PutObject': 2})
"""

from __future__ import annotations

import contextvars
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class OperationCount:
    """Requests made by one logical operation (one thread, one ``with`` block)."""

    name: str
    by_api: Counter[str] = field(default_factory=Counter)
    #: Attempts that got no answer (a timeout, a reset connection): already in ``by_api``. A busy
    #: machine makes them; a caller's retry then sends the same request again.
    unanswered_by_api: Counter[str] = field(default_factory=Counter)

    def answered(self) -> Counter[str]:
        """``by_api`` less the attempts that got no answer: the requests the operation's logic made."""
        return self.by_api - self.unanswered_by_api

    @property
    def total(self) -> int:
        return sum(self.by_api.values())


class RequestCounter:
    """Thread-safe request counter for any number of boto3 clients."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # A context variable, not a thread-local: work fanned out to a pool with
        # ``contextvars.copy_context().run`` is still counted against its operation.
        self._current: contextvars.ContextVar[OperationCount | None] = contextvars.ContextVar(
            f"lm-request-counter-{id(self)}", default=None
        )
        self.totals: Counter[str] = Counter()
        self.operations: Counter[str] = Counter()
        self.requests_by_operation: Counter[str] = Counter()

    def attach(self, client: Any) -> Any:
        client.meta.events.register("before-send", self._on_send)
        client.meta.events.register("after-call-error", self._on_unanswered)
        return client

    def _on_send(self, event_name: str = "", **_kwargs: Any) -> None:
        # event_name looks like "before-send.s3.PutObject"
        parts = event_name.split(".")
        api = ".".join(parts[1:3]) if len(parts) >= 3 else event_name
        op = self._current.get()
        with self._lock:
            self.totals[api] += 1
            if op is not None:
                op.by_api[api] += 1
                self.requests_by_operation[op.name] += 1

    def _on_unanswered(self, event_name: str = "", **_kwargs: Any) -> None:
        # event_name looks like "after-call-error.s3.ListObjectsV2"
        parts = event_name.split(".")
        api = ".".join(parts[1:3]) if len(parts) >= 3 else event_name
        op = self._current.get()
        if op is not None:
            with self._lock:
                op.unanswered_by_api[api] += 1

    @contextmanager
    def operation(self, name: str) -> Iterator[OperationCount]:
        op = OperationCount(name)
        token = self._current.set(op)
        try:
            yield op
        finally:
            self._current.reset(token)
            with self._lock:
                self.operations[name] += 1

    def per_operation(self, name: str) -> float:
        """Mean requests per completed operation ``name``."""
        with self._lock:
            n = self.operations[name]
            return self.requests_by_operation[name] / n if n else 0.0
