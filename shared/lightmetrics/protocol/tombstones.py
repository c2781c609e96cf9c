"""A retention tombstone as the writers and GC see it (docs/protocol.md §16, rule D1): one HEAD per
hour per process and :data:`~lightmetrics.protocol.timing.TOMBSTONE_CACHE_S`, which retention's wait
before its first delete outlasts.

Example:
    >>> TombstoneCache(store, codec).is_tombstoned("raw", hour)      # doctest: +SKIP
    False
"""

from __future__ import annotations

import threading
import time

from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.timing import TOMBSTONE_CACHE_S


class TombstoneCache:
    """Is an hour under a retention tombstone? One HEAD per hour per process and ``ttl_s``.

    A tombstone is permanent once written, so a positive answer is cached forever; a negative
    answer is re-checked after ``ttl_s`` (the reaper waits longer than that before deleting).
    """

    def __init__(self, ctx_store, codec, ttl_s: float = TOMBSTONE_CACHE_S, now=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self.store, self.codec, self.ttl_s, self._now = ctx_store, codec, ttl_s, now
        self._known: dict[tuple[str, UtcHour], float | None] = {}
        self._lock = threading.Lock()

    def is_tombstoned(self, scope: str, hour: UtcHour) -> bool:
        # The HEAD happens under the lock: concurrent records of one hour share one lookup.
        with self._lock:
            if (scope, hour) in self._known:
                checked = self._known[(scope, hour)]
                if checked is None or self._now() - checked < self.ttl_s:
                    return checked is None
            present = self.store.head(self.codec.retention_tombstone(scope, hour)) is not None
            self._known[(scope, hour)] = None if present else self._now()
            return present


__all__ = ["TombstoneCache"]
