"""The reconciler's per-run budget (docs/protocol.md §12 R7): re-checks count against the entry cap
whatever the failure history, every run moves its cursor, a failure behind the cursor is checked
again until it succeeds, and listing pages have a cap of their own."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from conftest import FAST
from test_reconcile import H0, make_system, purge
from test_reconcile_bounded import accept_indexed, measured_run
from walk_support import set_last_modified

from lightmetrics.derived import reconcile, reconcile_state
from lightmetrics.derived.indexing import KIND_REPAIR
from lightmetrics.protocol.object_store import TransientStoreError

_NS = 1_000_000_000


def entries_by_key(system, results) -> list[tuple[str, Any]]:  # type: ignore[no-untyped-def]
    """``(accepted-by-time key, accept result)`` in key order (the order the reconciler checks them)."""
    codec = system.work_context().codec
    return sorted((codec.accepted_by_time(H0, codec.parse(r.manifest_key).identity), r) for r in results)


def stamp_as_written_before_the_newest(system, entries) -> None:  # type: ignore[no-untyped-def]
    """Every entry's LastModified well in the past, the last key's newest: with a margin of 0 the
    cursor's bound (the newest LastModified) vouches for every entry behind it that did not fail."""
    base = time.time_ns() // _NS * _NS - 100 * _NS
    for n, (key, _) in enumerate(entries):
        set_last_modified(system.bucket, key, base + (10 * _NS if n == len(entries) - 1 else 0))


def checked(report) -> int:  # type: ignore[no-untyped-def]
    return sum(report.outcomes.values())


