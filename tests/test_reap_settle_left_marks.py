"""Issue 23, property 2: every reap settles the marks a failed GC left before it finishes, in every
mode and shape (docs/protocol.md §15 G-I8; docs/reaps.md).

The marks: a GC proved an orphan, an accept of the same identity raced it (its blob PUT answered
412, its record was created before the marker landed), the GC placed the marker, recorded the page,
and failed before its settle. The blob is hidden under a delete marker while a record names it.
The next reap — whatever its mode, source, scope or range plan — must restore it before it ends.

Every case runs the reap's real task methods against the moto server (``reap_support.drive``, the
state machine's loop in Python, the Ranges Map's tasks included).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from conftest import FAST, ident, make_frame
from reap_support import OLD_NS, World, drive, make_world, session
from test_invariant_reaps import deletes_counted, reap_state, takeover
from test_retention_ranges import plan

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_accepted
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps import LeaseLost
from lightmetrics.reaps.gc_marks import LEGACY_MARKS_PK, stored_marks_items
from lightmetrics.work import crashpoints

HOUR = UtcHour.of_unix_ns(OLD_NS)
RETENTION = {"mode": "retention", "dry_run": False, "tombstone_wait_s": 0}
#: The next reap, by kind and shape: its input, the range plan of HOUR (1: none), rollups of HOUR.
NEXT_REAPS: dict[str, tuple[dict[str, Any], int, bool]] = {
    "retention-1-range": ({**RETENTION, "hour": str(HOUR)}, 1, False),
    "retention-4-ranges": ({**RETENTION, "hour": str(HOUR)}, 4, False),
    "retention-4-ranges-unscoped": (RETENTION, 4, False),
    "retention-nothing-expired": (RETENTION, 0, False),  # no batch in an expired hour: no hour to reap
    "retention-rollup": ({**RETENTION, "scope": "rollup", "hour": str(HOUR)}, 0, True),
    "gc-latest": ({"mode": "gc", "dry_run": False, "source": "audit", "audit_run": "latest"}, 1, False),
    "gc-scan": ({"mode": "gc", "dry_run": False}, 1, False),
    "gc-by-time": ({"mode": "gc", "dry_run": False, "source": "by-time"}, 1, False),
}


class GcFailed(Exception):
    """The failed GC's task dies after recording its page (the ASL's Catch ends the reap failed)."""


def hidden_blob_a_failed_gc_left(w: World) -> tuple[str, str]:
    """The race of the module docstring, for real: an orphan; a GC proves it; at that moment an
    accept of its identity gets 412 on the blob and creates its record (in a recent hour, no
    retention's); the GC marks the blob, records the page and fails. Returns ``(blob key, its
    version id)``."""
    identity = ident(50)
    blob = w.orphan(identity, variant=0.5)
    version = w.ctx.store.head(blob).version_id
    recent = accept_context(w.settings, session=session(), clock=FrozenClock(w.clock.now_ns()), policy=FAST)

    def race(name: str) -> None:
        if name == "gc.proved":
            result = accept_batch(recent, identity, make_frame(identity, 0.5))  # the blob PUT answers 412
            assert result.manifest_key and not result.duplicate, result
            index_accepted(w.ctx, result.manifest_key)
        if name == "reap.page-recorded":
            raise GcFailed(name)

    with crashpoints.hooked(race), pytest.raises(GcFailed):
        drive(w.reaper(), {"mode": "gc", "dry_run": False}, w.clock, attempts=1)
    assert w.ctx.store.head(blob) is None, "the failed GC left the blob hidden"
    assert marks_left(w), "the failed GC left its marks"
    return blob, version


def marks_left(w: World) -> list[dict[str, Any]]:
    return stored_marks_items(w.ctx.table)


def prepare(w: World, ranges: int, rollups: bool) -> None:
    """HOUR's batches (expired), its range plan, its rollups, as the next reap's shape needs."""
    if ranges:
        for n in range(8):
            w.accept(ident(n))
    w.cover_watermark()
    if ranges > 1:
        plan(w.ctx, ranges)
    if rollups:
        w.rollups(HOUR)


@pytest.mark.parametrize("shape", sorted(NEXT_REAPS))
def test_every_reap_settles_the_marks_a_failed_gc_left_before_it_finishes(bucket: str, shape: str) -> None:
    inp, ranges, rollups = NEXT_REAPS[shape]
    w = make_world(bucket)
    prepare(w, ranges, rollups)
    blob, version = hidden_blob_a_failed_gc_left(w)

    report = drive(w.reaper(), inp, w.clock)

    assert report["status"] == "finished", report
    head = w.ctx.store.head(blob)
    versions, markers = w.versions(blob)
    assert head is not None and head.version_id == version, (
        f"{shape}: the blob a record names is still hidden after the reap finished: versions {versions}, "
        f"delete markers {markers}, marks left {[m['sk'] for m in marks_left(w)]}, report {report}")
    assert markers == [] and versions == [version], (versions, markers)
    assert marks_left(w) == [], f"{shape}: marks left unsettled: {[m['sk'] for m in marks_left(w)]}"
    assert report["restored"] >= 1, report


@pytest.mark.parametrize("shape", ["retention-4-ranges", "retention-rollup"])
def test_a_dry_run_of_any_kind_leaves_the_marks_a_failed_gc_left_untouched(bucket: str, shape: str) -> None:
    """The settle before finishing is a real reap's: a dry run only reports (nothing deleted)."""
    inp, ranges, rollups = NEXT_REAPS[shape]
    w = make_world(bucket)
    prepare(w, ranges, rollups)
    blob, _ = hidden_blob_a_failed_gc_left(w)
    left = marks_left(w)
    with deletes_counted(w) as counts:
        counts["on"] = 1
        report = drive(w.reaper(), {**inp, "dry_run": True}, w.clock)
    assert report["status"] == "finished" and counts["deletes"] == 0, (report, counts)
    assert marks_left(w) == left and w.ctx.store.head(blob) is None


