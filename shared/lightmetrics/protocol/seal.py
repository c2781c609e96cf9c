"""The sealed-part format ``.lmseal`` v1 (docs/protocol.md §4.5): an hour-part's entries, folded.

Layout (pure bytes; integers big-endian)::

    header   b"LMSEAL" + u16 version (1)
    blocks   zstd frames, each the canonical JSON array of at most 4,096 entries, sorted by entry key
    covers   a zstd frame: the canonical JSON array of the segment and v1 keys folded in, sorted
    footer   canonical JSON: index, hour, part, parts, generation, entries (the count), covers
             {offset, length, count, sha256}, blocks [{first_key, last_key, offset, length, entries,
             sha256}], body_sha256 (of every byte before the footer)
    trailer  u64 footer offset, u64 footer length, 32-byte footer sha256, b"LMSEAL", u16 version

A reader of one entry makes two ranged reads: the tail (:func:`read_footer`; the trailer says how
long the footer is, so a too-short tail is answered with the exact length to read,
:class:`SealTailShort`) and the one block :meth:`SealFooter.lookup` names (:func:`read_block`).
The covered keys are a section of their own (:func:`read_covers`), just before the footer: at
10,000 batches/s a part-hour folds ~14,400 segments, ~1.9 MB of keys a lookup must not read.
Wrong magic, an unknown version, a bad checksum, unsorted entries are refused with typed errors.

Example:
    >>> data = write_seal(KeyCodec(), SegmentIndex.RAW_BLOBS_BY_TIME, UtcHour(0), 0, 1, 0, [], covers=[])
    >>> read_seal(KeyCodec(), "k", data).footer.entries
    0
"""

from __future__ import annotations

import bisect
import hashlib
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import zstandard
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lightmetrics.protocol.errors import KeyLayoutError, SealError, SegmentError, UnsupportedVersionError
from lightmetrics.protocol.keys import KeyCodec, UtcHour
from lightmetrics.protocol.manifests import canonical_json
from lightmetrics.protocol.segment_entries import SegmentEntry, check_entry, check_sorted_unique, check_writable
from lightmetrics.protocol.segment_keys import SegmentIndex, SegmentKeyCodec, validate_parts
from lightmetrics.protocol.segments import parse_entries

MAGIC: Final = b"LMSEAL"
VERSION: Final = 1
HEADER: Final = struct.Struct(">6sH")
TRAILER: Final = struct.Struct(">QQ32s6sH")
BLOCK_ENTRIES: Final = 4_096
#: What a reader asks for first: a footer is ~370 bytes a block (a million entries: ~90 KB).
TAIL_READ_BYTES: Final = 256 * 1024
_MAX_BLOCK_BYTES = 64 * 1024 * 1024  # a decompression bound: 4,096 entries are ~1.5 MB


class SealTailShort(Exception):
    """The tail read does not hold the whole footer: read the last ``needed`` bytes instead."""

    def __init__(self, needed: int) -> None:
        self.needed = needed
        super().__init__(f"read the last {needed} bytes of the seal")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)


class BlockRef(_Model):
    """Where one block lies, what it starts and ends with, and its checksum."""

    first_key: str
    last_key: str
    offset: int = Field(ge=0)
    length: int = Field(ge=1)
    entries: int = Field(ge=1, le=BLOCK_ENTRIES)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @property
    def range_header(self) -> str:
        return f"bytes={self.offset}-{self.offset + self.length - 1}"


class CoversRef(_Model):
    """Where the covered keys lie, how many, and their checksum."""

    offset: int = Field(ge=0)
    length: int = Field(ge=1)
    count: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @property
    def range_header(self) -> str:
        return f"bytes={self.offset}-{self.offset + self.length - 1}"


class SealFooter(_Model):
    index: SegmentIndex
    hour: str
    part: int = Field(ge=0)
    parts: int = Field(ge=1)
    generation: int = Field(ge=0)
    entries: int = Field(ge=0)
    covers: CoversRef
    blocks: tuple[BlockRef, ...]
    body_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    def lookup(self, entry_key: str) -> BlockRef | None:
        """The one block that holds ``entry_key`` if the seal has it; None means it has not."""
        i = bisect.bisect_right([b.first_key for b in self.blocks], entry_key) - 1
        if i < 0 or entry_key > self.blocks[i].last_key:
            return None
        return self.blocks[i]


