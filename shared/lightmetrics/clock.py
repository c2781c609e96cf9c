"""The one injectable clock of the system.

Production code asks a :class:`Clock` for the time instead of calling ``time.time_ns()``,
so tests and the demo can freeze or shift it.

Example:
    >>> clock = FrozenClock(1_760_000_000_000_000_000)
    >>> clock.now_ns()
    1760000000000000000
    >>> clock.advance(seconds=1.5); clock.now_ns()
    1760000001500000000
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int:
        """Nanoseconds since the Unix epoch (UTC)."""
        ...


class SystemClock:
    """Wall-clock time of this machine."""

    def now_ns(self) -> int:
        return time.time_ns()


class OffsetClock:
    """System time shifted by a fixed offset (replaying a past day in a demo)."""

    def __init__(self, offset_ns: int) -> None:
        self.offset_ns = offset_ns

    def now_ns(self) -> int:
        return time.time_ns() + self.offset_ns


class FrozenClock:
    """A clock that moves only when told to; thread-safe."""

    def __init__(self, now_ns: int) -> None:
        self._now = now_ns
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 0.0, *, ns: int = 0) -> None:
        with self._lock:
            self._now += int(seconds * 1_000_000_000) + ns


def utc_datetime(unix_ns: int) -> datetime:
    return datetime.fromtimestamp(unix_ns // 1_000_000_000, tz=timezone.utc)


DEFAULT_CLOCK: Clock = SystemClock()

#: Demo and test runs only: shift a hosted process's clock by this many seconds (``lmctl demo``
#: makes its fresh orphans look older than the retry horizon to the reap tasks this way).
CLOCK_OFFSET_ENV = "LM_CLOCK_OFFSET_S"


def clock_from_env(env: dict[str, str] | None = None) -> Clock:
    """:data:`DEFAULT_CLOCK`, or an :class:`OffsetClock` when ``LM_CLOCK_OFFSET_S`` is set."""
    import os

    raw = (os.environ if env is None else env).get(CLOCK_OFFSET_ENV, "")
    return OffsetClock(int(float(raw) * 1_000_000_000)) if raw else DEFAULT_CLOCK
