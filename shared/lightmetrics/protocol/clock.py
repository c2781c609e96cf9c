"""The one injectable clock of the system.

Production code asks a :class:`Clock` for the time instead of calling ``time.time_ns()``,
so tests and the demo can freeze or shift it (a local process's shifted clock comes from its
host, :mod:`lightmetrics.protocol.hosting`; deployed code never reads one from the environment).

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
from typing import Any, Protocol


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


def utc_text(unix_ns: Any) -> str | None:
    """The one way operators see a time: ``YYYY-MM-DD HH:MM:SSZ``; None for none (0 or None).

    >>> utc_text(1_764_000_000 * 10**9), utc_text(0)
    ('2025-11-24 16:00:00Z', None)
    """
    if not unix_ns:
        return None
    return datetime.fromtimestamp(int(unix_ns) / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


DEFAULT_CLOCK: Clock = SystemClock()
