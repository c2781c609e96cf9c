"""Derived state v2, slice 2 (issue 26): the hour reader over v1 and v2 (derived/hour_entries.py).

Hand-made segments and seals written with the codec into the in-memory store: v1 only, v2 only,
mixed with duplicates, an unequal duplicate (V-D7), refused objects (V-D4), a seal plus a late
segment, and the requests per unit at two depths (per LIST page, per seal, per uncovered segment).
"""

from __future__ import annotations

import hashlib

import pytest

from lightmetrics.derived.hour_entries import HourReader
from lightmetrics.harness.testing.memory.object_store import InMemoryObjectStore
from lightmetrics.protocol.errors import SealError, SegmentConflictError, SegmentLayoutError
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec, UtcHour
from lightmetrics.protocol.seal import TAIL_READ_BYTES, write_seal
from lightmetrics.protocol.segment_entries import AcceptedSegmentEntry, RawBlobSegmentEntry, entry_part
from lightmetrics.protocol.segment_keys import SegmentIndex, SegmentKeyCodec
from lightmetrics.protocol.segments import encode_segments

ACC, BLOBS = SegmentIndex.ACCEPTED_BY_TIME, SegmentIndex.RAW_BLOBS_BY_TIME
H = UtcHour.parse("2026-12-07T13")
CODEC = KeyCodec("prod/")
KEYS = SegmentKeyCodec("prod/")


def sha(n: object) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def ident(seq: int) -> BatchIdentity:
    return BatchIdentity.create("agent", "boot", seq, seq)


def accepted(seq: int, etag: str | None = '"e1"', frame_bytes: int | None = None) -> AcceptedSegmentEntry:
    digest = sha(seq)
    return AcceptedSegmentEntry(manifest_key=CODEC.accepted(ident(seq)), record_etag=etag, frame_sha256=digest,
                                raw_blob_key=CODEC.raw_blob(digest), frame_bytes=frame_bytes or 100 + seq,
                                accepted_at_unix_ns=H.start_ns + seq)


def blob(seq: int) -> RawBlobSegmentEntry:
    digest, i = sha(seq), ident(seq)
    return RawBlobSegmentEntry(raw_blob_key=CODEC.raw_blob(digest), sha256=digest, size=100, version_id="v",
                               last_modified_unix_s=H.start_unix_s + seq % 3600, agent_hex=i.agent_hex,
                               boot_hex=i.boot_hex, seq_start=seq, seq_end=seq)


def mid(seq: int) -> str:
    return ident(seq).manifest_id


def put_v1(store: InMemoryObjectStore, seqs: range | list[int]) -> None:
    for s in seqs:
        store.put_if_absent(CODEC.accepted_by_time(H, ident(s)), b"{}")


def put_segments(store: InMemoryObjectStore, entries: list, parts: int = 2, index: SegmentIndex = ACC,
                 **kw: int) -> list[str]:
    """One segment write per part (as one writer invocation would), returning the keys."""
    keys = []
    for part in range(parts):
        mine = [e for e in entries if entry_part(CODEC, e, parts) == part]
        if mine:
            for seg in encode_segments(CODEC, index, H, part, parts, mine, **kw):
                store.put_if_absent(seg.key, seg.body)
                keys.append(seg.key)
    return keys


def put_seal(store: InMemoryObjectStore, part: int, parts: int, generation: int, entries: list,
             covers: list[str]) -> str:
    key = KEYS.seal(ACC, part, H, generation)
    store.put_if_absent(key, write_seal(CODEC, ACC, H, part, parts, generation, entries, covers))
    return key


def read(store: InMemoryObjectStore, index: SegmentIndex = ACC, **kw: object):  # type: ignore[no-untyped-def]
    store.requests.clear()
    return HourReader(store, CODEC).read(index, H, **kw)  # type: ignore[arg-type]


def test_v1_only_costs_its_listing_and_one_parts_listing() -> None:
    store = InMemoryObjectStore()
    put_v1(store, range(5))
    got = read(store)
    assert got.ids() == {mid(s) for s in range(5)} and got.entries == () and got.v2_keys == ()
    # one LIST of the v1 hour, one delimited LIST of the v2 root (empty: no part, no hour pays more)
    assert dict(store.requests) == {"ListObjectsV2": 2}


def test_v2_only_reads_every_segment_of_every_part() -> None:
    store = InMemoryObjectStore()
    keys = put_segments(store, [accepted(s) for s in range(10)])
    got = read(store)
    assert got.ids() == {mid(s) for s in range(10)} and got.v1_keys == ()
    assert sorted(got.v2_keys) == sorted(keys)
    assert store.requests["GetObject"] == len(keys) == 2


