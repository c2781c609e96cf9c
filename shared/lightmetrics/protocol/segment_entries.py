"""Entries of derived state v2 (docs/protocol.md §4.5, §9.1) and the fold readers use across sources.

An entry is a pure function of an immutable source (the acceptance record, a HEAD of the blob), so
a replay writes an equal entry into another segment: readers fold equal duplicates and refuse
unequal ones (V-D7). A v1 entry (one object per batch) maps into the same type with the fields it
lacks (``record_etag``, ``version_id``) set to None; the fold compares only the fields both have.

Example:
    >>> e = AcceptedSegmentEntry(manifest_key="accepted/v1/agent=61/boot=62/x.json", record_etag='"e"',
    ...     frame_sha256="0" * 64, raw_blob_key="raw-blobs/v1/x", frame_bytes=1, accepted_at_unix_ns=5)
    >>> fold_entries([("seg-a", [e], False), ("seg-b", [e], False)]) == [e]
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Union

from pydantic import Field

from lightmetrics.protocol.derived_entries import AcceptedByTimeEntry, RawBlobsByTimeEntry
from lightmetrics.protocol.errors import KeyLayoutError, SegmentConflictError, SegmentLayoutError
from lightmetrics.protocol.keys import KeyCodec, KeyKind, UtcHour
from lightmetrics.protocol.manifests import CanonicalModel
from lightmetrics.protocol.segment_keys import SegmentIndex, manifest_id_of, part_of

_Sha = Field(pattern=r"^[0-9a-f]{64}$")
_Seq = Field(ge=0, le=2**64 - 1)


class AcceptedSegmentEntry(CanonicalModel):
    """One record in an ``accepted-by-time`` v2 segment: the record's fields and its ETag (V-D2)."""

    manifest_key: str
    record_etag: str | None  # None only for an entry read from a v1 object (it never had one)
    frame_sha256: str = _Sha
    raw_blob_key: str
    frame_bytes: int = Field(ge=0)
    accepted_at_unix_ns: int = Field(ge=0)

    @property
    def entry_key(self) -> str:
        return self.manifest_key

    @classmethod
    def from_v1(cls, v1: AcceptedByTimeEntry) -> "AcceptedSegmentEntry":
        fields = v1.model_dump(exclude={"schema_"})
        return cls(record_etag=None, **fields)


class RawBlobSegmentEntry(CanonicalModel):
    """One blob in a ``raw-blobs-by-time`` v2 segment: what the writer's HEAD saw (V-D6)."""

    raw_blob_key: str
    sha256: str = _Sha
    size: int = Field(ge=0)
    last_modified_unix_s: int = Field(ge=0)
    version_id: str | None  # None: an unversioned bucket, or an entry read from a v1 object
    agent_hex: str | None
    boot_hex: str | None
    seq_start: int | None = _Seq
    seq_end: int | None = _Seq

    @property
    def entry_key(self) -> str:
        return self.sha256

    @classmethod
    def from_v1(cls, v1: RawBlobsByTimeEntry) -> "RawBlobSegmentEntry":
        return cls(version_id=None, **v1.model_dump(exclude={"schema_"}))


SegmentEntry = Union[AcceptedSegmentEntry, RawBlobSegmentEntry]

ENTRY_TYPES: dict[SegmentIndex, type[AcceptedSegmentEntry] | type[RawBlobSegmentEntry]] = {
    SegmentIndex.ACCEPTED_BY_TIME: AcceptedSegmentEntry,
    SegmentIndex.RAW_BLOBS_BY_TIME: RawBlobSegmentEntry,
}

#: Fields a v1 entry does not have: the fold does not compare them against a v1 source.
V2_ONLY_FIELDS = frozenset({"record_etag", "version_id"})


