"""The sealed-part format ``.lmseal`` v1 (docs/protocol.md §4.5, issue 26 slice 1).

A seal of more than 4,096 entries spans several blocks; one entry is found with two ranged reads
(the tail, one block), counted by a fake store that serves byte ranges; every corruption is refused
with a typed error, never read as an empty or shorter seal.
"""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from test_segment_codec import ACC, BLOBS, H, accepted, blob, in_part

from lightmetrics.protocol.derived_entries import AcceptedByTimeEntry
from lightmetrics.protocol.errors import SealError, SegmentConflictError, UnsupportedVersionError
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.protocol.manifests import canonical_json
from lightmetrics.protocol.seal import (
    BLOCK_ENTRIES,
    HEADER,
    TAIL_READ_BYTES,
    TRAILER,
    SealTailShort,
    check_seal_key,
    read_block,
    read_covers,
    read_footer,
    read_seal,
    write_seal,
)
from lightmetrics.protocol.segment_entries import AcceptedSegmentEntry, fold_entries
from lightmetrics.protocol.segment_keys import SegmentKeyCodec

CODEC = KeyCodec("prod/")
KEY = SegmentKeyCodec("prod/").seal(ACC, 0, H, 3)


class RangedObject:
    """One stored object read by byte ranges, counting the reads (a reader's requests)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.reads = data, 0

    def suffix(self, n: int) -> bytes:
        self.reads += 1
        return self.data[-n:]

    def range(self, offset: int, length: int) -> bytes:
        self.reads += 1
        return self.data[offset:offset + length]


def lookup(obj: RangedObject, entry_key: str, tail: int = TAIL_READ_BYTES) -> AcceptedSegmentEntry | None:
    """What a reader of one entry does: the tail (the footer), then the one block it names."""
    try:
        footer = read_footer(KEY, obj.suffix(tail))
    except SealTailShort as short:
        footer = read_footer(KEY, obj.suffix(short.needed))
    ref = footer.lookup(entry_key)
    if ref is None:
        return None
    entries = read_block(CODEC, KEY, footer, ref, obj.range(ref.offset, ref.length))
    return next((e for e in entries if e.entry_key == entry_key), None)  # type: ignore[misc]


@pytest.fixture(scope="module")
def big() -> tuple[list[AcceptedSegmentEntry], bytes]:
    entries = [accepted(CODEC, "agent", seq) for seq in range(2 * BLOCK_ENTRIES + 123)]
    covers = [SegmentKeyCodec("prod/").segment(ACC, 0, H, f"{i:064x}") for i in range(40)]
    return entries, write_seal(CODEC, ACC, H, 0, 1, 3, reversed(entries), covers)


def test_a_seal_of_several_blocks_round_trips(big) -> None:  # type: ignore[no-untyped-def]
    entries, data = big
    seal = read_seal(CODEC, KEY, data)
    assert list(seal.entries) == sorted(entries, key=lambda e: e.entry_key)
    footer = seal.footer
    assert [b.entries for b in footer.blocks] == [BLOCK_ENTRIES, BLOCK_ENTRIES, 123]
    assert footer.entries == len(entries) and footer.covers.count == 40 and footer.generation == 3
    assert len(seal.covers) == 40 and list(seal.covers) == sorted(seal.covers)
    check_seal_key(CODEC, KEY, footer)
    assert data[:6] == b"LMSEAL" and data[-8:-2] == b"LMSEAL"
    assert write_seal(CODEC, ACC, H, 0, 1, 3, entries, reversed(seal.covers)) == data  # deterministic


def test_one_entry_is_two_ranged_reads_and_an_absent_one_at_most_two(big) -> None:  # type: ignore[no-untyped-def]
    entries, data = big
    for entry in (entries[0], entries[5000], entries[-1], min(entries, key=lambda e: e.entry_key)):
        obj = RangedObject(data)
        assert lookup(obj, entry.entry_key) == entry and obj.reads == 2
    for absent in ("", "prod/accepted/v1/agent=00", "prod/zzz", entries[10].entry_key + "0"):
        obj = RangedObject(data)
        assert lookup(obj, absent) is None and obj.reads <= 2


def test_the_covered_keys_stay_out_of_a_lookups_reads_and_a_short_tail_costs_one_exact_read() -> None:
    entry = accepted(CODEC, "agent", 1)
    sizes = {}
    for n in (10, 14_400):  # 14,400: a part-hour's segments at 10,000 batches/s
        covers = [SegmentKeyCodec("prod/").segment(ACC, 0, H, f"{i:064x}") for i in range(n)]
        data = write_seal(CODEC, ACC, H, 0, 1, 3, [entry], covers)
        sizes[n] = TRAILER.unpack(data[-TRAILER.size:])[1]
        obj = RangedObject(data)
        assert lookup(obj, entry.entry_key) == entry and obj.reads == 2
        obj = RangedObject(data)
        assert lookup(obj, entry.entry_key, tail=100) == entry and obj.reads == 3  # told the exact length
        footer = read_footer(KEY, data)
        ref = footer.covers
        assert len(read_covers(KEY, footer, data[ref.offset:ref.offset + ref.length])) == n
    assert sizes[14_400] - sizes[10] < 20  # only the digits of the covers' offset, length and count


@given(st.sets(st.integers(0, 10_000), max_size=200), st.booleans())
@settings(max_examples=30, deadline=None)
def test_seals_round_trip_both_indexes(seqs: set[int], blobs: bool) -> None:
    make, index = (blob, BLOBS) if blobs else (accepted, ACC)
    entries = [make(CODEC, "a", s) for s in seqs]
    data = write_seal(CODEC, index, H, 0, 1, 0, entries, ["c"])
    key = SegmentKeyCodec("prod/").seal(index, 0, H, 0)
    seal = read_seal(CODEC, key, data)
    assert list(seal.entries) == sorted(entries, key=lambda e: e.entry_key)
    check_seal_key(CODEC, key, seal.footer)


def test_a_seal_folds_v1_entries_which_keep_no_etag() -> None:
    v2 = accepted(CODEC, "a", 1)
    v1 = AcceptedSegmentEntry.from_v1(AcceptedByTimeEntry(**accepted(CODEC, "a", 2).model_dump(exclude={"record_etag"})))
    data = write_seal(CODEC, ACC, H, 0, 1, 0, fold_entries([("v1", [v1], True), ("seg", [v2], False)]), ["v1", "seg"])
    assert set(read_seal(CODEC, KEY, data).entries) == {v1, v2}
    with pytest.raises(SegmentConflictError):
        write_seal(CODEC, ACC, H, 0, 1, 0, [v2, v2.model_copy(update={"frame_bytes": 1})], [])
    with pytest.raises(ValueError, match="hour"):  # a sealer folds one part-hour, nothing else
        write_seal(CODEC, ACC, H, 0, 1, 0, [accepted(CODEC, "a", 3, hour=H + 1)], [])
    with pytest.raises(ValueError, match="part"):
        write_seal(CODEC, ACC, H, 0, 2, 0, in_part(CODEC, accepted, 1, 2, 1), [])
    with pytest.raises(ValueError, match="RawBlobSegmentEntry"):
        write_seal(CODEC, ACC, H, 0, 1, 0, [blob(CODEC, "a", 3)], [])


def _refooter(data: bytes, **over: object) -> bytes:
    """The seal with its footer changed and its trailer recomputed (a writer's bug, not bit rot)."""
    offset, length, _, magic, version = TRAILER.unpack(data[-TRAILER.size:])
    footer = json.loads(data[offset:offset + length])
    raw = json.dumps({**footer, **over}, sort_keys=True, separators=(",", ":")).encode()
    return data[:offset] + raw + TRAILER.pack(offset, len(raw), hashlib.sha256(raw).digest(), magic, version)


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]


