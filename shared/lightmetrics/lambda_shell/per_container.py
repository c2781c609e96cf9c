"""What a Lambda function builds once per container — settings, clients, its service — on first
use, from the environment: the one handler-state idiom of every function in ``functions/``.

Building on first use (not at import) lets a configuration error fail the invocation with its
message, and lets tests change the environment between cases (``reset``).

Example:
    >>> built = []
    >>> service = PerContainer(lambda: built.append("x") or len(built))
    >>> service(), service()
    (1, 1)
    >>> service.reset()
    >>> service()
    2
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class PerContainer(Generic[T]):
    """A value built by ``build`` on first call and kept until :meth:`reset` (thread-safe: the
    indexers call it from their record threads)."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._value: T | None = None
        self._lock = threading.Lock()

    def __call__(self) -> T:
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._build()
                value = self._value
        return value

    def reset(self) -> None:
        """Forget the value: the next call builds it again (tests change the environment)."""
        with self._lock:
            self._value = None


class LambdaHandler:
    """A handler built by a factory (the indexers', the walk's and the reap's tasks) together with
    its per-container state, so tests can :meth:`reset` it like a function module's ``reset``."""

    def __init__(self, fn: Callable[[dict[str, Any], Any], dict[str, Any]], state: PerContainer[Any]) -> None:
        functools.update_wrapper(self, fn)
        self._fn, self._state = fn, state

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        return self._fn(event, context)

    def reset(self) -> None:
        self._state.reset()


__all__ = ["LambdaHandler", "PerContainer"]
