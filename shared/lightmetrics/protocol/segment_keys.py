"""Keys of derived state v2 (docs/protocol.md §3, §4.5): index segments, sealed parts, the part function.

An hour of a v2 index is split into P parts (P a power of two, 1 … 64); the part of an entry is the
top log2(P) bits of the sha256 of its manifest-id, so part p of P is parts 2p and 2p + 1 of 2P and a
record and its blob (one identity) always fall in the same part. The part comes first in the key so
S3's prefix partitions stay warm across hours. Specified, not yet written: no component writes these.

Example:
    >>> keys = SegmentKeyCodec("prod/")
    >>> h = UtcHour.parse("2026-12-07T13")
    >>> keys.segment(SegmentIndex.ACCEPTED_BY_TIME, 3, h, "ab" * 32)[:67]
    'prod/accepted-by-time/v2/part=03/date=2026-12-07/hour=13/seg-ababab'
    >>> keys.parse(keys.seal(SegmentIndex.RAW_BLOBS_BY_TIME, 3, h, 2)).generation
    2
    >>> part_of("61.62.00000000000000000001-00000000000000000002", 1)
    0
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import Enum

from lightmetrics.protocol.errors import InvalidIdentityError, KeyLayoutError
from lightmetrics.protocol.identity import BatchIdentity, hex_to_id
from lightmetrics.protocol.keys import UtcHour, validate_sha256

MAX_PARTS = 64
MAX_GENERATION = 10**10


class SegmentIndex(str, Enum):
    """The derived indexes kept as v2 segments (``accepted-by-blob`` is retired, ``quarantine-by-blob``
    stays v1: docs/design/derived-state-v2.md §3)."""

    ACCEPTED_BY_TIME = "accepted-by-time"
    RAW_BLOBS_BY_TIME = "raw-blobs-by-time"


#: The v2 roots relative to the namespace, the one place they are spelled (like keys.PREFIXES for v1).
V2_ROOTS: dict[SegmentIndex, str] = {
    SegmentIndex.ACCEPTED_BY_TIME: "accepted-by-time/v2/",
    SegmentIndex.RAW_BLOBS_BY_TIME: "raw-blobs-by-time/v2/",
}

_KEY = re.compile(
    r"(?P<root>accepted-by-time|raw-blobs-by-time)/v2/part=(?P<part>[0-9a-f]{2})/"
    r"date=(?P<date>\d{4}-\d{2}-\d{2})/hour=(?P<hour>\d{2})/"
    r"(?:seg-(?P<sha>[0-9a-f]{64})\.json|sealed-(?P<gen>\d{10})\.lmseal)"
)


def validate_parts(parts: object) -> int:
    """``parts`` if it is a power of two in 1 … 64, else :class:`KeyLayoutError`."""
    if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= MAX_PARTS or parts & (parts - 1):
        raise KeyLayoutError(f"parts must be a power of two in 1..{MAX_PARTS}, got {parts!r}")
    return parts


def part_of(manifest_id: str, parts: int) -> int:
    """The part of ``<agent-hex>.<boot-hex>.<seq-start>-<seq-end>`` among ``parts``: the top
    log2(parts) bits of its sha256. Top bits, so a part of P splits into two parts of 2P.

    >>> [part_of("61.62.00000000000000000001-00000000000000000002", p) for p in (2, 4, 64)]
    [1, 2, 38]
    """
    bits = validate_parts(parts).bit_length() - 1
    top = int.from_bytes(hashlib.sha256(manifest_id.encode("utf-8")).digest()[:1], "big")
    return top >> (8 - bits)


def manifest_id_of(agent_hex: str, boot_hex: str, seq_start: int, seq_end: int) -> str:
    """The manifest-id of a blob's identity metadata (§3.1), validated like every identity."""
    try:
        ident = BatchIdentity.create(hex_to_id(agent_hex, "agent"), hex_to_id(boot_hex, "boot"), seq_start, seq_end)
    except InvalidIdentityError as exc:
        raise KeyLayoutError(f"bad identity: {exc}") from None
    return ident.manifest_id


def _part(part: int, what: str = "part") -> str:
    if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < MAX_PARTS:
        raise KeyLayoutError(f"{what} must be in [0, {MAX_PARTS}), got {part!r}")
    return f"{part:02x}"


@dataclass(frozen=True, slots=True)
class ParsedSegmentKey:
    """A parsed v2 key: a segment (``sha256`` set) or a sealed part (``generation`` set)."""

    index: SegmentIndex
    part: int
    hour: UtcHour
    sha256: str | None = None
    generation: int | None = None

    @property
    def is_seal(self) -> bool:
        return self.generation is not None


class SegmentKeyCodec:
    """Builds and parses the v2 segment and seal keys inside one prefix namespace."""

    def __init__(self, prefix: str = "") -> None:
        if prefix and not prefix.endswith("/"):
            raise KeyLayoutError("prefix namespace must be empty or end with '/'")
        self.prefix = prefix

    def root(self, index: SegmentIndex) -> str:
        return self.prefix + V2_ROOTS[SegmentIndex(index)]

    def part_hour(self, index: SegmentIndex, part: int, hour: UtcHour) -> str:
        """What a reader lists to enumerate one part of one hour (segments and seals).

        >>> SegmentKeyCodec().part_hour(SegmentIndex.ACCEPTED_BY_TIME, 10, UtcHour(0))
        'accepted-by-time/v2/part=0a/date=1970-01-01/hour=00/'
        """
        return f"{self.root(index)}part={_part(part)}/{hour.partition}/"

    def segment(self, index: SegmentIndex, part: int, hour: UtcHour, sha256: str) -> str:
        """A segment, named by the sha256 of its body's bytes."""
        return f"{self.part_hour(index, part, hour)}seg-{validate_sha256(sha256)}.json"

    def seal(self, index: SegmentIndex, part: int, hour: UtcHour, generation: int) -> str:
        """Generation ``generation`` of the sealed part (write-once: the next seal is N + 1)."""
        if isinstance(generation, bool) or not isinstance(generation, int) or not 0 <= generation < MAX_GENERATION:
            raise KeyLayoutError(f"generation must be in [0, 10^10), got {generation!r}")
        return f"{self.part_hour(index, part, hour)}sealed-{generation:010d}.lmseal"

    def parse(self, key: str) -> ParsedSegmentKey:
        """The fields of a v2 key; :class:`KeyLayoutError` naming the key for anything else (V-D4)."""
        if not key.startswith(self.prefix):
            raise KeyLayoutError(f"key {key!r} is outside the prefix namespace {self.prefix!r}")
        m = _KEY.fullmatch(key[len(self.prefix):])
        if not m:
            raise KeyLayoutError(f"key {key!r} is not in the v2 segment layout")
        part = int(m["part"], 16)
        if part >= MAX_PARTS:
            raise KeyLayoutError(f"key {key!r}: part {part} is not below {MAX_PARTS}")
        try:
            hour = UtcHour.from_parts(m["date"], m["hour"])
        except KeyLayoutError as exc:
            raise KeyLayoutError(f"key {key!r}: {exc}") from None
        gen = int(m["gen"]) if m["gen"] is not None else None
        return ParsedSegmentKey(SegmentIndex(m["root"]), part, hour, m["sha"], gen)


__all__ = [
    "MAX_PARTS",
    "ParsedSegmentKey",
    "SegmentIndex",
    "SegmentKeyCodec",
    "V2_ROOTS",
    "manifest_id_of",
    "part_of",
    "validate_parts",
]