def test_corrupted_seals_are_refused_with_typed_errors(big) -> None:  # type: ignore[no-untyped-def]
    _, data = big
    footer = read_seal(CODEC, KEY, data).footer
    blocks = [b.model_dump() for b in footer.blocks]
    swapped = [{**blocks[1], "offset": blocks[0]["offset"]}, {**blocks[0], "offset": blocks[0]["offset"] + blocks[1]["length"]},
               blocks[2]]
    cases = {
        "magic": b"XXSEAL" + data[6:],
        "trailer: magic": data[:-8] + b"XXSEAL" + data[-2:],
        "footer checksum": _flip(data, TRAILER.unpack(data[-TRAILER.size:])[0] + 5),
        "body checksum": _refooter(data, body_sha256="0" * 64),
        "out of order": _refooter(data, blocks=swapped),
        "add up": _refooter(data, entries=footer.entries + 1),
        "power of two": _refooter(data, parts=3),
        "hour must look like": _refooter(data, hour="2026-12-07 13"),
        "covers: not the footer's count": _refooter(data, covers={**footer.covers.model_dump(), "count": 41}),
        "too short": data[:20],
    }
    for reason, bad in cases.items():
        with pytest.raises(SealError, match=reason) as err:
            read_seal(CODEC, KEY, bad)
        assert err.value.key == KEY
    ref = footer.blocks[1]
    with pytest.raises(SealError, match="block at .* checksum"):  # the two-read path checks the block
        read_block(CODEC, KEY, footer, ref, _flip(data, ref.offset + 10)[ref.offset:ref.offset + ref.length])
    covers = footer.covers
    with pytest.raises(SealError, match="covers: checksum"):
        read_covers(KEY, footer, _flip(data, covers.offset + 3)[covers.offset:covers.offset + covers.length])
    for version_at in (6, len(data) - 2):  # the header's and the trailer's version
        newer = data[:version_at] + struct.pack(">H", 2) + data[version_at + 2:]
        with pytest.raises(UnsupportedVersionError, match="version 2"):
            read_seal(CODEC, KEY, newer)


