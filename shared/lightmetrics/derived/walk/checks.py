"""What a page checks per acceptance record (docs/protocol.md §13 W4, W5): an acceptance record
needs a repair only when its ``accepted-by-time`` entry is missing, and a record of a reaped hour
is not probed at all. Its candidate hours come from the listed ``LastModified`` and a margin
(rule W4); per group of entries, one listing when it is cheaper than a HEAD each (rule W5).

W5 over v1 and v2 (docs/protocol.md §9.1): an entry counts when it is a v1 object **or** an entry
of a v2 segment or seal of a candidate hour. v1 is probed first, so a page whose entries are all
v1 objects costs exactly what it cost before v2: one tombstone HEAD per new hour per process, a
``ListObjectsV2`` per (hour, boot) group of 13 keys or more, a HEAD per other key. Only a key
absent from v1 reads v2: the parts that exist (one delimited LIST of ``accepted-by-time/v2/`` per
walk epoch per warm container, ``WalkJob.v2_parts``: in a v1-only bucket the only extra request,
and only once a key is repaired anyway), then each (candidate hour, part) once per page through
:class:`~lightmetrics.derived.hour_entries.HourReader`: a LIST of the part-hour, its newest seal
(2 ranged GETs), a GET per segment the seal does not cover. The parts read for a key are those it
falls in under any P (``part_of(id, P)``, P = 1 … 64) that exist. A refused v2 object (V-D4, V-D7,
a newer version) is never "absent": :meth:`RecordChecks.refusal` names it and the page makes it a
blocker of its kind (work key ``segment:<key>``) instead of repairing the record over it.

Example::

    >>> [str(h) for h in candidate_hours(3600 * 10**9 - 10**9, 121 * 10**9)]
    ['1970-01-01T00', '1970-01-01T01']
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from lightmetrics.deployment.pricing import PRICE_TABLE
from lightmetrics.deployment.timeouts import longest_accept_s
from lightmetrics.derived.hour_entries import HourReader
from lightmetrics.derived.indexing import tombstones
from lightmetrics.protocol.errors import KeyLayoutError, SegmentError, SegmentLayoutError, UnsupportedVersionError
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.protocol.object_store import TransientStoreError
from lightmetrics.protocol.segment_keys import MAX_PARTS, SegmentIndex, part_of

if TYPE_CHECKING:
    from lightmetrics.derived.walk.walker_base import WalkJob

_NS = 1_000_000_000


def boundary_margin_ns(settings: Any) -> int:
    """Rule W4: how far a record's ``accepted_at_unix_ns`` (the ingest host's clock, taken before its
    create) may lie from the record's listed ``LastModified`` (S3's clock when the create began,
    whole seconds): the longest accept (the ingest function's timeout) plus ``LM_CLOCK_SKEW_S``,
    plus the second ``LastModified`` truncates. Rule H1 (docs/protocol.md §15) uses the same bound.

    >>> boundary_margin_ns(type("S", (), {"clock_skew_s": 60})()) // 1_000_000_000
    121
    """
    return (longest_accept_s() + int(settings.clock_skew_s) + 1) * _NS


def candidate_hours(last_modified_ns: int, margin_ns: int) -> list[UtcHour]:
    """The hours a record listed with ``last_modified_ns`` can have been accepted in (rule W4): the
    hour of its ``LastModified`` first, then the adjacent hour when that lies within the margin.

    >>> [str(h) for h in candidate_hours(3600 * 10**9 - 10**9, 121 * 10**9)]
    ['1970-01-01T00', '1970-01-01T01']
    """
    own = UtcHour.of_unix_ns(last_modified_ns)
    out = [own]
    for edge in (last_modified_ns - margin_ns, last_modified_ns + margin_ns):
        hour = UtcHour.of_unix_ns(edge)
        if hour not in out:
            out.append(hour)
    return out


def candidate_parts(manifest_id: str, existing: tuple[int, ...]) -> list[int]:
    """The parts of ``existing`` an entry of ``manifest_id`` can be in, whatever P its hour used:
    ``part_of(manifest_id, P)`` for every P from 1 to 64 (top bits: the parts nest).

    >>> candidate_parts("61.62.00000000000000000001-00000000000000000002", (0, 1, 2, 3, 5))
    [0, 1, 2]
    """
    parts, out = 1, set()
    while parts <= MAX_PARTS:
        out.add(part_of(manifest_id, parts))
        parts *= 2
    return sorted(out & set(existing))


def list_beats_heads(entries: int) -> bool:
    """Whether one ``ListObjectsV2`` (billed like a PUT: 12.5 HEADs at list prices) is cheaper than a
    HEAD for each of ``entries`` index entries (rule W5)."""
    return entries * PRICE_TABLE.price("s3.get_per_1000") > PRICE_TABLE.price("s3.put_per_1000")


class RecordChecks:
    """Which acceptance records of one page need a repair (docs/protocol.md §13 W4, W5).

    Built from the page's keys and their listed ``LastModified``: every candidate hour (rule W4)
    gets its retention tombstone checked (``indexing.tombstones``: one HEAD per hour per process);
    a key all of whose candidate hours are tombstoned is ``reaped`` and never probed. For the rest,
    per (hour, boot) group, one ``ListObjectsV2`` of ``accepted-by-time/v1/<hour>/<agent>.<boot>.``
    when that is cheaper than a HEAD per key (:func:`list_beats_heads`), done here; else
    :meth:`settle` HEADs the key's entry in each open candidate hour. A key whose entry is found is
    ``present``; a key absent from v1 is looked up in v2 (module docstring); :meth:`settle`
    returns None for a key to repair in full, or to block when :meth:`refusal` names a refused v2
    object. A key outside the layout is never settled here: its repair makes it a blocker.

    Example (inside ``Walker.page``)::

        >>> checks = RecordChecks(walker, [(key, last_modified_ns)])           # doctest: +SKIP
        >>> checks.settle(key)                                                 # doctest: +SKIP
        'present'
    """

    def __init__(self, walker: "WalkJob", listed: list[tuple[str, int]], *, epoch: int | None = None) -> None:
        self.walker, self.epoch = walker, epoch
        self.store, self.codec = walker.ctx.store, walker.codec
        codec = self.codec
        margin = boundary_margin_ns(walker.settings)
        cache = tombstones(walker.ctx)
        self.reaped: set[str] = set()
        #: key -> its entry key in each open candidate hour, with that hour's group prefix
        self.entries: dict[str, list[tuple[str, str]]] = {}
        #: key -> (its manifest-id, its open candidate hours): what a v2 lookup needs
        self.v2_ask: dict[str, tuple[str, list[UtcHour]]] = {}
        self._reader = HourReader(self.store, codec)
        #: (hour, part) -> the manifest-ids of its v2 entries, or the refusal reading it raised
        self._v2: dict[tuple[UtcHour, int], frozenset[str] | SegmentError] = {}
        self._v2_locks: dict[tuple[UtcHour, int], threading.Lock] = defaultdict(threading.Lock)
        self._lock = threading.Lock()
        self._refused: dict[str, SegmentError] = {}
        groups: dict[str, list[str]] = defaultdict(list)
        for key, last_modified in listed:
            try:
                parsed = codec.parse(key)
            except KeyLayoutError:
                continue
            if parsed.kind is not KeyKind.ACCEPTED or parsed.identity is None:
                continue
            ident = parsed.identity
            hours = [h for h in candidate_hours(last_modified, margin) if not cache.is_tombstoned("raw", h)]
            if not hours:
                self.reaped.add(key)  # every hour it can belong to is reaped (or being reaped): D1
                continue
            self.entries[key] = []
            self.v2_ask[key] = (ident.manifest_id, hours)
            for hour in hours:
                prefix = f"{codec.accepted_by_time_hour(hour)}{ident.agent_hex}.{ident.boot_hex}."
                entry = codec.accepted_by_time(hour, ident)
                self.entries[key].append((prefix, entry))
                groups[prefix].append(entry)
        #: group prefix -> the entries its LIST found (only groups that were listed)
        self.listed: dict[str, set[str]] = {}
        for prefix, entries in groups.items():
            if list_beats_heads(len(entries)):
                try:
                    self.listed[prefix] = self._list(prefix, min(entries), max(entries))
                except TransientStoreError:
                    pass  # HEAD them instead; a failing HEAD leaves the key to its full repair

    def _list(self, prefix: str, first: str, last: str) -> set[str]:
        """The entries under ``prefix`` from ``first`` to ``last``: entry names sort like the records'
        keys (fixed-width sequence numbers), so one page's keys span at most one page of entries."""
        found: set[str] = set()
        after = first[:-1]  # a proper prefix of ``first``: sorts right before it
        while True:
            page = self.store.list_page(prefix, max_keys=1000, start_after=after)
            found.update(page.keys)
            if not page.truncated or not page.keys or page.keys[-1] >= last:
                return found
            after = page.keys[-1]

    def settle(self, key: str) -> str | None:
        """``"reaped"``, ``"present"``, or None: repair ``key`` in full (unless :meth:`refusal`)."""
        if key in self.reaped:
            return "reaped"
        candidates = self.entries.get(key)
        if candidates is None:
            return None
        if any(entry in self.listed[prefix] for prefix, entry in candidates if prefix in self.listed):
            return "present"
        for prefix, entry in candidates:
            if prefix in self.listed:
                continue
            try:
                if self.store.head(entry) is not None:
                    return "present"
            except TransientStoreError:
                pass  # not known absent: v2 is still read, so a refused object there is not written over
        try:
            return "present" if self._in_v2(key) else None
        except TransientStoreError:
            return None

    def refusal(self, key: str) -> SegmentError | None:
        """The refused v2 object (V-D4, V-D7) of a candidate part-hour of ``key`` that :meth:`settle`
        met, if any: the record must not be repaired over it; the object is the blocker."""
        return self._refused.get(key)

    def _in_v2(self, key: str) -> bool:
        manifest_id, hours = self.v2_ask[key]
        try:
            existing = self._reader.v2_parts(SegmentIndex.ACCEPTED_BY_TIME) if self.epoch is None \
                else self.walker.v2_parts(self.epoch)
        except SegmentError as exc:
            self._refused[key] = exc
            return False
        found = False
        for hour in hours:
            for part in candidate_parts(manifest_id, existing):
                got = self._part_hour(hour, part)
                if isinstance(got, SegmentError):
                    self._refused[key] = got  # refusal first: never "present" past a refused object
                    return False
                found = found or manifest_id in got
        return found

    def _part_hour(self, hour: UtcHour, part: int) -> frozenset[str] | SegmentError:
        """The manifest-ids of (hour, part)'s v2 entries, read once per page (cached)."""
        with self._lock:
            lock = self._v2_locks[(hour, part)]
        with lock:
            if (hour, part) not in self._v2:
                index = SegmentIndex.ACCEPTED_BY_TIME
                try:
                    got: frozenset[str] | SegmentError = self._reader.read(index, hour, part=part, v1=False).ids()
                except SegmentError as exc:
                    got = exc
                except UnsupportedVersionError as exc:  # a newer writer's object: refused all the same
                    got = SegmentLayoutError(self._reader.keys.part_hour(index, part, hour), f"unsupported version: {exc}")
                self._v2[(hour, part)] = got
            return self._v2[(hour, part)]


__all__ = ["RecordChecks", "boundary_margin_ns", "candidate_hours", "candidate_parts", "list_beats_heads"]
