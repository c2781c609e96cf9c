"""The ledger's derived-entry check over derived state v2 (harness/ledger.py ``missing_derived``;
docs/protocol.md §4.10, §9.1; issue 26, slice 2).

Records are accepted and indexed in v1; then their ``accepted-by-time`` and ``raw-blobs-by-time``
v1 objects are replaced by hand-made v2 segments (the codec's ``encode_segments``). v2 entries
count; a refused v2 object is counted under its rule, never skipped; the check's requests are a
LIST pass per root and a GET per segment, whatever the number of v1 objects beside them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from conftest import FAST, ident
from test_walk import keys_under, make_system
from test_walk_checks import HOUR
from test_walk_v2 import AT, accept_at, entries_of, put_v2

from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.harness.ledger import check_acknowledged, missing_derived, missing_derived_lines
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.derived_entries import RawBlobsByTimeEntry
from lightmetrics.protocol.segment_entries import RawBlobSegmentEntry, entry_hour, entry_part
from lightmetrics.protocol.segment_keys import SegmentIndex, SegmentKeyCodec
from lightmetrics.protocol.segments import encode_segments

BLOBS = SegmentIndex.RAW_BLOBS_BY_TIME


@pytest.fixture
def system(runtime, clock):  # type: ignore[no-untyped-def]
    s = make_system(runtime, clock)
    yield s
    s.stop()


def move_to_v2(system: LocalSystem, runtime: Any, results: list[Any], idents: list[Any], parts: int = 2) -> int:
    """Replace the records' v1 time and blob-time objects by v2 segments; the number of segments."""
    codec, s3 = system.work_context().codec, runtime.boto3_client("s3")
    segments = len(put_v2(system, runtime, entries_of(system, runtime, results), parts=parts))
    shas = {r.frame_sha256 for r in results}
    blobs: dict[tuple[Any, int], list[RawBlobSegmentEntry]] = defaultdict(list)
    for key in keys_under(runtime, system.bucket, codec.prefix + "raw-blobs-by-time/v1/"):
        v1 = RawBlobsByTimeEntry.from_bytes(s3.get_object(Bucket=system.bucket, Key=key)["Body"].read())
        if v1.sha256 in shas:
            entry = RawBlobSegmentEntry.from_v1(v1).model_copy(update={"version_id": "v"})
            blobs[(entry_hour(entry), entry_part(codec, entry, parts))].append(entry)
            s3.delete_object(Bucket=system.bucket, Key=key)
    for (hour, part), entries in blobs.items():
        for seg in encode_segments(codec, BLOBS, hour, part, parts, entries):
            s3.put_object(Bucket=system.bucket, Key=seg.key, Body=seg.body, IfNoneMatch="*")
            segments += 1
    for key in keys_under(runtime, system.bucket, codec.prefix + "accepted-by-time/v1/"):
        if any(key.endswith("/" + codec.accepted_by_time(HOUR, i).rsplit("/", 1)[-1]) for i in idents):
            s3.delete_object(Bucket=system.bucket, Key=key)
    return segments


def ledger(system: LocalSystem, acked: dict[Any, Any], counter: RequestCounter | None = None) -> Any:
    ctx = system.work_context(policy=FAST, counter=counter)
    check = check_acknowledged(ctx.store, ctx.codec, {i: {r.frame_sha256} for i, r in acked.items()})
    assert len(check.manifests) == len(acked)
    if counter is not None:
        counter.totals.clear()
    return missing_derived(ctx.store, ctx.codec, check.manifests)


def test_v2_entries_count_and_v1_still_does(system, runtime):  # type: ignore[no-untyped-def]
    i2, i1 = [ident(n, agent="l2", boot="b") for n in range(4)], [ident(n, agent="l1", boot="b") for n in range(2)]
    v2, v1 = accept_at(system, runtime, AT, i2), accept_at(system, runtime, AT, i1)
    move_to_v2(system, runtime, v2, i2)
    acked = dict(zip(i2 + i1, v2 + v1))
    codec = system.work_context().codec
    assert len(keys_under(runtime, system.bucket, codec.prefix + "accepted-by-time/v1/")) == 2  # the v1 ones
    assert ledger(system, acked) == {}
    # a record with neither a v1 object nor a v2 entry is still missing
    (lost,) = accept_at(system, runtime, AT, [ident(9, agent="l1", boot="b")], index=False)
    assert ledger(system, {**acked, ident(9, agent="l1", boot="b"): lost}) == {"accepted-by-time": 1, "accepted-by-blob": 1,
                                                 "raw-blobs-by-time": 1}


def test_a_refused_v2_object_is_counted_under_its_rule(system, runtime):  # type: ignore[no-untyped-def]
    idents = [ident(n, agent="rf", boot="b") for n in range(2)]
    results = accept_at(system, runtime, AT, idents)
    codec = system.work_context().codec
    bad = SegmentKeyCodec(codec.prefix).segment(SegmentIndex.ACCEPTED_BY_TIME, 0, HOUR, "0" * 64)
    runtime.boto3_client("s3").put_object(Bucket=system.bucket, Key=bad, Body=b"{}")
    missing = ledger(system, dict(zip(idents, results)))
    assert missing == {"segment": 1}  # the records' v1 objects are there; the refusal is not skipped
    assert missing_derived_lines(missing) == ["segment: 1 v2 objects refused (lmctl verify names them)"]


@pytest.mark.parametrize("v1_records", [1, 12])
def test_the_check_costs_a_list_per_root_and_a_get_per_segment(system, runtime, v1_records):  # type: ignore[no-untyped-def]
    i2, i1 = [ident(n, agent="c2", boot="b") for n in range(3)], [ident(n, agent="c1", boot="b") for n in range(v1_records)]
    v2, v1 = accept_at(system, runtime, AT, i2), accept_at(system, runtime, AT, i1)
    segments = move_to_v2(system, runtime, v2, i2)
    counter = RequestCounter()
    assert ledger(system, dict(zip(i2 + i1, v2 + v1)), counter) == {}
    s3 = {api: n for api, n in counter.totals.items() if api.startswith("s3.")}
    # three v1 roots, the tombstones, two v2 roots: one LIST each (under 1,000 keys); a GET a segment
    assert s3 == {"s3.ListObjectsV2": 6, "s3.GetObject": segments}, s3
