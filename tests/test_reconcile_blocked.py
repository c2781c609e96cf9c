"""BLOCKED entries and the reconciler's in-hour cursor (docs/protocol.md §12 R7): more permanently
BLOCKED entries in a capped hour than the checkpoint can list never stop the cursor, and an entry
left unlisted behind it is checked again before its hour closes (an operator may resume its blocker
while the pass over the hour is still going)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from conftest import FAST
from test_reconcile import H0, make_system, purge
from test_reconcile_bounded import accept_indexed
from test_reconcile_budget import FailingGets, entries_by_key, stamp_as_written_before_the_newest

from lightmetrics.admin import blocker_actions
from lightmetrics.derived import reconcile, reconcile_state
from lightmetrics.derived.indexing import KIND_REPAIR

ENTRIES = 12
CAP = 4  # entries per run
LISTED = 2  # FAILED_ENTRIES_MAX in these tests
BLOCKED_AT = (1, 2, 3, 5, 6)  # more than the checkpoint lists, spread over several runs


class Records:
    """The work context's store: GETs of ``unreadable`` return bytes no reader accepts (a corrupt
    record: the unit ends BLOCKED, invalid-manifest), and every GET is recorded."""

    def __init__(self, store: Any, unreadable: set[str]) -> None:
        self._store, self.unreadable, self.reads, self._lock = store, unreadable, [], threading.Lock()

    def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.reads.append(key)
        if key in self.unreadable:
            return b"not a record"
        return self._store.get(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
def blocked_hour(runtime, clock, monkeypatch):  # type: ignore[no-untyped-def]
    """A settled hour of ``ENTRIES`` entries (margin 0, the last key the newest) whose records at
    ``BLOCKED_AT`` are unreadable; the checkpoint at that hour; room for ``LISTED`` failures."""
    monkeypatch.setattr(reconcile_state, "FAILED_ENTRIES_MAX", LISTED)
    system = make_system(runtime, clock, reconcile_margin_s=0)
    try:
        system.notifications(False)
        purge(system, runtime)
        entries = entries_by_key(system, accept_indexed(system, clock, "blk", ENTRIES))
        stamp_as_written_before_the_newest(system, entries)
        clock.advance(seconds=3600 + 900)  # 17:15: hour 16 has settled
        assert system.reconciler()._save(H0, None, clock.now_ns())
        ctx = system.work_context(policy=FAST)
        records = Records(ctx.store, {entries[n][1].manifest_key for n in BLOCKED_AT})
        reconciler = system.reconciler(dataclasses.replace(ctx, store=records))
        yield system, reconciler, records, [key for key, _ in entries], entries
    finally:
        system.stop()


def reached(cp, keys: list[str]) -> int:  # type: ignore[no-untyped-def]
    """The index of the last entry of H0 the checkpoint's cursor covers; len(keys) once the pass
    over H0 is finished (the scan went on past it), -1 before any."""
    if cp.scan_from == H0:
        return keys.index(cp.scan_after) if cp.scan_after else -1
    return len(keys)


def test_more_blocked_entries_than_the_checkpoint_lists_never_stop_the_cursor(blocked_hour):  # type: ignore[no-untyped-def]
    system, reconciler, _, keys, entries = blocked_hour
    at, per_run = -1, []
    for _ in range(6):
        report = reconciler.run(max_entries=CAP)
        cp = reconciler.checkpoint()
        now_at = reached(cp, keys)
        per_run.append(now_at)
        # every run moves the cursor forward, or finishes the hour
        assert now_at > at, (per_run, report.to_json(), cp)
        assert sum(report.outcomes.values()) <= CAP and report.closed == [], report.to_json()
        at = now_at
        if at == len(keys):
            break
    # run 1 checks 0-3; then each run re-checks the two failures listed and checks two more
    assert per_run == [3, 5, 7, 9, len(keys)], per_run
    open_blockers = {b.object_key for b in system.work_context().blockers.list() if b.kind == KIND_REPAIR}
    assert open_blockers == {entries[n][1].manifest_key for n in BLOCKED_AT}
    assert "blocker" in report.not_closed_because or "listed" in report.not_closed_because, report.to_json()
    # the open blockers keep the hour open (R1) pass after pass; the cursor still moves every run
    for _ in range(3):
        report = reconciler.run(max_entries=CAP)
        assert report.closed == [] and reconciler.checkpoint().hour == H0, report.to_json()


def test_an_unlisted_blocked_entry_whose_blocker_is_resumed_is_checked_again_before_its_hour_closes(  # type: ignore[no-untyped-def]
        blocked_hour):
    """Entries 3, 5 and 6 end BLOCKED behind the cursor and do not fit in the checkpoint. The
    operator repairs the records and resumes every blocker while the pass over the hour is under
    way: the hour must not close before those three are read again (no open blocker is left to
    hold it, and no later run of the pass knows them)."""
    system, reconciler, records, keys, entries = blocked_hour
    for _ in range(3):
        reconciler.run(max_entries=CAP)
    assert reached(reconciler.checkpoint(), keys) == 7
    ctx = system.work_context()
    records.unreadable.clear()  # the operator repairs the records...
    for blocker in ctx.blockers.list():
        blocker_actions.resume(ctx, blocker.work_key, who="ops")  # ...and resumes their blockers
    records.reads.clear()
    unlisted = {entries[n][1].manifest_key for n in (3, 5, 6)}
    for _ in range(8):
        report = reconciler.run(max_entries=CAP)
        assert set(report.outcomes) <= {"NOOP_RESOLVED"}, report.to_json()
        if report.closed:
            break
        assert reconciler.checkpoint().hour == H0
    assert report.closed == [str(H0)], report.to_json()
    assert unlisted <= set(records.reads), sorted(unlisted - set(records.reads))
    assert not ctx.blockers.list()  # every blocker was resumed; none reopened


def test_the_cursor_stops_before_a_retry_later_failure_it_cannot_list_but_never_moves_back(monkeypatch):  # type: ignore[no-untyped-def]
    """Only RETRY_LATER failures hold the cursor back (a BLOCKED one has its blocker), and never
    behind ``floor``, where this run's cursor already is."""
    keys = [f"k{n:02d}" for n in range(8)]
    place = reconcile.Reconciler._cursor_listing_failures
    monkeypatch.setattr(reconcile_state, "FAILED_ENTRIES_MAX", 2)
    assert place(keys, set()) == "k07"
    assert place(keys, {"k01", "k03", "k05"}) == "k04"  # the third does not fit: stop before it
    assert place(keys, {"k00", "k01", "k02"}) == "k01"
    assert place(keys, {"k00", "k01", "k02"}, floor="k03") == "k03"  # never behind the floor
    assert place(keys[5:], {"k05", "k06", "k07"}, floor="k04") == "k06"
    assert place(["k00"], {"k00"}) == "k00"
    monkeypatch.setattr(reconcile_state, "FAILED_ENTRIES_MAX", 0)
    assert place(["k00", "k01"], {"k00"}) is None  # not one entry: the hour again from its start


