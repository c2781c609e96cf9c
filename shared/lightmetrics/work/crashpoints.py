"""Named crash points: every step of a reap that a crash could interrupt has a name here.

Reap code calls :func:`point` between its durable steps. In production nothing is installed and
a point costs one dictionary lookup. Tests install a hook (:func:`hooked`) that raises
:class:`InjectedCrash` at a chosen point, kills the process, or parks a thread on an event (the
accept-vs-GC interleaving registry). Because every point must be :func:`register`-ed with its
description, the crash harness can assert that it exercised exactly :data:`REGISTRY` — a new
step without a crash test fails that assertion.

A test process can also exit at once (``os._exit(137)``, like a SIGKILL) at a point named by
``LM_CRASH_AT`` — :func:`lightmetrics.harness.testing.crashes.killed_at_from_env`, test code: nothing a
deployed function imports reads that variable.

Example:
    >>> register("demo.step", "a step of the example")
    'demo.step'
    >>> with hooked(lambda name: None):
    ...     point("demo.step")
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: point name -> what has happened durably when it is reached
REGISTRY: dict[str, str] = {}
_hook: Callable[[str], None] | None = None
_lock = threading.Lock()


class InjectedCrash(Exception):
    """Raised by a test hook at a crash point (the task dies there; Step Functions retries it)."""


def register(name: str, description: str) -> str:
    """Declare a crash point (module import time); returns ``name`` for use as a constant."""
    REGISTRY[name] = description
    return name


def point(name: str) -> None:
    """Reached crash point ``name``: run the installed hook, if any."""
    if name not in REGISTRY:
        raise KeyError(f"crash point {name!r} is not registered")
    hook = _hook
    if hook is not None:
        hook(name)


@contextmanager
def hooked(hook: Callable[[str], None]) -> Iterator[None]:
    """Install ``hook`` for the duration of the block (process-wide: worker threads see it too)."""
    global _hook
    with _lock:
        previous, _hook = _hook, hook
    try:
        yield
    finally:
        with _lock:
            _hook = previous


def crash_once_at(target: str) -> tuple[Callable[[str], None], set[str]]:
    """A hook that raises :class:`InjectedCrash` the first time ``target`` is reached, and the set
    of every point reached while it was installed."""
    seen: set[str] = set()
    fired: list[bool] = []

    def hook(name: str) -> None:
        seen.add(name)
        if name == target and not fired:
            fired.append(True)
            raise InjectedCrash(name)

    return hook, seen