@dataclass(frozen=True, slots=True)
class Seal:
    footer: SealFooter
    entries: tuple[SegmentEntry, ...]
    covers: tuple[str, ...]


def write_seal(codec: KeyCodec, index: SegmentIndex, hour: UtcHour, part: int, parts: int, generation: int,
               entries: Iterable[SegmentEntry], covers: Iterable[str]) -> bytes:
    """The bytes of generation ``generation`` of the sealed part of (index, part, hour): ``entries``
    folded already (one per key, :func:`fold_entries`), ``covers`` the keys folded in."""
    index, parts = SegmentIndex(index), validate_parts(parts)
    where = SegmentKeyCodec(codec.prefix).seal(index, part, hour, generation)
    items = sorted(entries, key=lambda e: e.entry_key)
    check_sorted_unique(where, items)
    check_writable(codec, index, hour, part, parts, items, where, allow_v1=True)
    out = bytearray(HEADER.pack(MAGIC, VERSION))
    refs = []
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=True)
    for start in range(0, len(items), BLOCK_ENTRIES):
        block = items[start:start + BLOCK_ENTRIES]
        raw = compressor.compress(canonical_json([e.model_dump(mode="json") for e in block]))
        refs.append({"first_key": block[0].entry_key, "last_key": block[-1].entry_key, "offset": len(out),
                     "length": len(raw), "entries": len(block), "sha256": hashlib.sha256(raw).hexdigest()})
        out += raw
    covered = sorted(set(covers))
    raw = compressor.compress(canonical_json(covered))
    covers_ref = {"offset": len(out), "length": len(raw), "count": len(covered),
                  "sha256": hashlib.sha256(raw).hexdigest()}
    out += raw
    footer = canonical_json({
        "index": SegmentIndex(index).value, "hour": str(hour), "part": part, "parts": parts,
        "generation": generation, "entries": len(items), "covers": covers_ref, "blocks": refs,
        "body_sha256": hashlib.sha256(out).hexdigest(),
    })
    offset = len(out)
    out += footer
    out += TRAILER.pack(offset, len(footer), hashlib.sha256(footer).digest(), MAGIC, VERSION)
    return bytes(out)


def _check_magic(key: str, magic: bytes, version: int, where: str) -> None:
    if magic != MAGIC:
        raise SealError(key, f"{where}: magic {magic!r} is not {MAGIC!r}")
    if version != VERSION:
        raise UnsupportedVersionError(f"{key}: {where}: .lmseal version {version} is not the {VERSION} this "
                                      f"reader knows: upgrade the reader (docs/protocol.md §17)")


def read_footer(key: str, tail: bytes) -> SealFooter:
    """The footer, from the last ``len(tail)`` bytes of the seal (:class:`SealTailShort` if too few)."""
    if len(tail) < TRAILER.size:
        raise SealTailShort(TRAILER.size)
    offset, length, digest, magic, version = TRAILER.unpack(tail[-TRAILER.size:])
    _check_magic(key, magic, version, "trailer")
    if length + TRAILER.size > len(tail):
        raise SealTailShort(length + TRAILER.size)
    raw = tail[len(tail) - TRAILER.size - length:len(tail) - TRAILER.size]
    if hashlib.sha256(raw).digest() != digest:
        raise SealError(key, "footer checksum does not match the trailer's")
    try:
        footer = SealFooter.model_validate(json.loads(raw), strict=False)
    except (ValueError, ValidationError) as exc:
        raise SealError(key, f"footer does not parse: {exc}") from None
    _check_layout(key, footer, offset)
    return footer


def _check_layout(key: str, footer: SealFooter, footer_offset: int) -> None:
    at = HEADER.size
    for prev, ref in zip((None, *footer.blocks), footer.blocks):
        if ref.offset != at or ref.first_key > ref.last_key or (prev and prev.last_key >= ref.first_key):
            raise SealError(key, f"footer: block at {ref.offset} is out of order or place")
        at += ref.length
    if footer.covers.offset != at or at + footer.covers.length != footer_offset \
            or sum(b.entries for b in footer.blocks) != footer.entries:
        raise SealError(key, "footer: blocks do not add up to the body and the entry count")
    try:
        validate_parts(footer.parts)
        UtcHour.parse(footer.hour)
    except (KeyLayoutError, ValueError) as exc:
        raise SealError(key, f"footer: {exc}") from None
    if footer.part >= footer.parts:
        raise SealError(key, f"footer: part {footer.part} is not below parts {footer.parts}")


