"""Retention's cost per batch (issue 14): each acceptance record read once by the blobs phase (its
proof and settle use what it read, rule G-R1), compact marks (rule G-I7) that still settle marks an
older version wrote, and GC's tombstone HEAD once per hour per task."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from conftest import ident
from reap_support import OLD_NS, drive, make_world

from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps import dynamodb_item_bytes
from lightmetrics.reaps.gc import BlobCollector
from lightmetrics.reaps.gc_marks import Mark, decode_mark, encode_mark, stored_marks_items

GC = {"mode": "gc", "dry_run": False}
HOUR = UtcHour.of_unix_ns(OLD_NS)


def stored_marks(w: Any) -> list[dict[str, Any]]:
    return [m for i in stored_marks_items(w.ctx.table) for m in i["marks"]]


def test_retention_reads_each_record_once_before_the_derived_phase_and_marks_carry_the_hour(bucket: str) -> None:
    w = make_world(bucket)
    results = [w.accept(ident(n)) for n in range(3)]
    w.cover_watermark()
    reads: dict[str, int] = {}
    get = w.ctx.store.get

    def counting_get(key: str, *a: Any, **kw: Any) -> Any:
        if "/accepted/v1/" in f"/{key}":
            reads[key] = reads.get(key, 0) + 1
        return get(key, *a, **kw)

    w.ctx.store.get = counting_get  # type: ignore[method-assign]
    seen: list[dict[str, Any]] = []
    report = drive(w.reaper(), {"mode": "retention", "dry_run": False, "hour": str(HOUR), "tombstone_wait_s": 0},
                   w.clock, before_task=lambda _n, _e: seen.extend(stored_marks(w)))
    assert report["hours_reaped"] == [str(HOUR)] and report["purged"] == 3, report
    # the blobs phase (its proof and its settle reuse it) and the derived phase: twice, not four times
    assert reads == {r.manifest_key: 2 for r in results}, reads
    assert seen and all(set(m) == {"s", "t", "r", "v", "m", "h"} and m["h"] == str(HOUR) for m in seen
                        if "m" in m), seen
    sizes = {dynamodb_item_bytes({"m": m}) for m in seen}
    assert max(sizes) <= 200, sizes  # was 490 with long names and the identity
    assert not any(w.blob_exists(r.blob_key) for r in results)


def test_marks_an_older_version_left_are_settled_by_the_new_one(bucket: str) -> None:
    w = make_world(bucket)
    orphans = [w.orphan(ident(n)) for n in range(3)]
    table = w.ctx.table
    reaper = w.reaper()
    out = reaper.begin({"input": {**GC, "page_size": 10}, "execution_arn": "old"})
    reaper.gc({"reap": out["reap"]})  # marked and recorded; then the reap "crashes"
    [item] = stored_marks_items(table)
    at = int(item["marked_at_ns"])
    # the previous version's long form: the mark's fields by name, none left out but those it lacks
    old = [{k: v for k, v in asdict(decode_mark(m, w.ctx.codec, at)).items() if v is not None} for m in item["marks"]]
    assert all("agent_hex" in m and "key" in m for m in old)  # the previous version's long form
    table.put({**item, "marks": old})
    assert all(not w.blob_exists(o) for o in orphans)  # markers current
    w.clock.advance(3600)  # the crashed epoch's lease has expired
    report = drive(w.reaper(), GC, w.clock)
    assert report["purged"] == 3, report
    assert all(w.versions(o) == ([], []) for o in orphans)
    assert not stored_marks_items(table)


def test_compact_marks_round_trip_and_keep_the_identity_when_the_record_does_not_name_the_blob() -> None:
    from lightmetrics.protocol.keys import KeyCodec

    codec = KeyCodec("lm/")
    i = ident(4)
    mark = Mark(key=codec.raw_blob("cd" * 32), sha="cd" * 32, version_id="v1", marker_version_id="m1",
                marked_at_ns=5, lm_unix_s=7200, reason="unreferenced", agent_hex=i.agent_hex,
                boot_hex=i.boot_hex, seq_start=i.seq_start, seq_end=i.seq_end)
    assert decode_mark(encode_mark(mark), codec, 5) == mark
    tomb = replace(mark, agent_hex=None, boot_hex=None, seq_start=None, seq_end=None)
    tomb = replace(tomb, reason="hour-tombstoned", record_hour=str(HOUR), version_id=None)
    assert decode_mark(encode_mark(tomb), codec, 5) == tomb


def test_gc_heads_a_tombstone_once_per_hour_per_task(bucket: str) -> None:
    w = make_world(bucket)
    results = [w.accept(ident(n)) for n in range(3)]  # one acceptance hour, not tombstoned
    w.clock.advance(w.settings.retry_horizon_s + 60)
    counter = RequestCounter()
    counter.attach(w.s3)
    gc = BlobCollector(w.ctx, w.settings)
    try:
        with counter.operation("prove") as prove:
            proofs = [gc.prove(r.blob_key) for r in results]  # one task's collector
    finally:
        gc.close()
    assert {p.reason for p in proofs} == {"referenced"}
    # 3 blobs + 1 tombstone (a negative answer, kept for the task); 3 records
    assert dict(prove.by_api) == {"s3.HeadObject": 4, "s3.GetObject": 3}


def test_marks_items_keep_their_stored_form_and_an_attribute_this_version_does_not_know() -> None:
    """Typed marks items (MarksItem) convert at the control-store boundary: the attributes each home
    writes are today's, in today's order, and an item read back is stored again byte for byte."""
    from types import SimpleNamespace

    from lightmetrics.protocol.keys import KeyCodec
    from lightmetrics.reaps.gc_marks import MarksItem, page_ops
    from lightmetrics.reaps.gc_tasks import SummaryPages
    from lightmetrics.reaps.retention_ranges import RangePages
    from lightmetrics.reaps.state import MarkState, PageOutcome

    codec, i = KeyCodec("lm/"), ident(4)
    reap = {"epoch": 3, "owner": "o"}
    outcome = PageOutcome("after", True, {"c_examined": 2}, "2026-08-01T13")
    gc = SummaryPages(None, reap, None)  # type: ignore[arg-type]
    ranges = RangePages(SimpleNamespace(reap=reap))  # type: ignore[arg-type]
    expected = {
        (gc, MarkState.INTENT): {"epoch": 3, "owner": "o", "state": "intent", "cursor": "after", "more": True,
                                 "counts": {"c_examined": 2, "through": "2026-08-01T13"}, "created_at_ns": 7},
        (gc, MarkState.MARKED): {"epoch": 3, "owner": "o", "state": "marked", "marked_at_ns": 7},
        (ranges, MarkState.INTENT): {"epoch": 3, "owner": "o", "state": "intent", "created_at_ns": 7},
        (ranges, MarkState.MARKED): {"epoch": 3, "owner": "o", "state": "marked", "marked_at_ns": 7},
    }
    mark = Mark(codec.raw_blob("cd" * 32), "cd" * 32, "v1", "m1", 7, 7200, "unreferenced", agent_hex=i.agent_hex,
                boot_hex=i.boot_hex, seq_start=i.seq_start, seq_end=i.seq_end)
    for (home, state), attributes in expected.items():
        fields = home.item_fields(state, outcome, 7)
        assert list(fields.attributes().items()) == list(attributes.items())
        [put] = page_ops(3, 0, [mark], fields, [])
        raw = {"pk": put.pk, "sk": put.sk, **(put.item or {}), "written_by": "a newer version"}
        item = MarksItem.of(raw, codec)
        assert item.stored() == raw and item.marks == (mark,) and item.intent is (state is MarkState.INTENT)
        assert item.extra == {"written_by": "a newer version"} and item.key == (put.pk, put.sk)
        assert item.outcome == (outcome if home is gc and state is MarkState.INTENT else None)
