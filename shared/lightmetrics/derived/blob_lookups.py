"""Is a blob's hash in ``raw-blobs-by-time`` for an hour or the hour before? Two ways to ask (§9 D6).

:class:`IndexedBlobs` lists each hour once per reconciler run (one range: the whole hour);
:class:`HeadedBlobs` HEADs the entry per blob (a shard of one key range of an hour, protocol §12
R8). :func:`lightmetrics.derived.indexing.verify_time_entry` takes either.
"""

from __future__ import annotations

import threading

from lightmetrics.protocol.keys import UtcHour
from lightmetrics.work.units import WorkContext


class IndexedBlobs:
    """The blob hashes of ``raw-blobs-by-time`` hours, each hour listed at most once (one
    reconciler run). A hash listed there certifies its blob (§9 D6).

    Example:
        >>> blobs = IndexedBlobs(ctx)                                      # doctest: +SKIP
        >>> blobs.load(hour); blobs.load(hour + -1)                        # doctest: +SKIP
        >>> blobs.holds(sha, near=hour)                                    # doctest: +SKIP
        True
    """

    def __init__(self, ctx: WorkContext) -> None:
        self.ctx = ctx
        self._hours: dict[UtcHour, frozenset[str]] = {}
        self._loaded = 0
        self._pages = 0
        self._lock = threading.Lock()

    def load(self, hour: UtcHour) -> frozenset[str]:
        """List ``hour`` unless this run already did (one LIST per 1,000 entries, counted in
        :attr:`pages_listed`). A run scans hours in order and an hour needs only itself and the hour
        before, so older hours are dropped: memory stays two hours of hashes however many hours a
        run scans."""
        with self._lock:
            for old in [h for h in self._hours if h < hour + -1]:
                del self._hours[old]
            if hour not in self._hours:
                self._loaded += 1
                prefix = self.ctx.codec.raw_blobs_by_time_hour(hour)
                marker = prefix + "sha256="
                keys = self.ctx.store.list_keys(prefix, limit=10**9)
                self._pages += max(1, -(-len(keys) // 1000))  # ListObjectsV2 pages of 1,000 (an empty one is one)
                self._hours[hour] = frozenset(k[len(marker):-len(".json")] for k in keys
                                              if k.startswith(marker) and k.endswith(".json"))
            return self._hours[hour]

    def listed(self, hour: UtcHour) -> frozenset[str] | None:
        """The hashes of ``hour`` if this run listed it, else None (no request)."""
        with self._lock:
            return self._hours.get(hour)

    def holds(self, sha: str, *, near: UtcHour) -> bool:
        """Is ``sha`` indexed in hour ``near`` or the hour before (a blob is written before its
        record)? Only hours already listed are consulted: no request."""
        return any(sha in (self.listed(h) or ()) for h in (near, near + -1))

    def known(self, sha: str, hour: UtcHour) -> bool | None:
        """Whether this run saw ``sha`` indexed in ``hour`` (None: it did not list that hour)."""
        listed = self.listed(hour)
        return None if listed is None else sha in listed

    @property
    def hours_listed(self) -> int:
        with self._lock:
            return self._loaded

    @property
    def pages_listed(self) -> int:
        """ListObjectsV2 requests sent so far (the reconciler's page cap, protocol §12 R7)."""
        with self._lock:
            return self._pages


class HeadedBlobs:
    """The question :class:`IndexedBlobs` answers — is a blob's hash in ``raw-blobs-by-time`` for
    an hour or the hour before? — answered per entry by HEADs, for a reconciler shard that checks
    one key range of an hour (protocol §12 R8). Same interface; nothing is listed.

    :meth:`holds` HEADs ``raw-blobs-by-time/v1/<near>/sha256=<sha>.json`` and, only if absent, the
    same key in the hour before (a blob is written before its record): a healthy entry whose blob
    is in its own hour costs 1 GET (the record) + 1 HEAD, whatever the size of the blob index and
    however many shards there are (the arithmetic is in :mod:`lightmetrics.derived.indexing`'s docstring).

    Example:
        >>> blobs = HeadedBlobs(ctx)                                       # doctest: +SKIP
        >>> blobs.holds(sha, near=hour)                                    # doctest: +SKIP
        True
    """

    def __init__(self, ctx: WorkContext) -> None:
        self.ctx = ctx
        self._heads = 0
        self._answers: dict[tuple[UtcHour, str], bool] = {}  # what each HEAD said: the repair asks again
        self._lock = threading.Lock()

    def load(self, hour: UtcHour) -> frozenset[str]:
        """Nothing to list: every lookup is its own HEAD."""
        return frozenset()

    def holds(self, sha: str, *, near: UtcHour) -> bool:
        """Is ``sha`` indexed in hour ``near`` or the hour before? One HEAD, two if the first misses."""
        for hour in (near, near + -1):
            present = self.ctx.store.head(self.ctx.codec.raw_blobs_by_time(hour, sha)) is not None
            with self._lock:
                self._heads += 1
                self._answers[(hour, sha)] = present
            if present:
                return True
        return False

    def known(self, sha: str, hour: UtcHour) -> bool | None:
        """What this run's HEAD of ``sha`` in ``hour`` said (None: it sent none)."""
        with self._lock:
            return self._answers.get((hour, sha))

    @property
    def hours_listed(self) -> int:
        return 0

    @property
    def pages_listed(self) -> int:
        return 0

    @property
    def heads_sent(self) -> int:
        """HEADs :meth:`holds` sent so far."""
        with self._lock:
            return self._heads


__all__ = ["HeadedBlobs", "IndexedBlobs"]
