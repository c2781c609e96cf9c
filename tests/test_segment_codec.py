"""Derived state v2, slice 1 (issue 26): segment keys, the part function, segment bodies, the fold.

Pure and fast: every refusal of docs/protocol.md §9.1 V-D4 has a case, the part function's nesting
and the split bound are properties, and the fold's duplicate rule (V-D7) is checked both ways.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightmetrics.protocol.derived_entries import AcceptedByTimeEntry, RawBlobsByTimeEntry
from lightmetrics.protocol.errors import (
    KeyLayoutError,
    SegmentConflictError,
    SegmentLayoutError,
    UnsupportedVersionError,
)
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec, UtcHour
from lightmetrics.protocol.manifests import canonical_json
from lightmetrics.protocol.segment_entries import (
    AcceptedSegmentEntry,
    RawBlobSegmentEntry,
    entry_part,
    fold_entries,
)
from lightmetrics.protocol.segment_keys import SegmentIndex, SegmentKeyCodec, part_of, validate_parts
from lightmetrics.protocol.segments import MAX_SEGMENT_ENTRIES, decode_segment, encode_segments

ACC, BLOBS = SegmentIndex.ACCEPTED_BY_TIME, SegmentIndex.RAW_BLOBS_BY_TIME
H = UtcHour.parse("2026-12-07T13")
seqs = st.integers(0, 2**40)
prefixes = st.sampled_from(["", "prod/", "team-a/eu/"])
parts_st = st.sampled_from([1, 2, 4, 8, 16, 32, 64])
hours = st.integers(0, 4_000_000_000 // 3600).map(lambda h: UtcHour(h * 3600))
manifest_ids = st.builds(lambda a, b, s: BatchIdentity.create(a, b, s, s + 1).manifest_id,
                         st.text("abcdef-", min_size=1, max_size=12), st.text("xyz0", min_size=1, max_size=6), seqs)


def sha(n: object) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def accepted(codec: KeyCodec, agent: str, seq: int, hour: UtcHour = H, etag: str | None = '"e1"') -> AcceptedSegmentEntry:
    ident = BatchIdentity.create(agent, "boot", seq, seq)
    digest = sha((agent, seq))
    return AcceptedSegmentEntry(manifest_key=codec.accepted(ident), record_etag=etag, frame_sha256=digest,
                                raw_blob_key=codec.raw_blob(digest), frame_bytes=100 + seq,
                                accepted_at_unix_ns=hour.start_ns + seq)


def blob(codec: KeyCodec, agent: str | None, seq: int, hour: UtcHour = H, version: str | None = "v1") -> RawBlobSegmentEntry:
    digest = sha((agent, seq))
    ident = BatchIdentity.create(agent, "boot", seq, seq) if agent else None
    return RawBlobSegmentEntry(
        raw_blob_key=codec.raw_blob(digest), sha256=digest, size=100 + seq,
        last_modified_unix_s=hour.start_unix_s + seq % 3600, version_id=version,
        agent_hex=ident.agent_hex if ident else None, boot_hex=ident.boot_hex if ident else None,
        seq_start=seq if ident else None, seq_end=seq if ident else None)


def in_part(codec: KeyCodec, make, part: int, parts: int, n: int, **kw):  # type: ignore[no-untyped-def]
    """``n`` entries of part ``part`` of ``parts`` (drawn from a fixed sequence, deterministic)."""
    out, seq = [], 0
    while len(out) < n:
        e = make(codec, "agent", seq, **kw)
        if entry_part(codec, e, parts) == part:
            out.append(e)
        seq += 1
    return out


# ------------------------------------------------------------------ keys and parts


@given(prefixes, st.sampled_from(list(SegmentIndex)), st.integers(0, 63), hours, st.binary(min_size=32, max_size=32))
@settings(max_examples=100)
def test_segment_and_seal_keys_round_trip(prefix, index, part, hour, digest) -> None:  # type: ignore[no-untyped-def]
    keys = SegmentKeyCodec(prefix)
    seg = keys.segment(index, part, hour, digest.hex())
    parsed = keys.parse(seg)
    assert (parsed.index, parsed.part, parsed.hour, parsed.sha256, parsed.is_seal) == (index, part, hour, digest.hex(), False)
    assert seg.startswith(keys.part_hour(index, part, hour))
    seal = keys.seal(index, part, hour, 12)
    assert keys.parse(seal).generation == 12 and seal.startswith(keys.part_hour(index, part, hour))
    assert seal.endswith("/sealed-0000000012.lmseal")


def test_the_layout_is_the_documented_one() -> None:
    keys = SegmentKeyCodec("p/")
    assert keys.segment(BLOBS, 63, H, "a" * 64) == (
        f"p/raw-blobs-by-time/v2/part=3f/date=2026-12-07/hour=13/seg-{'a' * 64}.json")
    assert keys.part_hour(ACC, 0, H) == "p/accepted-by-time/v2/part=00/date=2026-12-07/hour=13/"


@pytest.mark.parametrize("rel", [
    "accepted-by-time/v1/date=2026-12-07/hour=13/x.json",  # a v1 key is not a v2 key
    "accepted-by-time/v2/part=3/date=2026-12-07/hour=13/seg-" + "a" * 64 + ".json",  # one digit
    "accepted-by-time/v2/part=40/date=2026-12-07/hour=13/seg-" + "a" * 64 + ".json",  # part 64
    "accepted-by-time/v2/part=0A/date=2026-12-07/hour=13/seg-" + "a" * 64 + ".json",  # upper case
    "accepted-by-time/v2/part=00/date=2026-12-07/hour=24/seg-" + "a" * 64 + ".json",  # no hour 24
    "accepted-by-time/v2/part=00/date=2026-02-30/hour=01/seg-" + "a" * 64 + ".json",  # no such date
    "accepted-by-time/v2/part=00/date=2026-12-07/hour=13/seg-" + "a" * 63 + ".json",  # short digest
    "accepted-by-time/v2/part=00/date=2026-12-07/hour=13/seg-" + "A" * 64 + ".json",
    "accepted-by-time/v2/part=00/date=2026-12-07/hour=13/sealed-12.lmseal",  # 10 digits
    "accepted-by-time/v2/part=00/date=2026-12-07/hour=13/seg-" + "a" * 64 + ".json.tmp",
    "accepted-by-time/v2/part=00/date=2026-12-07/hour=13/x/seg-" + "a" * 64 + ".json",
    "accepted-by-blob/v2/part=00/date=2026-12-07/hour=13/seg-" + "a" * 64 + ".json",  # retired, never v2
])
def test_a_key_outside_the_layout_is_refused_naming_it(rel: str) -> None:
    with pytest.raises(KeyLayoutError, match="prod/"):
        SegmentKeyCodec("prod/").parse("prod/" + rel)
    with pytest.raises(KeyLayoutError, match="namespace"):
        SegmentKeyCodec("other/").parse("prod/" + rel)


@pytest.mark.parametrize("parts", [0, 3, 6, 128, -1, True, 2.0, "4"])
def test_parts_other_than_a_power_of_two_up_to_64_are_refused(parts: object) -> None:
    with pytest.raises(KeyLayoutError, match="power of two"):
        validate_parts(parts)
    with pytest.raises(KeyLayoutError):
        part_of("x", parts)  # type: ignore[arg-type]


@given(manifest_ids, st.sampled_from([1, 2, 4, 8, 16, 32]))
@settings(max_examples=300)
def test_parts_nest_part_p_of_p_is_parts_2p_and_2p_plus_1_of_2p(mid: str, parts: int) -> None:
    p = part_of(mid, parts)
    assert 0 <= p < parts
    assert part_of(mid, 2 * parts) in (2 * p, 2 * p + 1)
    assert part_of(mid, 1) == 0


def test_the_part_is_the_top_bits_of_the_manifest_ids_sha256() -> None:
    mid = BatchIdentity.create("a", "b", 1, 2).manifest_id
    top = hashlib.sha256(mid.encode()).digest()[0]
    assert [part_of(mid, 2**k) for k in range(7)] == [top >> (8 - k) for k in range(7)]


def test_a_record_and_its_blob_fall_in_the_same_part_and_a_blob_without_identity_in_part_0() -> None:
    codec = KeyCodec("prod/")
    for seq in range(50):
        assert entry_part(codec, accepted(codec, "ag", seq), 64) == entry_part(codec, blob(codec, "ag", seq), 64)
    assert {entry_part(codec, blob(codec, None, s), 64) for s in range(20)} == {0}


# ------------------------------------------------------------------ bodies


@given(prefixes, parts_st, st.data())
@settings(max_examples=40, deadline=None)
def test_segments_round_trip_sorted_unique_and_named_by_their_digest(prefix, parts, data) -> None:  # type: ignore[no-untyped-def]
    codec = KeyCodec(prefix)
    part = data.draw(st.integers(0, parts - 1))
    make = data.draw(st.sampled_from([accepted, blob]))
    index = ACC if make is accepted else BLOBS
    entries = in_part(codec, make, part, parts, data.draw(st.integers(0, 30)))
    shuffled = data.draw(st.permutations(entries + entries[: len(entries) // 2]))  # equal duplicates fold
    [seg] = encode_segments(codec, index, H, part, parts, shuffled, {"function": "f", "request_id": "r", "build": "b"})
    assert seg.key == SegmentKeyCodec(prefix).segment(index, part, H, hashlib.sha256(seg.body).hexdigest())
    assert seg.body == canonical_json(json.loads(seg.body))
    got = decode_segment(codec, seg.key, seg.body)
    assert list(got.entries) == sorted(entries, key=lambda e: e.entry_key)
    assert (got.index, got.hour, got.part, got.parts) == (index, H, part, parts)
    # the same entries in any order are the same bytes: a retried PUT is the same key
    assert encode_segments(codec, index, H, part, parts, entries, {"function": "f", "request_id": "r", "build": "b"}) == [seg]


def test_the_split_is_deterministic_and_bounded_by_entries_and_bytes() -> None:
    codec = KeyCodec()
    entries = in_part(codec, accepted, 0, 1, MAX_SEGMENT_ENTRIES * 2 + 7)
    segs = encode_segments(codec, ACC, H, 0, 1, entries)
    assert [len(s.entries) for s in segs] == [2500, 2500, 7]
    flat = [e for s in segs for e in s.entries]
    assert flat == sorted(entries, key=lambda e: e.entry_key)  # cut in order
    assert segs == encode_segments(codec, ACC, H, 0, 1, list(reversed(entries)))
    small = encode_segments(codec, ACC, H, 0, 1, entries[:100], max_bytes=8_000)
    assert len(small) > 1 and all(len(s.body) <= 8_000 for s in small)
    assert [e for s in small for e in s.entries] == sorted(entries[:100], key=lambda e: e.entry_key)
    for seg in segs + small:
        assert decode_segment(codec, seg.key, seg.body).entries == seg.entries


def test_a_writer_refuses_entries_of_another_part_or_hour_and_a_missing_etag() -> None:
    codec = KeyCodec()
    e0, e1 = in_part(codec, accepted, 0, 2, 1)[0], in_part(codec, accepted, 1, 2, 1)[0]
    with pytest.raises(ValueError, match="part 1 of 2"):
        encode_segments(codec, ACC, H, 0, 2, [e0, e1])
    with pytest.raises(ValueError, match="hour"):
        encode_segments(codec, ACC, H + 1, 0, 1, [e0])
    with pytest.raises(ValueError, match="record_etag"):
        encode_segments(codec, ACC, H, 0, 1, [e0.model_copy(update={"record_etag": None})])
    with pytest.raises(SegmentConflictError):
        encode_segments(codec, ACC, H, 0, 2, [e0, e0.model_copy(update={"frame_bytes": 1})])


def _forge(codec: KeyCodec, index: SegmentIndex, part: int, hour: UtcHour, doc: dict) -> tuple[str, bytes]:
    """A stored segment as a faulty or foreign writer would leave it: any body, named by its digest."""
    body = canonical_json(doc)
    return SegmentKeyCodec(codec.prefix).segment(index, part, hour, hashlib.sha256(body).hexdigest()), body


def _doc(codec: KeyCodec, entries: list, **over: object) -> dict:
    doc = {"schema": "lightmetrics.accepted_by_time_segment.v1", "index": "accepted-by-time", "hour": str(H),
           "part": 0, "parts": 1, "writer": {}, "entries": [e.model_dump(mode="json") for e in entries]}
    return {**doc, **over}


def test_every_v_d4_refusal_names_the_key_and_the_reason() -> None:
    codec = KeyCodec("prod/")
    good = in_part(codec, accepted, 0, 2, 3)
    [seg] = encode_segments(codec, ACC, H, 0, 2, good)
    keys = SegmentKeyCodec("prod/")
    wrong_hour = accepted(codec, "agent", 0, hour=H + 1)
    other_part = in_part(codec, accepted, 1, 2, 1)
    e0 = good[0].model_dump(mode="json")
    cases = {
        "outside the layout": ("prod/accepted-by-time/v2/part=00/date=2026-12-07/hour=13/seg-x.json", seg.body),
        "a sealed part": (keys.seal(ACC, 0, H, 0), seg.body),
        "is not the key's": (keys.segment(ACC, 0, H, "0" * 64), seg.body),  # digest
        "not JSON": (keys.segment(ACC, 0, H, hashlib.sha256(b"{not json").hexdigest()), b"{not json"),
        "schema": _forge(codec, ACC, 0, H, _doc(codec, good, schema="lightmetrics.raw_blobs_by_time_segment.v1")),
        "body index": _forge(codec, ACC, 0, H, _doc(codec, good, index="raw-blobs-by-time", parts=2)),
        "body hour": _forge(codec, ACC, 0, H, _doc(codec, good, hour=str(H + 1), parts=2)),
        "body part": _forge(codec, ACC, 0, H, _doc(codec, good, part=1, parts=2)),
        "body part True": _forge(codec, ACC, 1, H, _doc(codec, other_part, part=True, parts=2)),
        "power of two": _forge(codec, ACC, 0, H, _doc(codec, good, parts=3)),
        "entries is not a list": _forge(codec, ACC, 0, H, {**_doc(codec, [], parts=2), "entries": {}}),
        "frame_bytes": _forge(codec, ACC, 0, H, {**_doc(codec, [], parts=2), "entries": [{**e0, "frame_bytes": "1"}]}),
        "record_etag": _forge(codec, ACC, 0, H, {**_doc(codec, [], parts=2), "entries": [{**e0, "record_etag": None}]}),
        "not sorted": _forge(codec, ACC, 0, H, _doc(codec, list(reversed(good)), parts=2)),
        "is not the segment's hour": _forge(codec, ACC, 0, H, _doc(codec, [wrong_hour])),
        "is not the segment's part": _forge(codec, ACC, 0, H, _doc(codec, other_part, parts=2)),
        "is not the blob of its sha256": _forge(codec, ACC, 0, H, _doc(
            codec, [good[0].model_copy(update={"raw_blob_key": codec.raw_blob("f" * 64)})], parts=2)),
        "not in the layout": _forge(codec, ACC, 0, H, _doc(
            codec, [good[0].model_copy(update={"manifest_key": "prod/accepted/v1/x.json"})], parts=2)),
        "not an acceptance record": _forge(codec, ACC, 0, H, _doc(codec, [good[0].model_copy(update={
            "manifest_key": codec.accepted_by_time(H, BatchIdentity.create("agent", "boot", 1, 1))})], parts=2)),
    }
    for reason, (key, body) in cases.items():
        with pytest.raises(SegmentLayoutError, match=reason) as err:
            decode_segment(codec, key, body)
        assert err.value.key == key and err.value.kind == "segment" and key in str(err.value)


def test_a_blob_segment_refuses_half_an_identity_and_a_blob_of_another_part() -> None:
    codec = KeyCodec()
    half = blob(codec, "ag", 1).model_copy(update={"boot_hex": None})
    key, body = _forge(codec, BLOBS, 0, H, {**_doc(codec, [half], schema="lightmetrics.raw_blobs_by_time_segment.v1",
                                                   index="raw-blobs-by-time")})
    with pytest.raises(SegmentLayoutError, match="all present or all absent"):
        decode_segment(codec, key, body)
    [seg] = encode_segments(codec, BLOBS, H, 0, 1, [blob(codec, None, 3), blob(codec, "ag", 4, version=None)])
    assert len(decode_segment(codec, seg.key, seg.body).entries) == 2


def test_a_newer_segment_schema_is_unsupported_never_absent_and_unknown_fields_are_ignored() -> None:
    codec = KeyCodec()
    good = in_part(codec, accepted, 0, 1, 2)
    key, body = _forge(codec, ACC, 0, H, _doc(codec, good, schema="lightmetrics.accepted_by_time_segment.v2"))
    with pytest.raises(UnsupportedVersionError, match=key):
        decode_segment(codec, key, body)
    added = {**_doc(codec, good), "added": 1,
             "entries": [{**e.model_dump(mode="json"), "added": 2} for e in good]}
    key, body = _forge(codec, ACC, 0, H, added)
    assert list(decode_segment(codec, key, body).entries) == sorted(good, key=lambda e: e.entry_key)


def test_two_unequal_entries_for_one_key_inside_a_segment_are_a_segment_conflict() -> None:
    codec = KeyCodec()
    e = accepted(codec, "agent", 1)
    key, body = _forge(codec, ACC, 0, H, _doc(codec, [e, e.model_copy(update={"record_etag": '"e2"'})]))
    with pytest.raises(SegmentConflictError) as err:
        decode_segment(codec, key, body)
    assert err.value.kind == "segment-conflict" and e.manifest_key in str(err.value)
    key, body = _forge(codec, ACC, 0, H, _doc(codec, [e, e]))
    with pytest.raises(SegmentLayoutError, match="sorted and unique"):
        decode_segment(codec, key, body)


# ------------------------------------------------------------------ the fold


def test_the_fold_folds_equal_duplicates_across_segments_and_v1_and_refuses_unequal_ones_naming_both() -> None:
    codec = KeyCodec()
    a, b = accepted(codec, "a", 1), accepted(codec, "b", 2)
    v1 = AcceptedByTimeEntry(**a.model_dump(exclude={"record_etag"}))
    mapped = AcceptedSegmentEntry.from_v1(v1)
    assert mapped.record_etag is None and mapped.manifest_key == a.manifest_key
    folded = fold_entries([("v1-key", [mapped], True), ("seg-1", [a, b], False), ("seg-2", [b], False)])
    assert folded == sorted([a, b], key=lambda e: e.entry_key)  # the v2 entry (with its ETag) is kept
    assert fold_entries([("seg-1", [a], False), ("v1-key", [mapped], True)]) == [a]
    with pytest.raises(SegmentConflictError, match="seg-1") as err:
        fold_entries([("seg-1", [a], False), ("seg-2", [a.model_copy(update={"record_etag": '"x"'})], False)])
    assert err.value.key == "seg-2" and err.value.other == "seg-1"
    with pytest.raises(SegmentConflictError, match="v1-key"):
        fold_entries([("v1-key", [mapped.model_copy(update={"frame_bytes": 7})], True), ("seg-1", [a], False)])


def test_v1_blob_entries_map_into_the_v2_entry_type() -> None:
    codec = KeyCodec()
    v2 = blob(codec, "ag", 5)
    v1 = RawBlobsByTimeEntry(**v2.model_dump(exclude={"version_id"}))
    mapped = RawBlobSegmentEntry.from_v1(v1)
    assert mapped.version_id is None and mapped.entry_key == v2.sha256
    assert fold_entries([("v1", [mapped], True), ("seg", [v2], False)]) == [v2]
    with pytest.raises(SegmentConflictError):
        fold_entries([("v1", [mapped.model_copy(update={"size": 1})], True), ("seg", [v2], False)])


@given(st.lists(st.integers(0, 40), max_size=60), st.integers(1, 5))
@settings(max_examples=50, deadline=None)
def test_the_fold_is_the_union_whatever_the_grouping(seqs_: list[int], groups: int) -> None:
    codec = KeyCodec()
    entries = [accepted(codec, "a", s) for s in seqs_]
    sources = [(f"seg-{g}", entries[g::groups], False) for g in range(groups)]
    want = sorted({e.entry_key: e for e in entries}.values(), key=lambda e: e.entry_key)
    assert fold_entries(sources) == want
