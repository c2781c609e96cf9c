"""The walk's W5 check over derived state v2 (docs/protocol.md §9.1, §13 W5; issue 26, slice 2).

Records are accepted without their events; their ``accepted-by-time`` entries are then written by
hand as v2 segments (the codec's ``encode_segments``, as a v2 writer will), or left v1, or missing.
A record whose only entry is in a v2 segment is present, not repaired; a refused v2 object is a
``segment`` blocker and the record is not repaired over it; v2 costs a parts LIST, a LIST per
(hour, part) and a GET per segment, the same at two history depths.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ident
from test_walk import keys_under, make_system
from test_walk_checks import HOUR, accept_at, tombstone, walk_in_process

from lightmetrics.derived.indexing import load_manifest
from lightmetrics.derived.walk import candidate_parts, read_watermarks
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.segment_entries import AcceptedSegmentEntry, entry_part
from lightmetrics.protocol.segment_keys import SegmentIndex, SegmentKeyCodec, part_of
from lightmetrics.protocol.segments import encode_segments
from lightmetrics.work.blockers import BlockerStatus

_NS = 1_000_000_000
ACC = SegmentIndex.ACCEPTED_BY_TIME
AT = HOUR.start_ns + 600 * _NS


@pytest.fixture
def system(runtime, clock):  # type: ignore[no-untyped-def]
    s = make_system(runtime, clock)
    yield s
    s.stop()


def entries_of(system: LocalSystem, runtime: Any, results: list[Any]) -> list[AcceptedSegmentEntry]:
    """The v2 entries a writer would write for these records (V-D2: the record's fields and ETag)."""
    ctx, s3 = system.work_context(), runtime.boto3_client("s3")
    out = []
    for r in results:
        m = load_manifest(ctx, r.manifest_key)
        etag = s3.head_object(Bucket=system.bucket, Key=r.manifest_key)["ETag"]
        out.append(AcceptedSegmentEntry(manifest_key=r.manifest_key, record_etag=etag, frame_sha256=m.frame_sha256,
                                        raw_blob_key=m.raw_blob_key, frame_bytes=m.frame_bytes,
                                        accepted_at_unix_ns=m.accepted_at_unix_ns))
    return out


def put_v2(system: LocalSystem, runtime: Any, entries: list[AcceptedSegmentEntry], parts: int) -> list[str]:
    """One segment per part that has entries (one writer invocation), written into the bucket."""
    codec, s3, keys = system.work_context().codec, runtime.boto3_client("s3"), []
    for part in range(parts):
        mine = [e for e in entries if entry_part(codec, e, parts) == part]
        for seg in encode_segments(codec, ACC, HOUR, part, parts, mine) if mine else []:
            s3.put_object(Bucket=system.bucket, Key=seg.key, Body=seg.body, IfNoneMatch="*")
            keys.append(seg.key)
    return keys


def v1_time_entries(system: LocalSystem, runtime: Any) -> set[str]:
    return keys_under(runtime, system.bucket, system.work_context().codec.prefix + "accepted-by-time/v1/")


def test_candidate_parts_cover_every_p_and_only_existing_parts() -> None:
    mid = ident(3).manifest_id
    every = tuple(range(64))
    assert candidate_parts(mid, every) == sorted({part_of(mid, 2 ** k) for k in range(7)})
    assert candidate_parts(mid, ()) == [] and candidate_parts(mid, (0,)) == [0]  # P = 1: part 0 holds all


def test_a_record_whose_only_entry_is_in_a_v2_segment_is_present_not_repaired(system, runtime):  # type: ignore[no-untyped-def]
    idents = [ident(n, agent="v2", boot="b") for n in range(6)]
    results = accept_at(system, runtime, AT, idents, index=False)
    segments = put_v2(system, runtime, entries_of(system, runtime, results), parts=4)
    summary, s3 = walk_in_process(system)
    assert summary["keys_present"] == 6 and summary["repairs"] == 0, summary
    assert summary["watermark_ns"] is not None
    assert v1_time_entries(system, runtime) == set()  # nothing written over v2: no v1 repair
    assert s3.get("s3.PutObject", 0) == 0 and s3["s3.GetObject"] == len(segments), s3


def test_a_record_missing_from_v1_and_v2_is_repaired_in_v1(system, runtime):  # type: ignore[no-untyped-def]
    present = accept_at(system, runtime, AT, [ident(n, agent="m", boot="b") for n in range(3)], index=False)
    (lost,) = accept_at(system, runtime, AT, [ident(9, agent="m", boot="b")], index=False)
    put_v2(system, runtime, entries_of(system, runtime, present), parts=1)
    summary, _ = walk_in_process(system)
    assert summary["keys_present"] == 3 and summary["repairs"] == 1, summary
    codec = system.work_context().codec
    assert v1_time_entries(system, runtime) == {codec.accepted_by_time(HOUR, ident(9, agent="m", boot="b"))}
    assert lost


@pytest.mark.parametrize("refused", ["bad-digest", "unequal-duplicate"])
def test_a_refused_v2_segment_is_a_blocker_and_never_written_over(system, runtime, refused):  # type: ignore[no-untyped-def]
    results = accept_at(system, runtime, AT, [ident(n, agent="r", boot="b") for n in range(2)], index=False)
    entries = entries_of(system, runtime, results)
    codec, s3 = system.work_context().codec, runtime.boto3_client("s3")
    if refused == "bad-digest":  # V-D4: the body's sha256 is not its key's
        (seg,) = encode_segments(codec, ACC, HOUR, 0, 1, entries)
        bad = SegmentKeyCodec(codec.prefix).segment(ACC, 0, HOUR, "0" * 64)
        s3.put_object(Bucket=system.bucket, Key=bad, Body=seg.body)
        expect_kind, expect_keys = "segment", {bad}
    else:  # V-D7: two segments disagree on one entry (another ETag)
        put_v2(system, runtime, entries, parts=1)
        other = [entries[0].model_copy(update={"record_etag": '"other"'})]
        (seg,) = encode_segments(codec, ACC, HOUR, 0, 1, other)
        s3.put_object(Bucket=system.bucket, Key=seg.key, Body=seg.body)
        expect_kind, expect_keys = "segment-conflict", None
    summary, s3_requests = walk_in_process(system)
    assert summary["repairs"] == 0 and summary["outcomes"].get("BLOCKED") == 2, summary
    assert summary["watermark_ns"] is None  # a refusal withholds W (§9.1 V-D4)
    assert v1_time_entries(system, runtime) == set() and s3_requests.get("s3.PutObject", 0) == 0
    blockers = system.work_context().blockers.list(status=BlockerStatus.OPEN)
    assert [b.kind for b in blockers] == [expect_kind], blockers
    assert blockers[0].work_key == f"{expect_kind}:{blockers[0].object_key}"
    if expect_keys is not None:
        assert {b.object_key for b in blockers} == expect_keys
    assert read_watermarks(system.work_context().table)["accepted-by-time"] is None


def test_v2_costs_a_parts_list_a_list_per_part_hour_and_a_get_per_segment_at_any_depth(system, runtime):  # type: ignore[no-untyped-def]
    idents = [ident(n, agent="c", boot="b") for n in range(4)]
    results = accept_at(system, runtime, AT, idents)  # v1 first: the baseline
    reaped_hours = [HOUR + -(24 + h) for h in range(6)]
    for h in reaped_hours:
        tombstone(runtime, system, h)

    def seed_history(first: int, count: int) -> None:  # reaped history: records only
        for k, h in enumerate(reaped_hours):
            accept_at(system, runtime, h.start_ns + 900 * _NS,
                      [ident(k * 100 + first + n, agent="old", boot="b") for n in range(count)], index=False)

    seed_history(0, 2)
    _, v1 = walk_in_process(system)
    s3 = runtime.boto3_client("s3")
    for key in v1_time_entries(system, runtime):
        s3.delete_object(Bucket=system.bucket, Key=key)
    parts = 4
    segments = put_v2(system, runtime, entries_of(system, runtime, results), parts=parts)
    codec = system.work_context().codec
    existing = tuple(sorted({SegmentKeyCodec(codec.prefix).parse(k).part for k in segments}))
    read_parts = {p for i in idents for p in candidate_parts(i.manifest_id, existing)}
    measured = {}
    for depth, (first, count) in (("shallow", (0, 0)), ("deep", (2, 18))):
        seed_history(first, count)
        summary, measured[depth] = walk_in_process(system)
        assert summary["keys_present"] == 4 and summary["repairs"] == 0, summary
    assert measured["shallow"] == measured["deep"], measured  # flat in history
    extra = {api: measured["deep"].get(api, 0) - v1.get(api, 0) for api in set(v1) | set(measured["deep"])}
    # one delimited LIST of the v2 root, one LIST per (hour, part) read, one GET per segment
    assert {a: n for a, n in extra.items() if n} == {"s3.ListObjectsV2": 1 + len(read_parts),
                                                     "s3.GetObject": len(segments)}, (extra, v1)
    assert v1_time_entries(system, runtime) == set() and codec