def entry_hour(entry: SegmentEntry) -> UtcHour:
    """The hour an entry belongs to: the record's acceptance, the blob's ``LastModified`` (data)."""
    if isinstance(entry, AcceptedSegmentEntry):
        return UtcHour.of_unix_ns(entry.accepted_at_unix_ns)
    return UtcHour((entry.last_modified_unix_s // 3600) * 3600)


def entry_manifest_id(codec: KeyCodec, entry: SegmentEntry) -> str | None:
    """The manifest-id that decides an entry's part; None for a blob without identity metadata."""
    if isinstance(entry, AcceptedSegmentEntry):
        parsed = codec.parse(entry.manifest_key)
        if parsed.kind is not KeyKind.ACCEPTED or parsed.identity is None:
            raise KeyLayoutError(f"manifest_key {entry.manifest_key!r} is not an acceptance record key")
        return parsed.identity.manifest_id
    ident = (entry.agent_hex, entry.boot_hex, entry.seq_start, entry.seq_end)
    if all(v is None for v in ident):
        return None
    if any(v is None for v in ident):
        raise KeyLayoutError("identity metadata must be all present or all absent")
    return manifest_id_of(*ident)  # type: ignore[arg-type]


def entry_part(codec: KeyCodec, entry: SegmentEntry, parts: int) -> int:
    """The part of ``entry`` among ``parts``; a blob without identity metadata is in part 0."""
    mid = entry_manifest_id(codec, entry)
    return 0 if mid is None else part_of(mid, parts)


def check_entry(codec: KeyCodec, entry: SegmentEntry, hour: UtcHour, part: int, parts: int) -> str | None:
    """Why ``entry`` does not belong to (hour, part) of ``parts``, or None if it does (V-D4)."""
    try:
        blob_key = entry.raw_blob_key
        sha = entry.frame_sha256 if isinstance(entry, AcceptedSegmentEntry) else entry.sha256
        if blob_key != codec.raw_blob(sha):
            return f"entry {entry.entry_key}: raw_blob_key {blob_key!r} is not the blob of its sha256"
        got_part = entry_part(codec, entry, parts)
    except KeyLayoutError as exc:
        return f"entry {entry.entry_key}: {exc}"
    if entry_hour(entry) != hour:
        return f"entry {entry.entry_key}: hour {entry_hour(entry)} is not the segment's hour {hour}"
    if got_part != part:
        return f"entry {entry.entry_key}: part {got_part} of {parts} is not the segment's part {part}"
    return None


def check_writable(codec: KeyCodec, index: SegmentIndex, hour: UtcHour, part: int, parts: int,
                   entries: Iterable[SegmentEntry], where: str, *, allow_v1: bool = False) -> None:
    """A writer's check before it writes a segment or a seal: every entry of the index's type, of
    the part and hour, with its ``record_etag`` (unless folded from v1: seals only). ``ValueError``
    otherwise — a writer groups its entries first, so this is a bug, never a reader's refusal."""
    typ = ENTRY_TYPES[index]
    for entry in entries:
        if type(entry) is not typ:
            raise ValueError(f"{where}: a {type(entry).__name__} in a {index.value} object")
        if not allow_v1 and getattr(entry, "record_etag", "") is None:
            raise ValueError(f"{where}: entry {entry.entry_key} has no record_etag (a v2 writer reads it)")
        if (why := check_entry(codec, entry, hour, part, parts)) is not None:
            raise ValueError(f"{where}: {why}")


def _agree(a: SegmentEntry, b: SegmentEntry, either_v1: bool) -> bool:
    if not either_v1:
        return a == b
    skip = set(V2_ONLY_FIELDS)
    return a.model_dump(exclude=skip) == b.model_dump(exclude=skip)


def fold_entries(sources: Iterable[tuple[str, Iterable[SegmentEntry], bool]]) -> list[SegmentEntry]:
    """The deduplicated union of ``(source key, entries, is_v1)`` sources, sorted by entry key.

    Equal duplicates fold into one (a v2 entry is kept over a v1 one: it carries more); two unequal
    entries for one key raise :class:`SegmentConflictError` naming both sources (V-D7), never "pick one".
    """
    kept: dict[str, tuple[SegmentEntry, str, bool]] = {}
    for source, entries, is_v1 in sources:
        for entry in entries:
            have = kept.get(entry.entry_key)
            if have is None:
                kept[entry.entry_key] = (entry, source, is_v1)
                continue
            other, other_source, other_v1 = have
            if type(other) is not type(entry) or not _agree(other, entry, is_v1 or other_v1):
                raise SegmentConflictError(source, f"entry {entry.entry_key} differs from an entry for the same key",
                                           other_source)
            if other_v1 and not is_v1:
                kept[entry.entry_key] = (entry, source, is_v1)
    return [kept[k][0] for k in sorted(kept)]


def sorted_unique(key: str, entries: Iterable[SegmentEntry]) -> list[SegmentEntry]:
    """``entries`` sorted by entry key with equal duplicates dropped; unequal ones are a conflict."""
    return fold_entries([(key, entries, False)])


def check_sorted_unique(key: str, entries: list[SegmentEntry]) -> None:
    """A stored segment or block holds its entries sorted by entry key, each key once (V-D4, V-D7)."""
    for prev, cur in zip(entries, entries[1:]):
        if prev.entry_key == cur.entry_key and prev != cur:
            raise SegmentConflictError(key, f"two unequal entries for {cur.entry_key}", key)
        if prev.entry_key >= cur.entry_key:
            raise SegmentLayoutError(key, f"entries not sorted and unique at {cur.entry_key}")
