"""The reconciler saves its progress as it goes inside an hour (docs/protocol.md §12 R7): a run
killed at any point keeps what it had saved, it saves at least every ``SAVE_EVERY_ENTRIES``
checked entries, and the next run does not check those again; every failure behind a saved cursor
is listed, and a save is conditional on the checkpoint's version (R2)."""

from __future__ import annotations

import dataclasses
import math
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import FAST
from test_reconcile import H0, make_system, purge
from test_reconcile_bounded import accept_indexed, measured_run
from test_reconcile_budget import FailingGets, entries_by_key, stamp_as_written_before_the_newest

from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.derived import reconcile, reconcile_state
from lightmetrics.derived.reconcile import CP_PROGRESS_SAVED
from lightmetrics.derived.reconcile_state import FAILED_ENTRIES_MAX
from lightmetrics.protocol.identity import MAX_ID_BYTES, BatchIdentity
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.work import crashpoints

#: saves inside an hour every N checked entries, in these tests
N = 4
ENTRIES = 18


class KilledAtGet:
    """The work context's store; its ``at``-th GET raises :class:`crashpoints.InjectedCrash` (the
    Lambda timeout, which can fall anywhere, inside a request too) and every GET after it as well."""

    def __init__(self, store: Any, at: int) -> None:
        self._store, self._at, self._gets, self._lock = store, at, 0, threading.Lock()

    def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._gets += 1
            killed = self._gets >= self._at
        if killed:
            raise crashpoints.InjectedCrash(f"killed at GET {self._at} ({key})")
        return self._store.get(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
def long_hour(runtime, clock, monkeypatch):  # type: ignore[no-untyped-def]
    """A settled hour of ``ENTRIES`` healthy entries (margin 0; the last key the newest), saves
    every ``N`` entries, the checkpoint at that hour."""
    monkeypatch.setattr(reconcile, "SAVE_EVERY_ENTRIES", N, raising=False)
    system = make_system(runtime, clock, reconcile_margin_s=0)
    try:
        system.notifications(False)
        purge(system, runtime)
        entries = entries_by_key(system, accept_indexed(system, clock, "long", ENTRIES))
        stamp_as_written_before_the_newest(system, entries)
        clock.advance(seconds=3600 + 900)  # 17:15: hour 16 has settled
        assert system.reconciler()._save(H0, None, clock.now_ns())
        yield system, [key for key, _ in entries], entries
    finally:
        system.stop()


def covered(cp, keys: list[str]) -> int:  # type: ignore[no-untyped-def]
    """How many of the hour's entries (in key order) the checkpoint's in-hour cursor covers."""
    if cp.scan_from != H0 or not cp.scan_after:
        return 0
    return keys.index(cp.scan_after) + 1


@pytest.mark.parametrize("k, j", [(1, 0), (2, 3), (3, 1)])
def test_a_run_killed_after_kN_plus_j_entries_keeps_kN_and_the_next_does_not_check_them_again(  # type: ignore[no-untyped-def]
        long_hour, k, j):
    system, keys, _ = long_hour
    ctx = system.work_context(policy=FAST)
    with pytest.raises(crashpoints.InjectedCrash):  # killed after k*N+j entries, in the next one's GET
        system.reconciler(dataclasses.replace(ctx, store=KilledAtGet(ctx.store, k * N + j + 1))).run()
    cp = system.reconciler().checkpoint()
    assert cp.hour == H0 and covered(cp, keys) >= k * N, (k, j, cp)  # nothing closed; k*N entries kept
    assert not cp.failed_entries and not cp.failed_overflow, cp
    done = covered(cp, keys)

    resumed, cost = measured_run(system)
    # not one of the entries behind the cursor is read again; the rest once each
    assert resumed.verified_earlier == done and resumed.outcomes == {"NOOP_RESOLVED": ENTRIES - done}, resumed.to_json()
    assert cost["s3.GetObject"] == ENTRIES - done, cost
    # progress saved every N entries inside the hour, then after the hour, then the run's own save
    assert cost["dynamodb.PutItem"] == math.ceil((ENTRIES - done) / N) - 1 + 2, cost
    assert resumed.closed == [str(H0)] and system.reconciler().checkpoint().hour == H0 + 1


def test_a_run_killed_right_after_saving_inside_an_hour_keeps_that_save(long_hour):  # type: ignore[no-untyped-def]
    system, keys, _ = long_hour
    hook, seen = crashpoints.crash_once_at(CP_PROGRESS_SAVED)
    with crashpoints.hooked(hook), pytest.raises(crashpoints.InjectedCrash):
        system.reconciler().run()
    cp = system.reconciler().checkpoint()
    assert CP_PROGRESS_SAVED in seen and cp.hour == H0 and cp.scan_after == keys[N - 1], cp
    assert cp.scan_after_failures_listed and cp.scan_after_before_ns > 0, cp
    resumed, cost = measured_run(system)
    assert cost["s3.GetObject"] == ENTRIES - N and resumed.closed == [str(H0)], (cost, resumed.to_json())


def test_a_save_inside_an_hour_lists_every_failure_behind_its_cursor_or_stops_before_it(  # type: ignore[no-untyped-def]
        long_hour, monkeypatch):
    """Failures at entries 1 and 2 with room for one in the checkpoint: the first save's cursor stops
    at entry 1, before the failure that does not fit; the next run checks entry 1 again (listed)
    and entry 2 (past the cursor), and nothing else behind it."""
    monkeypatch.setattr(reconcile_state, "FAILED_ENTRIES_MAX", 1)
    system, keys, entries = long_hour
    ctx = system.work_context(policy=FAST)
    failing = FailingGets(ctx.store, {entries[n][1].manifest_key for n in (1, 2)})
    hook, _ = crashpoints.crash_once_at(CP_PROGRESS_SAVED)
    with crashpoints.hooked(hook), pytest.raises(crashpoints.InjectedCrash):
        system.reconciler(dataclasses.replace(ctx, store=failing)).run()
    cp = system.reconciler().checkpoint()
    assert cp.scan_after == keys[1] and cp.failed_entries == (keys[1],) and cp.failed_overflow, cp
    resumed, cost = measured_run(system)
    assert resumed.outcomes == {"NOOP_RESOLVED": ENTRIES - 1} and cost["s3.GetObject"] == ENTRIES - 1, resumed.to_json()
    assert resumed.closed == [str(H0)]


def test_a_save_inside_an_hour_is_conditional_on_the_version_and_never_overwrites_another_run(  # type: ignore[no-untyped-def]
        long_hour):
    """Another run writes the checkpoint between two of this run's saves: this run's next save fails
    its condition (R2), it stops, and the other run's checkpoint stays."""
    system, keys, _ = long_hour
    other = system.reconciler()
    writes: list[int] = []

    def another_run_saves(name: str) -> None:
        if name == CP_PROGRESS_SAVED and not writes:
            cp = other.checkpoint()
            assert other._save(cp.hour, cp, cp.last_run_ns, scan_from=H0)  # its own progress: no cursor
            writes.append(cp.version + 1)

    counter = RequestCounter()
    with crashpoints.hooked(another_run_saves), counter.operation("reconcile") as op:
        report = system.reconciler(system.work_context(policy=FAST, counter=counter)).run()
    assert report.moved_by_other_run and sum(report.outcomes.values()) == 2 * N, report.to_json()
    cp = system.reconciler().checkpoint()
    assert cp.version == writes[0] and cp.scan_after is None, cp  # the other run's, untouched
    assert op.by_api["dynamodb.PutItem"] == 2  # the first save, and the second, refused


class RecordingTable:
    """A control table that keeps the items it is asked to put (and accepts every condition)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def put(self, values: dict[str, Any], **_: Any) -> None:
        self.items.append(values)


def test_the_checkpoint_with_every_failure_it_may_list_stays_far_below_the_item_limit():  # type: ignore[no-untyped-def]
    """FAILED_ENTRIES_MAX entry keys of the longest identities under a long prefix, plus the cursor:
    the item DynamoDB stores stays under a quarter of its 400 KB limit (attribute names and values,
    as DynamoDB counts them)."""
    codec = KeyCodec("p" * 64 + "/")
    longest = "x" * MAX_ID_BYTES
    keys = sorted(codec.accepted_by_time(H0, BatchIdentity.create(longest, f"{n:0{MAX_ID_BYTES}d}", n, n))
                  for n in range(FAILED_ENTRIES_MAX + 10))
    table = RecordingTable()
    ctx = SimpleNamespace(table=table, codec=codec)
    rec = reconcile.Reconciler(ctx, None, None)  # type: ignore[arg-type]
    # every checked entry failed (RETRY_LATER): the cursor stops before the first one the checkpoint cannot list
    cursor = rec._cursor_listing_failures(keys, set(keys))
    failed, overflow, unlisted = rec._failed_after(None, set(keys), H0, H0 + -1, H0, False, retry_now=set(keys),
                                                   cursor=(H0, cursor))
    assert cursor is not None and failed == tuple(keys[:keys.index(cursor) + 1]) and overflow and not unlisted
    assert rec._save(H0, None, 1, 1, verified_through=H0, scan_from=H0, failed_entries=failed,
                     failed_overflow=overflow, scan_after=cursor, scan_after_before_ns=1)
    item = {name: value for name, value in table.items[-1].items() if value is not None}
    size = sum(len(name.encode()) + len(str(value).encode())
               for name, value in item.items() if name != "failed_entries")
    size += sum(len(key.encode()) + 1 for key in item["failed_entries"])
    assert size < 100_000, (size, len(item["failed_entries"]))


def test_the_cost_model_saves_as_often_as_the_reconciler():  # type: ignore[no-untyped-def]
    from lightmetrics.operator_tools.cost_workload import Assumptions

    assert Assumptions().reconcile_save_every == reconcile.SAVE_EVERY_ENTRIES