def read_block(codec: KeyCodec, key: str, footer: SealFooter, ref: BlockRef, data: bytes) -> list[SegmentEntry]:
    """The entries of the block ``ref`` (its bytes ``data``): checksum, order and place checked."""
    if len(data) != ref.length or hashlib.sha256(data).hexdigest() != ref.sha256:
        raise SealError(key, f"block at {ref.offset}: checksum or length does not match the footer")
    raw = _unzstd(key, data, f"block at {ref.offset}")
    try:
        entries = parse_entries(key, footer.index, raw, allow_v1=True)
        check_sorted_unique(key, entries)
    except SegmentError as exc:
        raise SealError(key, f"block at {ref.offset}: {exc.reason}") from None
    if len(entries) != ref.entries or entries[0].entry_key != ref.first_key or entries[-1].entry_key != ref.last_key:
        raise SealError(key, f"block at {ref.offset}: its entries are not the footer's")
    hour = UtcHour.parse(footer.hour)
    for entry in entries:
        if (why := check_entry(codec, entry, hour, footer.part, footer.parts)) is not None:
            raise SealError(key, f"block at {ref.offset}: {why}")
    return entries


def _unzstd(key: str, data: bytes, where: str) -> object:
    try:
        return json.loads(zstandard.ZstdDecompressor().decompress(data, max_output_size=_MAX_BLOCK_BYTES))
    except (zstandard.ZstdError, ValueError) as exc:
        raise SealError(key, f"{where} does not decode: {exc}") from None


def read_covers(key: str, footer: SealFooter, data: bytes) -> tuple[str, ...]:
    """The segment and v1 keys the seal folded in, from the covers section's bytes ``data``."""
    ref = footer.covers
    if len(data) != ref.length or hashlib.sha256(data).hexdigest() != ref.sha256:
        raise SealError(key, "covers: checksum or length does not match the footer")
    covers = _unzstd(key, data, "covers")
    if not isinstance(covers, list) or not all(isinstance(c, str) for c in covers) \
            or covers != sorted(set(covers)) or len(covers) != ref.count:
        raise SealError(key, "covers: not the footer's count of sorted, unique keys")
    return tuple(covers)


def read_seal(codec: KeyCodec, key: str, data: bytes) -> Seal:
    """A whole seal read at once: header, footer, the body's checksum and every block."""
    if len(data) < HEADER.size + TRAILER.size:
        raise SealError(key, "too short to be a seal")
    magic, version = HEADER.unpack(data[:HEADER.size])
    _check_magic(key, magic, version, "header")
    footer = read_footer(key, data)
    offset = TRAILER.unpack(data[-TRAILER.size:])[0]
    if hashlib.sha256(data[:offset]).hexdigest() != footer.body_sha256:
        raise SealError(key, "body checksum does not match the footer's")
    entries = [e for ref in footer.blocks for e in read_block(codec, key, footer, ref,
                                                              data[ref.offset:ref.offset + ref.length])]
    check_sorted_unique(key, entries)
    covers = read_covers(key, footer, data[footer.covers.offset:footer.covers.offset + footer.covers.length])
    return Seal(footer, tuple(entries), covers)


def check_seal_key(codec: KeyCodec, key: str, footer: SealFooter) -> None:
    """The footer is of the seal's key: index, part, hour and generation (V-D4 for seals)."""
    try:
        parsed = SegmentKeyCodec(codec.prefix).parse(key)
    except KeyLayoutError as exc:
        raise SealError(key, f"key outside the layout: {exc}") from None
    got = (footer.index, footer.part, footer.hour, footer.generation)
    if not parsed.is_seal or got != (parsed.index, parsed.part, str(parsed.hour), parsed.generation):
        raise SealError(key, f"footer (index, part, hour, generation) {got} is not the key's")
