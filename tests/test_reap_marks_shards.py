"""The reap's marks items spread over MARKS_SHARDS partition keys (docs/protocol.md §15 G-I10), and
a key range's pages an older writer recorded under ``checkpoint#reap`` are still settled (§17 E8).

The spread is a property of the key function alone: any number of ranges, any number of pages,
each shard takes its share and no partition key takes every page. The mixed case runs the reap's
real tasks on moto: a range reap dies with pages (or an intent) recorded, the items are rewritten
as the previous version kept them, and this version's resumed reap settles them where they are.
"""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import ident
from reap_support import World, drive, make_world
from test_retention_ranges import HOUR, RETENTION, accept_many, plan

from lightmetrics.protocol.control_store import plain
from lightmetrics.reaps.gc_marks import (
    LEGACY_MARKS_PK,
    MARKS_SHARDS,
    MarksItem,
    marks_pk,
    marks_pks,
    page_ops,
    page_prefix,
    range_page_prefix,
    stored_marks_items,
)
from lightmetrics.reaps.retention_ranges import RANGE_PK
from lightmetrics.reaps.state import MarkState
from lightmetrics.work import crashpoints


@pytest.mark.parametrize("ranges", [1, 4, 40, 256])
def test_the_pages_of_any_number_of_ranges_spread_over_every_shard_alike(ranges: int) -> None:
    """Every range marking MARKS_SHARDS pages puts exactly ``ranges`` pages on each shard, whatever
    the pass and epoch: no shard takes more than its share, and none is ``checkpoint#reap``."""
    for epoch, passes in ((1, 1), (7, 3)):
        pages = Counter(marks_pk(range_page_prefix(epoch, r, passes, p))
                        for r in range(ranges) for p in range(MARKS_SHARDS))
        assert set(pages.values()) == {ranges} and len(pages) == MARKS_SHARDS
        assert LEGACY_MARKS_PK not in pages and set(pages) == set(marks_pks()[:-1])


def test_gc_pages_take_the_shards_in_turn_and_a_page_is_written_where_it_is_read() -> None:
    gc = [marks_pk(page_prefix(3, p)) for p in range(4 * MARKS_SHARDS)]
    assert Counter(gc) == {pk: 4 for pk in marks_pks()[:-1]}
    assert all(a != b for a, b in zip(gc, gc[1:]))  # consecutive pages: another partition
    ops = page_ops(3, 5, [], MarksItem(MarkState.MARKED, marked_at_ns=1), [(LEGACY_MARKS_PK, "marks#000003#00000005#000")])
    assert [(op.kind, op.pk) for op in ops] == [("Put", marks_pk(page_prefix(3, 5))), ("Delete", LEGACY_MARKS_PK)]


def as_the_previous_version_recorded_them(w: World) -> int:
    """Every marks item moved to ``checkpoint#reap``, and the range items' pages and intents listed
    without ``k``, as the previous version wrote them (docs/protocol.md §17 E8). Returns the items moved."""
    table = w.ctx.table
    items = stored_marks_items(table)
    for item in items:
        table.delete(str(item["pk"]), str(item["sk"]))
        table.put({**item, "pk": LEGACY_MARKS_PK})
    for raw in table.query(RANGE_PK):
        item = plain(raw)
        item["pending"] = [{k: v for k, v in p.items() if k != "k"} for p in item.get("pending") or []]
        if item.get("intent"):
            item["intent"] = {k: v for k, v in item["intent"].items() if k != "k"}
        table.put(item)
    assert len(table.query(LEGACY_MARKS_PK, sk_prefix="marks#")) == len(items)
    return len(items)


@pytest.mark.parametrize("point", ["reap-range.page-recorded", "reap-range.intent-recorded"])
def test_range_pages_an_old_writer_recorded_are_settled_by_the_new_reap(bucket: str, point: str) -> None:
    """A rolling deploy mid-hour: the old version's range tasks recorded pages (or an intent) and
    the execution died; this version resumes the epoch, reads each page where the range item says
    it is (no ``k``: ``checkpoint#reap``), recovers or settles it, and deletes it there."""
    w = make_world(bucket)
    results = accept_many(w, [ident(n) for n in range(8)])
    w.cover_watermark()
    plan(w.ctx, 4)
    hook, _ = crashpoints.crash_once_at(point)
    with crashpoints.hooked(hook), pytest.raises(crashpoints.InjectedCrash):
        drive(w.reaper(), {**RETENTION, "page_size": 2}, w.clock, attempts=1)
    assert as_the_previous_version_recorded_them(w) >= 1
    w.clock.advance(901)  # the lease expired

    report = drive(w.reaper(), {"mode": "retention", "dry_run": False, "resume": True}, w.clock)

    assert report["hours_reaped"] == [str(HOUR)] and (report["marked"], report["purged"]) == (8, 8), report
    assert all(w.versions(r.blob_key) == ([], []) for r in results)
    assert stored_marks_items(w.ctx.table) == [] and w.ctx.table.query(RANGE_PK) == []

