"""Segment bodies of derived state v2 (docs/protocol.md §4.5, §9.1): encode, split, decode, refuse.

A segment holds the entries of one (index, part, hour), sorted and unique, as canonical JSON with
``schema`` first; its key is the sha256 of those bytes, so a body is verifiable from its key and a
retried PUT of the same body is the same key. A writer splits beyond 2,500 entries or 4 MiB, cutting
the sorted entries in order (deterministic). A reader refuses (V-D4, :class:`SegmentLayoutError`) a
key outside the layout, a body whose digest is not its key's, a body that does not parse, whose
index, hour or part differ from its key's, or an entry outside its part or hour; a newer schema is
an :class:`UnsupportedVersionError` (§17 E3); two unequal entries for one key are V-D7.

Example:
    >>> codec, h = KeyCodec(), UtcHour(0)
    >>> [seg] = encode_segments(codec, SegmentIndex.RAW_BLOBS_BY_TIME, h, 0, 1, [])
    >>> decode_segment(codec, seg.key, seg.body).entries
    ()
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from pydantic import ValidationError

from lightmetrics.protocol.errors import KeyLayoutError, ManifestError, SegmentLayoutError, UnsupportedVersionError
from lightmetrics.protocol.keys import KeyCodec, UtcHour
from lightmetrics.protocol.manifests import canonical_json, check_schema
from lightmetrics.protocol.segment_entries import (
    ENTRY_TYPES,
    SegmentEntry,
    check_entry,
    check_sorted_unique,
    check_writable,
    sorted_unique,
)
from lightmetrics.protocol.segment_keys import SegmentIndex, SegmentKeyCodec, validate_parts

SEGMENT_SCHEMAS: Final[dict[SegmentIndex, str]] = {
    SegmentIndex.ACCEPTED_BY_TIME: "lightmetrics.accepted_by_time_segment.v1",
    SegmentIndex.RAW_BLOBS_BY_TIME: "lightmetrics.raw_blobs_by_time_segment.v1",
}
MAX_SEGMENT_ENTRIES: Final = 2_500
MAX_SEGMENT_BYTES: Final = 4 * 1024 * 1024
_HEADER_FIELDS = ("schema", "index", "hour", "part", "parts", "writer")


@dataclass(frozen=True, slots=True)
class Segment:
    """A decoded, validated segment (or one about to be written: ``body`` are its exact bytes)."""

    key: str
    index: SegmentIndex
    hour: UtcHour
    part: int
    parts: int
    entries: tuple[SegmentEntry, ...]
    body: bytes


def _body(index: SegmentIndex, hour: UtcHour, part: int, parts: int, entries: list[SegmentEntry],
          writer: dict[str, str]) -> bytes:
    # canonical JSON (sorted keys) like every object: the digest is over these exact bytes
    return canonical_json({
        "schema": SEGMENT_SCHEMAS[index], "index": index.value, "hour": str(hour), "part": part, "parts": parts,
        "writer": writer, "entries": [e.model_dump(mode="json") for e in entries],
    })


def _cuts(entries: list[SegmentEntry], max_entries: int, max_bytes: int, overhead: int) -> list[list[SegmentEntry]]:
    """Sorted entries cut in order: each piece at most ``max_entries`` and ``max_bytes`` encoded."""
    pieces: list[list[SegmentEntry]] = [[]]
    size = overhead
    for entry in entries:
        cost = len(canonical_json(entry.model_dump(mode="json"))) + 1  # its bytes and a comma
        if pieces[-1] and (len(pieces[-1]) >= max_entries or size + cost > max_bytes):
            pieces.append([])
            size = overhead
        if overhead + cost > max_bytes:
            raise ValueError(f"entry {entry.entry_key} alone exceeds the segment size bound")
        pieces[-1].append(entry)
        size += cost
    return pieces


def encode_segments(codec: KeyCodec, index: SegmentIndex, hour: UtcHour, part: int, parts: int,
                    entries: Iterable[SegmentEntry], writer: dict[str, str] | None = None, *,
                    max_entries: int = MAX_SEGMENT_ENTRIES, max_bytes: int = MAX_SEGMENT_BYTES) -> list[Segment]:
    """The segments of ``entries`` for one (index, part, hour), keys and bytes, split deterministically.

    Every entry must belong to the part and hour (``ValueError`` otherwise: a writer groups first);
    equal duplicates are folded, unequal ones are a :class:`SegmentConflictError`. ``writer`` is
    informative (function, request id, build). No entries make one empty segment.
    """
    index, parts = SegmentIndex(index), validate_parts(parts)
    writer = dict(writer or {})
    keys = SegmentKeyCodec(codec.prefix)
    where = keys.part_hour(index, part, hour)
    items = sorted_unique(where, entries)
    check_writable(codec, index, hour, part, parts, items, where)
    overhead = len(_body(index, hour, part, parts, [], writer))
    out = []
    for piece in _cuts(items, max_entries, max_bytes, overhead):
        body = _body(index, hour, part, parts, piece, writer)
        key = keys.segment(index, part, hour, hashlib.sha256(body).hexdigest())
        out.append(Segment(key, index, hour, part, parts, tuple(piece), body))
    return out


def decode_segment(codec: KeyCodec, key: str, body: bytes) -> Segment:
    """Read and validate a stored segment against its key (every V-D4 refusal, V-D7 inside it)."""
    try:
        parsed = SegmentKeyCodec(codec.prefix).parse(key)
    except KeyLayoutError as exc:
        raise SegmentLayoutError(key, f"key outside the layout: {exc}") from None
    if parsed.is_seal:
        raise SegmentLayoutError(key, "a sealed part, not a segment (read it as a seal)")
    digest = hashlib.sha256(body).hexdigest()
    if digest != parsed.sha256:
        raise SegmentLayoutError(key, f"body sha256 {digest} is not the key's")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SegmentLayoutError(key, f"body is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise SegmentLayoutError(key, "body is not a JSON object")
    try:
        check_schema(doc.get("schema"), SEGMENT_SCHEMAS[parsed.index], key)
    except UnsupportedVersionError:
        raise
    except ManifestError as exc:
        raise SegmentLayoutError(key, str(exc).removeprefix(f"{key}: ")) from None
    header = {k: doc.get(k) for k in _HEADER_FIELDS}
    want = {"index": parsed.index.value, "hour": str(parsed.hour), "part": parsed.part}
    for field, value in want.items():
        if type(header[field]) is not type(value) or header[field] != value:  # true is not part 1
            raise SegmentLayoutError(key, f"body {field} {header[field]!r} is not the key's {value!r}")
    try:
        parts = validate_parts(header["parts"])
    except KeyLayoutError as exc:
        raise SegmentLayoutError(key, f"body {exc}") from None
    if parsed.part >= parts:
        raise SegmentLayoutError(key, f"part {parsed.part} is not below parts {parts}")
    entries = parse_entries(key, parsed.index, doc.get("entries"))
    check_sorted_unique(key, entries)
    for entry in entries:
        if (why := check_entry(codec, entry, parsed.hour, parsed.part, parts)) is not None:
            raise SegmentLayoutError(key, why)
    return Segment(key, parsed.index, parsed.hour, parsed.part, parts, tuple(entries), body)


def parse_entries(key: str, index: SegmentIndex, raw: object, *, allow_v1: bool = False) -> list[SegmentEntry]:
    """Entries of a v2 body or seal block; unknown fields ignored (§17 E2), the rest strict. Only a
    seal (``allow_v1``) holds entries folded from v1 objects: without a ``record_etag``."""
    if not isinstance(raw, list):
        raise SegmentLayoutError(key, "entries is not a list")
    typ = ENTRY_TYPES[index]
    known = set(typ.model_fields)
    out: list[SegmentEntry] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise SegmentLayoutError(key, f"entries[{i}] is not an object")
        try:
            entry = typ.model_validate({k: v for k, v in item.items() if k in known}, strict=True)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise SegmentLayoutError(key, f"entries[{i}].{where}: {first['msg']}") from None
        if not allow_v1 and getattr(entry, "record_etag", "") is None:
            raise SegmentLayoutError(key, f"entries[{i}].record_etag: a v2 entry carries the record's ETag")
        out.append(entry)
    return out