class FailingGets:
    """The work context's store, with GETs of ``keys`` failing transiently (a throttled prefix)."""

    def __init__(self, store: Any, keys: set[str]) -> None:
        self._store, self._keys = store, keys

    def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        if key in self._keys:
            raise TransientStoreError(f"injected: GET {key} timed out")
        return self._store.get(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_a_run_under_failed_overflow_stays_within_its_cap_and_checks_each_entry_once(runtime, clock):  # type: ignore[no-untyped-def]
    """More failures than the checkpoint lists once set ``failed_overflow``; it must not make each run
    re-check everything behind its cursor (work growing run after run, a livelock at scale)."""
    system = make_system(runtime, clock, reconcile_margin_s=0)
    try:
        system.notifications(False)
        purge(system, runtime)
        entries = entries_by_key(system, accept_indexed(system, clock, "ovf", 20))
        stamp_as_written_before_the_newest(system, entries)
        clock.advance(seconds=3600 + 900)  # 17:15: hour 16 has settled
        assert system.reconciler()._save(H0, None, clock.now_ns(), failed_overflow=True)
        per_run = []
        for _ in range(6):
            report, _ = measured_run(system, max_entries=5)
            per_run.append(checked(report))
            assert checked(report) <= 5, (per_run, report.to_json())
            assert set(report.outcomes) <= {"NOOP_RESOLVED"}, report.to_json()
            if report.closed:
                break
        assert per_run == [5, 5, 5, 5] and report.closed == [str(H0)], per_run  # every entry once, then closed
        report, _ = measured_run(system, max_entries=5)  # a run over every open hour clears the overflow
        assert not system.reconciler().checkpoint().failed_overflow, report.to_json()
    finally:
        system.stop()


def test_failures_behind_the_cursor_are_checked_again_when_more_fail_than_the_checkpoint_lists(  # type: ignore[no-untyped-def]
        runtime, clock, monkeypatch):
    monkeypatch.setattr(reconcile_state, "FAILED_ENTRIES_MAX", 2)
    system = make_system(runtime, clock, reconcile_margin_s=0)
    try:
        system.notifications(False)
        purge(system, runtime)
        entries = entries_by_key(system, accept_indexed(system, clock, "fail", 12))
        stamp_as_written_before_the_newest(system, entries)
        clock.advance(seconds=3600 + 900)
        assert system.reconciler()._save(H0, None, clock.now_ns())
        failing = {entries[n][1].manifest_key for n in (1, 3, 4)}
        ctx = system.work_context(policy=FAST)
        first = system.reconciler(dataclasses.replace(ctx, store=FailingGets(ctx.store, failing))).run(max_entries=6)
        assert first.outcomes == {"NOOP_RESOLVED": 3, "RETRY_LATER": 3}, first.to_json()
        # three failures, room for two: the cursor stops before the third, which the next run checks
        assert first.continues_after == entries[3][0] and first.closed == [], first.to_json()
        cp = system.reconciler().checkpoint()
        assert set(cp.failed_entries) == {entries[1][0], entries[3][0]} and cp.failed_overflow
        per_run = [checked(first)]
        for _ in range(4):
            report, _ = measured_run(system, max_entries=6)
            per_run.append(checked(report))
            assert checked(report) <= 6 and set(report.outcomes) <= {"NOOP_RESOLVED"}, (per_run, report.to_json())
            if report.closed:
                break
        # run 2: entries 1 and 3 again, then 4 to 7; run 3: 8 to 11, and the hour closes
        assert per_run == [6, 6, 4] and report.closed == [str(H0)], per_run
        budget = system.work_context().budget
        assert all(budget.get(f"{KIND_REPAIR}:{key}") is None for key in failing)  # cleared on success (O1a)
    finally:
        system.stop()


def seed_blob_entries(bucket: str, hours, per_hour: int) -> None:  # type: ignore[no-untyped-def]
    """``per_hour`` raw-blobs-by-time entries in each of ``hours``, written straight into the
    in-process moto server (a busy bucket's blob index, without its batches)."""
    from moto.s3.models import s3_backends

    for account in list(s3_backends.keys()):
        backend = s3_backends[account]["global"]
        if bucket in backend.buckets:
            for hour in hours:
                for n in range(per_hour):
                    backend.put_object(bucket, f"raw-blobs-by-time/v1/{hour.partition}/sha256={n:064x}.json", b"{}")
            return
    raise KeyError(bucket)


def test_a_run_sends_at_most_its_listing_pages_and_the_next_continues(runtime, clock, monkeypatch):  # type: ignore[no-untyped-def]
    """Hours with few entries but a big raw-blobs-by-time index: the listings, not the entries, are
    the run's work; they stop it at an hour boundary as the entry cap does."""
    monkeypatch.setattr(reconcile, "MAX_LIST_PAGES_PER_RUN", 4, raising=False)
    system = make_system(runtime, clock)
    try:
        system.notifications(False)
        purge(system, runtime)
        clock.advance(seconds=-3 * 3600)
        for n in range(4):  # one batch in each of hours 13 to 16
            accept_indexed(system, clock, f"h{n}", 1)
            if n < 3:
                clock.advance(seconds=3600)
        seed_blob_entries(system.bucket, [H0 + k for k in range(-4, 1)], 1001)  # two pages per hour
        assert system.reconciler()._save(H0 + -3, None, clock.now_ns())
        first, cost = measured_run(system)
        # hour 13: its listing (one page) and raw-blobs-by-time hours 13 and 12 (two pages each);
        # the cap (four) is reached inside the hour: the run stops at the next boundary
        assert cost["s3.ListObjectsV2"] == 5 and first.list_pages == 5, (cost, first.to_json())
        assert first.hours_scanned == [str(H0 + -3)] and first.continues_from == str(H0 + -2), first.to_json()
        assert first.outcomes == {"NOOP_RESOLVED": 1}
        scanned = list(first.hours_scanned)
        for _ in range(3):
            report, cost = measured_run(system)
            assert cost["s3.ListObjectsV2"] == 5 and report.outcomes == {"NOOP_RESOLVED": 1}, report.to_json()
            scanned += report.hours_scanned
        assert scanned == [str(H0 + k) for k in range(-3, 1)]  # every hour once, in turn
    finally:
        system.stop()