def test_a_settle_before_finishing_that_lost_its_lease_changes_nothing_afterwards(bucket: str) -> None:
    """Rule L2 covers the settle a retention of several ranges runs before it ends: the takeover
    lands once the settle has re-checked the failed GC's mark, right before its deletes; from then
    on the task deletes and writes nothing."""
    inp, ranges, _ = NEXT_REAPS["retention-4-ranges"]
    w = make_world(bucket)
    prepare(w, ranges, False)
    blob, _ = hidden_blob_a_failed_gc_left(w)
    taken: list[dict[str, Any]] = []
    at_takeover: list[Any] = []
    lock = threading.Lock()
    with deletes_counted(w) as counts:
        def lose_the_lease(name: str) -> None:
            with lock:
                # the hour is reaped (its marker written): what follows is the settle before finishing
                if name == "gc.rechecked" and w.ctx.store.head(w.ctx.codec.retention_reaped("raw", HOUR)) \
                        and not taken:
                    taken.append(takeover(w))
                    at_takeover.append(reap_state(w))
                    counts["on"] = 1

        with crashpoints.hooked(lose_the_lease), pytest.raises(LeaseLost):
            drive(w.reaper(), {**inp, "concurrency": 1}, w.clock, attempts=1)
    assert taken, "the settle before finishing never re-checked the failed GC's mark"
    assert counts["deletes"] == 0, f"{counts['deletes']} deletes after the lease was lost"
    assert reap_state(w) == at_takeover[0], "the settle changed the bucket or the control table after losing its lease"
    assert w.ctx.store.head(blob) is None and marks_left(w), "the mark stays for the lease's holder"


def as_the_previous_version_wrote_them(w: World) -> list[str]:
    """Every marks item moved to where the previous version kept them all, ``checkpoint#reap`` (a
    reap of the old code failed mid-upgrade, docs/protocol.md §17); returns their sort keys."""
    table, moved = w.ctx.table, []
    for item in stored_marks_items(table):
        table.delete(str(item["pk"]), str(item["sk"]))
        table.put({**item, "pk": LEGACY_MARKS_PK})
        moved.append(str(item["sk"]))
    old = [str(i["sk"]) for i in table.query(LEGACY_MARKS_PK, sk_prefix="marks#")]
    assert moved and sorted(old) == sorted(moved)
    return moved


@pytest.mark.parametrize("shape", ["retention-4-ranges", "gc-scan", "retention-1-range"])
def test_marks_an_old_writer_left_under_checkpoint_reap_are_settled_by_the_new_reap(bucket: str, shape: str) -> None:
    """A rolling deploy: the failed GC ran the previous version, which kept every marks item under
    ``checkpoint#reap``; the next reap runs this version, which writes the marks shards. It still
    finds the old items (rule G-I8 across the upgrade, §17), restores the blob they hid and deletes
    them where they are."""
    inp, ranges, rollups = NEXT_REAPS[shape]
    w = make_world(bucket)
    prepare(w, ranges, rollups)
    blob, version = hidden_blob_a_failed_gc_left(w)
    assert as_the_previous_version_wrote_them(w)

    report = drive(w.reaper(), inp, w.clock)

    assert report["status"] == "finished" and report["restored"] >= 1, report
    head = w.ctx.store.head(blob)
    assert head is not None and head.version_id == version and w.versions(blob) == ([version], [])
    assert not w.ctx.table.query(LEGACY_MARKS_PK, sk_prefix="marks#") and marks_left(w) == []


def test_a_gc_page_intent_an_old_writer_left_is_recovered_where_it_is(bucket: str) -> None:
    """The previous version recorded a GC page's intent under ``checkpoint#reap`` and died before
    its markers were recorded; this version's next reap recovers that intent (rule L3) and settles
    it: nothing is left under either key, and the orphan is gone."""
    w = make_world(bucket)
    orphan = w.orphan(ident(60))

    def die(name: str) -> None:
        if name == "reap.intent-recorded":
            raise GcFailed(name)

    with crashpoints.hooked(die), pytest.raises(GcFailed):
        drive(w.reaper(), {"mode": "gc", "dry_run": False}, w.clock, attempts=1)
    as_the_previous_version_wrote_them(w)
    assert [i["state"] for i in w.ctx.table.query(LEGACY_MARKS_PK, sk_prefix="marks#")] == ["intent"]
    w.clock.advance(3600)  # the failed reap's lease expired; its writer cannot be running (L3)

    report = drive(w.reaper(), {"mode": "gc", "dry_run": False}, w.clock)

    assert report["status"] == "finished" and report["purged"] >= 1, report
    assert not w.ctx.table.query(LEGACY_MARKS_PK, sk_prefix="marks#") and marks_left(w) == []
    assert w.versions(orphan) == ([], [])