def test_raw_blobs_by_time_ids_are_the_hashes() -> None:
    store = InMemoryObjectStore()
    put_segments(store, [blob(s) for s in range(4)], index=BLOBS)
    store.put_if_absent(CODEC.raw_blobs_by_time(H, sha("v1")), b"{}")
    assert read(store, BLOBS).ids() == {sha(s) for s in range(4)} | {sha("v1")}


def test_mixed_hour_with_duplicates_folds_them() -> None:
    store = InMemoryObjectStore()
    put_v1(store, range(0, 6))
    put_segments(store, [accepted(s) for s in range(3, 9)])
    put_segments(store, [accepted(s) for s in range(5, 7)], max_entries=1)  # a replay: other segments
    got = read(store)
    assert got.ids() == {mid(s) for s in range(9)}
    assert [e.entry_key for e in got.entries] == sorted(CODEC.accepted(ident(s)) for s in range(3, 9))


def test_an_unequal_duplicate_is_a_conflict_naming_both_sources() -> None:
    store = InMemoryObjectStore()
    [a] = put_segments(store, [accepted(1)], parts=1)
    [b] = put_segments(store, [accepted(1, frame_bytes=7)], parts=1)
    with pytest.raises(SegmentConflictError) as err:
        read(store)
    assert {err.value.key, err.value.other} == {a, b}


def test_a_corrupt_segment_is_refused_by_key_never_skipped() -> None:
    store = InMemoryObjectStore()
    put_segments(store, [accepted(s) for s in range(3)], parts=1)
    bad = KEYS.segment(ACC, 0, H, sha("not the body"))
    store.put_if_absent(bad, b'{"schema": "x"}')
    with pytest.raises(SegmentLayoutError) as err:
        read(store)
    assert err.value.key == bad and "sha256" in err.value.reason


def test_a_key_outside_the_layout_under_a_part_hour_is_refused() -> None:
    store = InMemoryObjectStore()
    put_segments(store, [accepted(1)], parts=1)
    stray = KEYS.part_hour(ACC, 0, H) + "notes.txt"
    store.put_if_absent(stray, b"x")
    with pytest.raises(SegmentLayoutError) as err:
        read(store)
    assert err.value.key == stray


def test_a_stray_prefix_under_the_v2_root_is_refused() -> None:
    store = InMemoryObjectStore()
    store.put_if_absent(KEYS.root(ACC) + "part=zz/x", b"x")
    with pytest.raises(SegmentLayoutError) as err:
        read(store)
    assert "part=zz" in err.value.key


def test_a_corrupt_seal_is_refused() -> None:
    store = InMemoryObjectStore()
    key = KEYS.seal(ACC, 0, H, 0)
    good = write_seal(CODEC, ACC, H, 0, 1, 0, [accepted(1)], [])
    store.put_if_absent(key, good[:10] + bytes([good[10] ^ 1]) + good[11:])
    with pytest.raises(SealError) as err:
        read(store)
    assert err.value.key == key


def test_a_seal_of_another_generation_than_its_key_is_refused() -> None:
    store = InMemoryObjectStore()
    key = KEYS.seal(ACC, 0, H, 1)
    store.put_if_absent(key, write_seal(CODEC, ACC, H, 0, 1, 0, [accepted(1)], []))
    with pytest.raises(SealError, match="generation"):
        read(store)


def test_the_newest_seal_plus_late_segments_not_in_its_covers() -> None:
    store = InMemoryObjectStore()
    early = put_segments(store, [accepted(s) for s in range(4)], parts=1)
    put_v1(store, [10])
    v1_entry = accepted(10, etag=None)  # folded from the v1 object
    put_seal(store, 0, 1, 0, [accepted(0)], early[:0])  # an older generation: never read
    seal = put_seal(store, 0, 1, 1, [accepted(s) for s in range(4)] + [v1_entry],
                    [*early, CODEC.accepted_by_time(H, ident(10))])
    late = put_segments(store, [accepted(3), accepted(20)], parts=1)  # a replay of 3 and a late 20
    got = read(store)
    assert got.ids() == {mid(s) for s in (0, 1, 2, 3, 10, 20)}
    assert sorted(got.v2_keys) == sorted([seal, *late])
    # a v2 entry from a late segment of a v1-folded key would be kept over it; here 10 stays v1-folded
    assert {e.entry_key: e.record_etag for e in got.entries}[CODEC.accepted(ident(10))] is None
    # the tail alone holds a small seal: one ranged GET, one GET for the late segment
    assert store.requests["GetObject"] == 1 + len(late)


