"""One reader of a time index's hour over v1 and v2 (docs/protocol.md §4.10, §9.1 V-D4, V-D7).

For (index, hour) — every part, or one part — :class:`HourReader` lists the v1 hour prefix (one
object per entry, as today) and each v2 part-hour prefix, reads the newest seal of a part-hour
(its tail, then its body: one ranged GET each, the tail alone when the seal is smaller than the
first tail read, three when the footer is longer than it) plus every segment of the part-hour not
in that seal's ``covers`` (one GET each), decodes them and folds the v2 entries (V-D7). A v1 object
counts by its key alone: its body is not read (V-D2 reads no record either), so an hour without v2
objects costs exactly its v1 listing — a LIST per 1,000 keys. Any refused object (V-D4, a bad
seal, two unequal entries) raises its :class:`~lightmetrics.protocol.errors.SegmentError` naming
the key: never skipped.

Where the parts come from: no part plan exists yet (slice 4 writes it), and P may differ between
hours, so the reader asks S3 which ``part=<pp>/`` prefixes exist under the index's v2 root — one
LIST delimited by ``/`` per index per reader, cached — and lists each of them for the hour. A
caller that knows its parts (the driver of a job that discovered them once) passes them instead.
With no v2 object anywhere that listing is empty and no hour pays anything for v2.

Example:
    >>> from lightmetrics.harness.testing.memory.object_store import InMemoryObjectStore
    >>> store = InMemoryObjectStore()
    >>> got = HourReader(store, KeyCodec()).read(SegmentIndex.ACCEPTED_BY_TIME, UtcHour(0))
    >>> got.ids(), dict(store.requests)
    (frozenset(), {'ListObjectsV2': 2})
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from lightmetrics.protocol.errors import KeyLayoutError, SealError, SegmentLayoutError
from lightmetrics.protocol.keys import KeyCodec, KeyKind, UtcHour
from lightmetrics.protocol.object_store import ObjectStore, TransientStoreError
from lightmetrics.protocol.seal import (
    TAIL_READ_BYTES,
    TRAILER,
    Seal,
    SealTailShort,
    check_seal_key,
    read_footer,
    read_seal,
)
from lightmetrics.protocol.segment_entries import (
    V2_ONLY_FIELDS,
    SegmentEntry,
    entry_manifest_id,
    fold_entries,
)
from lightmetrics.protocol.segment_keys import MAX_PARTS, SegmentIndex, SegmentKeyCodec
from lightmetrics.protocol.segments import decode_segment

#: the v1 key family listed for each v2 index
V1_KINDS = {SegmentIndex.ACCEPTED_BY_TIME: KeyKind.ACCEPTED_BY_TIME,
            SegmentIndex.RAW_BLOBS_BY_TIME: KeyKind.RAW_BLOBS_BY_TIME}


@dataclass(frozen=True)
class HourEntries:
    """What one hour (or one part-hour) of a time index holds, v1 and v2 together.

    ``v1_keys``: the v1 entry objects listed (bodies not read); ``entries``: the v2 entries folded
    (V-D7: one per entry key); ``v2_keys``: the seals and segments read; ``v2_listed``: every v2 key
    listed (older seal generations and covered segments included).
    """

    index: SegmentIndex
    hour: UtcHour
    v1_keys: tuple[str, ...]
    entries: tuple[SegmentEntry, ...]
    v2_keys: tuple[str, ...]
    v2_listed: tuple[str, ...]
    codec: KeyCodec

    def ids(self) -> frozenset[str]:
        """The union of v1 and v2: manifest-ids (``accepted-by-time``) or blob sha256s (``raw-blobs-by-time``)."""
        if self.index is SegmentIndex.ACCEPTED_BY_TIME:
            v1 = {p.identity.manifest_id for p in map(self.codec.parse, self.v1_keys) if p.identity is not None}
            v2 = {entry_manifest_id(self.codec, e) for e in self.entries}
        else:
            v1 = {p.sha256 for p in map(self.codec.parse, self.v1_keys) if p.sha256 is not None}
            v2 = {e.entry_key for e in self.entries}
        return frozenset(x for x in v1 | v2 if x is not None)


class HourReader:
    """Reads hours of ``accepted-by-time`` and ``raw-blobs-by-time`` through the object-store port."""

    def __init__(self, store: ObjectStore, codec: KeyCodec, *, parts: Sequence[int] | None = None) -> None:
        self.store, self.codec = store, codec
        self.keys = SegmentKeyCodec(codec.prefix)
        self._given = tuple(sorted(set(parts))) if parts is not None else None
        self._parts: dict[SegmentIndex, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def v2_parts(self, index: SegmentIndex) -> tuple[int, ...]:
        """The parts with any v2 object of ``index`` (any hour): one delimited LIST per index, cached.
        A prefix or key under the v2 root that is not ``part=<pp>/`` is refused (V-D4)."""
        index = SegmentIndex(index)
        if self._given is not None:
            return self._given
        with self._lock:
            if index not in self._parts:
                root = self.keys.root(index)
                found: list[int] = []
                token: str | None = None
                while True:
                    page = self.store.list_page(root, delimiter="/", continuation_token=token)
                    if page.keys:
                        raise SegmentLayoutError(page.keys[0], "key outside the layout: not under a part=<pp>/ prefix")
                    found.extend(_part_of_prefix(root, p) for p in page.prefixes)
                    token = page.next_token if page.truncated else None
                    if token is None:
                        break
                self._parts[index] = tuple(sorted(found))
            return self._parts[index]

    def read(self, index: SegmentIndex, hour: UtcHour, *, part: int | None = None, v1: bool = True) -> HourEntries:
        """The hour's entries: every part of it, or only ``part`` (``v1=False`` leaves out the v1
        listing, which is not split by part: a caller reading part by part lists it once)."""
        index = SegmentIndex(index)
        v1_keys = self._v1_keys(index, hour) if v1 else []
        parts = self.v2_parts(index) if part is None else (part,)
        sources: list[tuple[str, list[SegmentEntry], bool]] = []
        read: list[str] = []
        listed: list[str] = []
        for p in parts:
            got, keys = self._part_hour(index, hour, p)
            sources.extend(got)
            read.extend(dict.fromkeys(s[0] for s in got))
            listed.extend(keys)
        entries = fold_entries(sources)
        return HourEntries(index, hour, tuple(v1_keys), tuple(entries), tuple(read), tuple(listed), self.codec)

    def _v1_keys(self, index: SegmentIndex, hour: UtcHour) -> list[str]:
        kind = V1_KINDS[index]
        prefix = (self.codec.accepted_by_time_hour(hour) if kind is KeyKind.ACCEPTED_BY_TIME
                  else self.codec.raw_blobs_by_time_hour(hour))
        out = []
        for key in self.store.list_keys(prefix, limit=10**9):
            try:
                if self.codec.parse(key).kind is kind:
                    out.append(key)
            except KeyLayoutError:
                continue  # v1 as today: the audit and verify report keys outside the layout
        return out

    def _part_hour(self, index: SegmentIndex, hour: UtcHour,
                   part: int) -> tuple[list[tuple[str, list[SegmentEntry], bool]], list[str]]:
        prefix = self.keys.part_hour(index, part, hour)
        listed: list[tuple[str, int]] = []
        token: str | None = None
        while True:
            page = self.store.list_page(prefix, continuation_token=token)
            listed.extend(zip(page.keys, page.sizes))
            token = page.next_token if page.truncated else None
            if token is None:
                break
        return self.sources(listed), [k for k, _ in listed]

    def sources(self, listed: Sequence[tuple[str, int]]) -> list[tuple[str, list[SegmentEntry], bool]]:
        """The fold sources (:func:`fold_entries`) of one part-hour's listing ``(key, size)``: its
        newest seal and every segment the seal does not cover, read and checked (V-D4)."""
        seals: list[tuple[int, str, int]] = []
        segments: list[str] = []
        for key, size in listed:
            try:
                parsed = self.keys.parse(key)
            except KeyLayoutError as exc:
                raise SegmentLayoutError(key, f"key outside the layout: {exc}") from None
            if parsed.is_seal:
                seals.append((parsed.generation or 0, key, size))
            else:
                segments.append(key)
        sources: list[tuple[str, list[SegmentEntry], bool]] = []
        covers: frozenset[str] = frozenset()
        if seals:
            _, key, size = max(seals)  # the highest generation wins (§4.10); older ones are not read
            seal = self._read_seal(key, size)
            covers = frozenset(seal.covers)
            sources.extend(_seal_sources(key, seal))
        for key in segments:
            if key in covers:
                continue
            body = self.store.get(key)
            if body is None:
                raise TransientStoreError(f"{key}: listed but gone when read (retention of its hour?): read again")
            sources.append((key, list(decode_segment(self.codec, key, body).entries), False))
        return sources

    def _read_seal(self, key: str, size: int) -> Seal:
        """A seal by ranged GETs: the tail (footer), then the body before it, checked whole."""
        if size < TRAILER.size:
            raise SealError(key, "too short to be a seal")
        start = max(0, size - TAIL_READ_BYTES)
        tail = self._range(key, start, size)
        if start > 0:
            try:
                read_footer(key, tail)
            except SealTailShort as short:
                if short.needed > size:
                    raise SealError(key, f"the trailer names a footer longer than the seal ({size} bytes)") from None
                start = size - short.needed
                tail = self._range(key, start, size)
            footer_at, footer_len = TRAILER.unpack(tail[-TRAILER.size:])[:2]
            if footer_at + footer_len + TRAILER.size != size or footer_at < 1:
                raise SealError(key, "the trailer's footer offset and length are not the seal's size")
            tail = self._range(key, 0, footer_at) + tail[-(footer_len + TRAILER.size):]
        seal = read_seal(self.codec, key, tail)
        check_seal_key(self.codec, key, seal.footer)
        return seal

    def _range(self, key: str, start: int, end: int) -> bytes:
        data = self.store.get_range(key, start, end)
        if data is None:
            raise TransientStoreError(f"{key}: listed but gone when read (retention of its hour?): read again")
        return data


def _seal_sources(key: str, seal: Seal) -> list[tuple[str, list[SegmentEntry], bool]]:
    """A seal's entries as fold sources: those folded from v1 objects (no ``record_etag`` /
    ``version_id``) compare with others on the fields both have, as a v1 object does (V-D7)."""
    field = "record_etag" if seal.footer.index is SegmentIndex.ACCEPTED_BY_TIME else "version_id"
    assert field in V2_ONLY_FIELDS
    full = [e for e in seal.entries if getattr(e, field) is not None]
    from_v1 = [e for e in seal.entries if getattr(e, field) is None]
    return [(key, full, False), (key, from_v1, True)]


def _part_of_prefix(root: str, prefix: str) -> int:
    name = prefix[len(root):]
    digits = name.removeprefix("part=").removesuffix("/")
    if len(name) != len("part=00/") or not name.startswith("part=") or any(c not in "0123456789abcdef" for c in digits) \
            or int(digits, 16) >= MAX_PARTS:
        raise SegmentLayoutError(prefix, f"key outside the layout: {name!r} is not part=<pp>/ below {MAX_PARTS}")
    return int(digits, 16)


__all__ = ["HourEntries", "HourReader", "V1_KINDS"]