def _assemble(entries: list[AcceptedSegmentEntry], ref_over: dict | None = None, **over: object) -> bytes:
    """A seal of one block holding ``entries`` as given, every checksum right (a faulty writer's)."""
    block = zstandard.ZstdCompressor().compress(canonical_json([e.model_dump(mode="json") for e in entries]))
    covers = zstandard.ZstdCompressor().compress(b"[]")
    body = HEADER.pack(b"LMSEAL", 1) + block + covers
    ref = {"first_key": min(e.entry_key for e in entries), "last_key": max(e.entry_key for e in entries),
           "offset": HEADER.size, "length": len(block), "entries": len(entries),
           "sha256": hashlib.sha256(block).hexdigest(), **(ref_over or {})}
    footer = canonical_json({"index": "accepted-by-time", "hour": str(H), "part": 0, "parts": 1, "generation": 3,
                             "entries": len(entries), "covers": {"offset": HEADER.size + len(block), "length": len(covers), "count": 0,
                                        "sha256": hashlib.sha256(covers).hexdigest()}, "blocks": [ref],
                             "body_sha256": hashlib.sha256(body).hexdigest(), **over})
    return body + footer + TRAILER.pack(len(body), len(footer), hashlib.sha256(footer).digest(), b"LMSEAL", 1)


def test_an_unsorted_block_or_an_entry_of_another_hour_is_refused_even_with_good_checksums() -> None:
    entries = sorted(in_part(CODEC, accepted, 0, 1, 3), key=lambda e: e.entry_key)
    assert len(read_seal(CODEC, KEY, _assemble(entries)).entries) == 3  # the forger is right
    with pytest.raises(SealError, match="sorted"):
        read_seal(CODEC, KEY, _assemble([entries[1], entries[0], entries[2]]))
    with pytest.raises(SealError, match="hour"):
        read_seal(CODEC, KEY, _assemble([accepted(CODEC, "a", 1, hour=H + 1)]))
    with pytest.raises(SealError, match="not the footer's"):
        read_seal(CODEC, KEY, _assemble(entries, ref_over={"first_key": entries[0].entry_key[:-1]}))


def test_a_seal_read_under_another_key_is_refused() -> None:
    data = write_seal(CODEC, ACC, H, 0, 1, 3, [accepted(CODEC, "a", 1)], [])
    footer = read_seal(CODEC, KEY, data).footer
    keys = SegmentKeyCodec("prod/")
    for other in (keys.seal(ACC, 0, H, 4), keys.seal(ACC, 0, H + 1, 3), keys.seal(BLOBS, 0, H, 3),
                  keys.segment(ACC, 0, H, "a" * 64), "prod/elsewhere.lmseal"):
        with pytest.raises(SealError, match=other):
            check_seal_key(CODEC, other, footer)