def test_a_late_v2_entry_equal_to_a_v1_folded_one_is_kept_over_it() -> None:
    store = InMemoryObjectStore()
    put_seal(store, 0, 1, 0, [accepted(10, etag=None)], [])
    put_segments(store, [accepted(10)], parts=1)
    [entry] = read(store).entries
    assert entry.record_etag == '"e1"'


def test_one_part_reads_only_that_part_hour() -> None:
    store = InMemoryObjectStore()
    put_segments(store, [accepted(s) for s in range(10)], parts=2)
    got = read(store, part=1, v1=False)
    assert got.ids() == {mid(s) for s in range(10) if entry_part(CODEC, accepted(s), 2) == 1}
    assert dict(store.requests) == {"ListObjectsV2": 1, "GetObject": 1}


def _measure(v1: int, segments: int, sealed: int, parts: int = 2) -> dict[str, int]:
    """Requests of one hour read: ``v1`` v1 objects, ``segments`` uncovered one-entry segments per
    part, a seal per part of ``sealed`` entries covering ``sealed`` segments of its own."""
    store = InMemoryObjectStore()
    put_v1(store, range(100_000, 100_000 + v1))
    seq = 0
    for part in range(parts):
        mine: list[AcceptedSegmentEntry] = []
        while len(mine) < segments + sealed:
            if entry_part(CODEC, accepted(seq), parts) == part:
                mine.append(accepted(seq))
            seq += 1
        covered = [s.key for e in mine[:sealed] for s in encode_segments(CODEC, ACC, H, part, parts, [e])]
        for e in mine:
            [s] = encode_segments(CODEC, ACC, H, part, parts, [e])
            store.put_if_absent(s.key, s.body)
        if sealed:
            put_seal(store, part, parts, 0, mine[:sealed], covered)
    got = read(store)
    assert len(got.ids()) == v1 + parts * (segments + sealed)
    return dict(store.requests)


@pytest.mark.parametrize("v1", [0, 10, 2_500])
def test_requests_per_unit_at_two_depths(v1: int) -> None:
    """LISTs: one per 1,000 keys of each prefix (+1 for the parts); GETs: 1 per seal whose tail
    holds it, 1 per uncovered segment — whatever the seal folded, never a record."""
    shallow = _measure(v1, segments=2, sealed=3)
    deep = _measure(v1, segments=5, sealed=1_200)
    pages = lambda n: max(1, -(-n // 1000))  # noqa: E731
    for got, segs, sealed in ((shallow, 2, 3), (deep, 5, 1_200)):
        per_part = segs + sealed + 1  # the keys of a part-hour: its segments and its seal
        assert got["ListObjectsV2"] == 1 + pages(v1) + 2 * pages(per_part)
        assert got["GetObject"] == 2 * (1 + segs)
        assert set(got) == {"ListObjectsV2", "GetObject"}


def test_a_seal_larger_than_the_tail_read_costs_two_ranged_gets() -> None:
    store = InMemoryObjectStore()
    # incompressible-ish entries so the seal outgrows the first tail read
    entries = sorted((accepted(s) for s in range(6_000)), key=lambda e: e.entry_key)
    data = write_seal(CODEC, ACC, H, 0, 1, 0, entries, [])
    assert len(data) > TAIL_READ_BYTES
    store.put_if_absent(KEYS.seal(ACC, 0, H, 0), data)
    got = read(store)
    assert len(got.entries) == 6_000 and store.requests["GetObject"] == 2


def test_a_footer_longer_than_the_tail_read_costs_a_third_ranged_get(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightmetrics.derived import hour_entries

    monkeypatch.setattr(hour_entries, "TAIL_READ_BYTES", 80)  # the trailer, not the whole footer
    store = InMemoryObjectStore()
    store.put_if_absent(KEYS.seal(ACC, 0, H, 0), write_seal(CODEC, ACC, H, 0, 1, 0, [accepted(s) for s in range(3)], []))
    got = read(store)
    assert got.ids() == {mid(s) for s in range(3)} and store.requests["GetObject"] == 3


def test_a_seal_whose_trailer_names_more_than_its_size_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightmetrics.derived import hour_entries

    monkeypatch.setattr(hour_entries, "TAIL_READ_BYTES", 80)
    store = InMemoryObjectStore()
    data = write_seal(CODEC, ACC, H, 0, 1, 0, [accepted(1)], [])
    key = KEYS.seal(ACC, 0, H, 0)
    store.put_if_absent(key, data[-200:])  # a cut seal: its trailer names a footer before its start
    with pytest.raises(SealError) as err:
        read(store)
    assert err.value.key == key
