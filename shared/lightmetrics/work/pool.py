"""Work fanned out to a thread pool, in the caller's context.

Each item runs in its own copy of the *caller's* ``contextvars`` context (a copy taken inside the
worker would be the worker thread's own): request counting per operation and the local runtime's
host override follow the work. Results come back in the items' order; when one item raises, the
items not yet started are cancelled, the ones already running end, and then the error goes up —
so a caller never returns while requests it started are still in flight.

Example:
    >>> from concurrent.futures import ThreadPoolExecutor
    >>> with ThreadPoolExecutor(4) as pool:
    ...     map_in_context(pool, lambda n: n * n, [1, 2, 3])
    [1, 4, 9]
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, wait
from typing import Any, TypeVar

T = TypeVar("T")


def map_in_context(pool: Executor, fn: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
    """``[fn(i) for i in items]`` on ``pool``, each in a copy of the caller's context."""
    futures = [pool.submit(contextvars.copy_context().run, fn, i) for i in items]
    try:
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        wait(futures)
        raise


__all__ = ["map_in_context"]