def test_retry_later_failures_behind_a_cursor_that_may_not_move_back_are_checked_in_the_next_pass(  # type: ignore[no-untyped-def]
        blocked_hour):
    """A cursor at entry 5 whose entries behind it were in flight at its listing: all are checked
    again, and 0, 1 and 2 fail transiently with room for two. The cursor stays at 5 (never behind
    it); the one not listed is remembered by ``scan_after_unlisted``: the pass that finishes the
    hour does not close it, and the next pass reads entry 2 again."""
    system, reconciler, records, keys, entries = blocked_hour
    records.unreadable.clear()
    cp = reconciler.checkpoint()
    assert reconciler._save(H0, cp, cp.last_run_ns, scan_from=H0, scan_after=keys[5], scan_after_before_ns=1)
    ctx = system.work_context(policy=FAST)
    transient = {entries[n][1].manifest_key for n in (0, 1, 2)}
    first = system.reconciler(dataclasses.replace(ctx, store=FailingGets(records, transient))).run(max_entries=8)
    assert first.outcomes == {"RETRY_LATER": 3, "NOOP_RESOLVED": 5}, first.to_json()
    cp = reconciler.checkpoint()
    assert cp.scan_after == keys[5] and cp.scan_after_unlisted and cp.failed_entries == (keys[0], keys[1]), cp
    records.reads.clear()
    second = reconciler.run(max_entries=8)  # 0 and 1 again, then 6 to 11: the pass is finished
    assert second.outcomes == {"NOOP_RESOLVED": 8} and second.closed == [], second.to_json()
    assert "listed again from its start" in second.not_closed_because, second.to_json()
    assert entries[2][1].manifest_key not in records.reads
    for _ in range(3):
        report = reconciler.run(max_entries=8)
        if report.closed:
            break
    assert report.closed == [str(H0)] and entries[2][1].manifest_key in records.reads, report.to_json()


def test_an_operators_skip_stands_and_the_hour_closes(blocked_hour):  # type: ignore[no-untyped-def]
    """Skipped blockers stay skipped however often the reconciler checks their entries again (the
    records are still unreadable), so the hour closes (R1: no open blocker) — a skip is not undone
    by the next failure of the same unit."""
    system, reconciler, _, keys, entries = blocked_hour
    for _ in range(6):
        reconciler.run(max_entries=CAP)
    ctx = system.work_context()
    blocked = {b.work_key for b in ctx.blockers.list()}
    assert len(blocked) == len(BLOCKED_AT)
    for work_key in blocked:
        blocker_actions.skip(ctx, work_key, who="ops", reason="records lost, accepted as such")
    for _ in range(8):
        report = reconciler.run(max_entries=CAP)
        if report.closed:
            break
    assert report.closed == [str(H0)], (report.not_closed_because, report.outcomes, [(b.work_key[-30:], b.status) for b in ctx.blockers.list(status=None)])
    assert {b.work_key: b.status for b in ctx.blockers.list(status=None) if b.work_key in blocked} == \
        {k: "skipped" for k in blocked}
