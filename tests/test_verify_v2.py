"""``lmctl verify`` over derived state v2 (issue 26, slice 2): v2 segments are listed and read; their
entries count as present (a record indexed only in v2 is not ``missing-derived``); a refused
object is a ``segment`` finding naming the key and reason, two unequal entries a
``segment-conflict`` naming both sources, and either fails verify as every violation does."""

from __future__ import annotations

import pytest
from conftest import FAST, ident, make_frame
from pipeline_support import make_system

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.derived_entries import AcceptedByTimeEntry, RawBlobsByTimeEntry
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.protocol.segment_entries import AcceptedSegmentEntry, RawBlobSegmentEntry
from lightmetrics.protocol.segment_keys import SegmentIndex, SegmentKeyCodec
from lightmetrics.protocol.segments import encode_segments

ACC, BLOBS = SegmentIndex.ACCEPTED_BY_TIME, SegmentIndex.RAW_BLOBS_BY_TIME


@pytest.fixture
def indexed(runtime, clock):  # type: ignore[no-untyped-def]
    """Three accepted, indexed batches; their v1 time entries moved to one v2 segment per index."""
    system = make_system(runtime, clock)
    actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
    ctx = system.work_context(policy=FAST)
    for n in range(3):
        r = accept_batch(actx, ident(n), make_frame(ident(n)))
        index_accepted(ctx, r.manifest_key)
        index_raw_blob(ctx, r.blob_key)
    store, codec = ctx.store, ctx.codec
    moved: dict[SegmentIndex, list] = {ACC: [], BLOBS: []}
    for kind, index in ((KeyKind.ACCEPTED_BY_TIME, ACC), (KeyKind.RAW_BLOBS_BY_TIME, BLOBS)):
        for key in store.list_keys(codec.prefix + f"{kind.value}/v1/", limit=100):
            body = store.get(key)
            if index is ACC:
                v1 = AcceptedByTimeEntry.model_validate_json(body)
                etag = store.head(v1.manifest_key).etag
                moved[ACC].append(AcceptedSegmentEntry.from_v1(v1).model_copy(update={"record_etag": etag}))
            else:
                moved[BLOBS].append(RawBlobSegmentEntry.from_v1(RawBlobsByTimeEntry.model_validate_json(body)))
            store.delete(key)
    return ctx, moved


def _put(ctx, index: SegmentIndex, entries: list, **kw: object) -> list[str]:  # type: ignore[no-untyped-def]
    from lightmetrics.protocol.segment_entries import entry_hour

    out = []
    for hour in sorted({entry_hour(e) for e in entries}, key=str):
        for seg in encode_segments(ctx.codec, index, hour, 0, 1, [e for e in entries if entry_hour(e) == hour], **kw):
            ctx.store.put_if_absent(seg.key, seg.body)
            out.append(seg.key)
    return out


def test_entries_only_in_v2_count_as_present(indexed) -> None:  # type: ignore[no-untyped-def]
    ctx, moved = indexed
    assert len(moved[ACC]) == len(moved[BLOBS]) == 3
    before = verify(ctx, strict=True)  # the v1 time entries are gone and nothing replaced them yet
    assert {f.rule for f in before.violations} == {"missing-derived"} and len(before.violations) == 6
    _put(ctx, ACC, moved[ACC])
    _put(ctx, BLOBS, moved[BLOBS], max_entries=1)
    _put(ctx, BLOBS, moved[BLOBS][:1], writer={"request": "replay"})  # a replay: another segment, equal entry
    report = verify(ctx, strict=True)
    assert report.ok, report.violations
    assert report.checked["v2 objects"] == 1 + 3 + 1
    assert report.counts["accepted-by-time/v2/"] == 1 and report.counts["raw-blobs-by-time/v2/"] == 4


def test_a_corrupt_segment_is_a_segment_finding_by_key(indexed) -> None:  # type: ignore[no-untyped-def]
    ctx, moved = indexed
    _put(ctx, ACC, moved[ACC])
    _put(ctx, BLOBS, moved[BLOBS])
    hour = UtcHour.of_unix_ns(moved[ACC][0].accepted_at_unix_ns)
    bad = SegmentKeyCodec(ctx.codec.prefix).segment(ACC, 0, hour, "ab" * 32)
    ctx.store.put_if_absent(bad, b"{}")
    report = verify(ctx, strict=True)
    found = [f for f in report.violations if f.rule == "segment"]
    assert [f.keys for f in found] == [(bad,)] and "sha256" in found[0].detail
    assert not report.ok and report.violation_counts()["segment"] == 1


def test_an_unequal_duplicate_is_a_segment_conflict_naming_both(indexed) -> None:  # type: ignore[no-untyped-def]
    ctx, moved = indexed
    [a] = _put(ctx, ACC, moved[ACC])
    [b] = _put(ctx, ACC, [moved[ACC][0].model_copy(update={"frame_bytes": 1})])
    _put(ctx, BLOBS, moved[BLOBS])
    report = verify(ctx, strict=True)
    [found] = [f for f in report.violations if f.rule == "segment-conflict"]
    assert set(found.keys) == {a, b} and not report.ok


def test_a_v2_entry_without_its_record_is_derived_without_source(indexed) -> None:  # type: ignore[no-untyped-def]
    ctx, moved = indexed
    [seg] = _put(ctx, ACC, moved[ACC])
    _put(ctx, BLOBS, moved[BLOBS])
    record = moved[ACC][1].manifest_key
    ctx.store.delete(record)
    report = verify(ctx, strict=True)
    found = {f.keys for f in report.violations if f.rule == "derived-without-source"}
    assert (seg, record) in found  # (and its v1 accepted-by-blob entry's, as before v2)
