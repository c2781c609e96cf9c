"""Maintenance whose cost follows change, not history (issue 14): the incremental GC source, bounded
GC runs, reaps that continue into new executions, and request counts flat in history.

* G-B1 (docs/protocol.md §15): ``source: by-time`` proves each ``raw-blobs-by-time`` entry once, when
  its hour passes the retry horizon, from a durable cursor (``checkpoint#reap``/``gc#by-time``) that
  moves only in the transaction that records a page; a GC run marks at most ``max_pages`` pages.
* G-B2: after ``max_tasks_per_execution`` tasks a reap continues in a new execution under the same
  lease, epoch and owner; the result equals a single execution's.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import FAST, ident, make_bucket
from reap_support import OLD_NS, World, drive, hour_of, make_world, session

from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import work_context
from lightmetrics.reaps import CHECKPOINT_PK, LEASE_PK, LeaseLost, Reaper, source_cursor_sk

_NS = 1_000_000_000
BY_TIME = {"mode": "gc", "dry_run": False, "source": "by-time"}
HOUR = hour_of(OLD_NS)


def due(w: World, hours: int = 2) -> None:
    """Every raw-blobs-by-time hour written so far passes the retry horizon."""
    w.clock.advance(hours * 3600)


def move_entry(w: World, blob_key: str, hours_later: int) -> None:
    """The blob's raw-blobs-by-time entry as if its blob had been written ``hours_later`` hours on."""
    codec = w.ctx.codec
    sha = codec.parse(blob_key).sha256 or ""
    [old] = [k for k in w.ctx.store.list_keys(codec.prefix + "raw-blobs-by-time/v1/") if sha in k]
    body = w.ctx.store.get(old)
    w.s3.delete_object(Bucket=w.settings.bucket, Key=old)
    w.ctx.store.put_if_absent(codec.raw_blobs_by_time(codec.parse(old).hour + hours_later, sha), body)


def cursor(w: World) -> dict[str, Any]:
    return dict(w.ctx.table.get(CHECKPOINT_PK, source_cursor_sk("by-time")) or {})


def test_by_time_proves_each_blob_once_then_only_hours_that_became_due(bucket: str) -> None:
    w = make_world(bucket)
    kept = [w.accept(ident(n)) for n in range(3)]
    orphans = [w.orphan(ident(10 + n)) for n in range(2)]
    due(w)
    dry = drive(w.reaper(), {**BY_TIME, "dry_run": True}, w.clock)
    assert dry["examined"] == 5 and dry["deletable"] == 2 and cursor(w) == {}  # a dry run moves no cursor
    first = drive(w.reaper(), BY_TIME, w.clock)
    assert (first["examined"], first["purged"], first["kept"]) == (5, 2, {"referenced": 3})
    assert not any(w.blob_exists(o) for o in orphans) and all(w.blob_exists(r.blob_key) for r in kept)
    assert cursor(w)["through"] == first["through"]
    again = drive(w.reaper(), BY_TIME, w.clock)
    assert again["examined"] == 0  # proven once: nothing became due since

    late = w.orphan(ident(30))
    move_entry(w, late, hours_later=3)  # its hour is not due yet
    assert drive(w.reaper(), BY_TIME, w.clock)["examined"] == 0
    due(w, 3)
    last = drive(w.reaper(), BY_TIME, w.clock)
    assert (last["examined"], last["purged"]) == (1, 1) and not w.blob_exists(late)


def test_gc_runs_are_bounded_and_retention_runs_between_them(bucket: str) -> None:
    w = make_world(bucket)
    batches = [w.accept(ident(n), index=False) for n in range(2)]  # retention's hour; no GC candidates
    from lightmetrics.derived.indexing import index_accepted

    for r in batches:
        index_accepted(w.ctx, r.manifest_key)
    orphans = [w.orphan(ident(10 + n)) for n in range(5)]
    w.cover_watermark()
    due(w)
    budget = {**BY_TIME, "page_size": 2, "max_pages": 1}
    first = drive(w.reaper(), budget, w.clock)
    assert first["status"] == "finished" and first["more"] is True and first["examined"] == 2
    assert int(w.ctx.table.get(LEASE_PK, "lease")["expires_at_ns"]) == 0  # released
    # The GC backlog is unfinished, and retention starts and finishes at once.
    retention = drive(w.reaper(), {"mode": "retention", "dry_run": False, "hour": str(HOUR),
                                   "tombstone_wait_s": 0}, w.clock)
    assert retention["hours_reaped"] == [str(HOUR)]
    reports = [first]
    while reports[-1]["more"]:
        reports.append(drive(w.reaper(), budget, w.clock))
    assert len(reports) == 3 and all(r["examined"] <= 2 for r in reports)
    assert sum(r["examined"] for r in reports) == 5 and sum(r["purged"] for r in reports) == 5  # each once
    assert not any(w.blob_exists(o) for o in orphans)


def _continuation_world(runtime: Any) -> World:
    w = make_world(make_bucket(runtime))
    for n in range(3):
        w.accept(ident(n))
    for n in range(4):
        w.orphan(ident(10 + n))
    due(w)
    return w


def _outcome(w: World, report: dict[str, Any]) -> tuple[Any, ...]:
    blobs = sorted(k.rsplit("/", 1)[-1] for k in w.ctx.store.list_keys(w.ctx.codec.prefix + "raw-blobs/v1/"))
    return (tuple(report[k] for k in ("examined", "deletable", "marked", "purged", "restored")), report["kept"],
            len(blobs))


@pytest.mark.parametrize("source", ["by-time", "scan"])
def test_a_reap_spanning_executions_equals_one_execution(runtime: Any, source: str) -> None:
    single, split = _continuation_world(runtime), _continuation_world(runtime)
    inp = {**BY_TIME, "source": source, "page_size": 2, "max_pending_pages": 1}
    one = drive(single.reaper(), inp, single.clock)
    owners: set[tuple[int, str]] = set()
    first_event: list[dict[str, Any]] = []

    def seen(task: str, event: dict[str, Any]) -> None:
        if "reap" in event:
            owners.add((int(event["reap"]["epoch"]), event["reap"]["owner"]))
            first_event.append(event)

    many = drive(split.reaper(), {**inp, "max_tasks_per_execution": 1}, split.clock, before_task=seen)
    assert one["executions"] == 1 and many["executions"] >= 3
    assert len(owners) == 1  # one lease, epoch and owner across every execution (L1-L3 carry over)
    assert _outcome(single, one) == _outcome(split, many)
    # A continuation or task of a reap that ended (its lease released) changes nothing.
    before = split.ctx.table.get(CHECKPOINT_PK, "current")
    stale = Reaper(split.ctx, split.settings)
    with pytest.raises(LeaseLost):
        stale.begin({"input": stale.continuation(first_event[0]["reap"]), "execution_arn": "late"})
    assert split.ctx.table.get(CHECKPOINT_PK, "current") == before


def _seed(w: World, keys: list[str]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: w.ctx.store.put_if_absent(k, b"{}"), keys))


def _counted_reaper(w: World, counter: RequestCounter) -> Reaper:
    ctx = work_context(w.settings, session=session(), clock=w.clock, policy=FAST, counter=counter,
                       component="reap-test")
    return Reaper(ctx, w.settings)


def _gc_counts(runtime: Any, history: int) -> dict[str, int]:
    """An incremental GC run over 2 referenced blobs and 2 orphans after ``history`` entries that
    earlier runs proved (written directly, the cursor where those runs left it)."""
    w = make_world(make_bucket(runtime))
    codec = w.ctx.codec
    old_hour = hour_of(OLD_NS - 48 * 3600 * _NS)
    keys = sorted(codec.raw_blobs_by_time(old_hour + i % 24, hashlib.sha256(b"%d" % i).hexdigest())
                  for i in range(history))
    _seed(w, keys)
    w.ctx.table.put({"pk": CHECKPOINT_PK, "sk": source_cursor_sk("by-time"), "after": keys[-1]})
    for n in range(2):
        w.accept(ident(n))
        w.orphan(ident(10 + n))
    due(w)
    counter = RequestCounter()
    report = drive(_counted_reaper(w, counter), {**BY_TIME, "page_size": 2}, w.clock)
    assert (report["examined"], report["purged"]) == (4, 2), report
    return dict(counter.totals)


def _retention_counts(runtime: Any, history: int) -> dict[str, int]:
    """Retention of one hour of 3 batches beside ``history`` accepted-by-time entries of other hours."""
    w = make_world(make_bucket(runtime))
    codec = w.ctx.codec
    hours = [hour_of(OLD_NS - (24 + h) * 3600 * _NS) for h in range(48)]
    _seed(w, [codec.accepted_by_time_hour(hours[i % 48]) + f"x{i:08d}.json" for i in range(history)])
    for n in range(3):
        w.accept(ident(n))
    w.cover_watermark()
    counter = RequestCounter()
    report = drive(_counted_reaper(w, counter), {"mode": "retention", "dry_run": False, "hour": str(HOUR),
                                                  "tombstone_wait_s": 0, "page_size": 2}, w.clock)
    assert report["hours_reaped"] == [str(HOUR)], report
    return dict(counter.totals)


def test_gc_and_retention_request_counts_are_flat_in_history(runtime: Any) -> None:
    assert _gc_counts(runtime, 100) == _gc_counts(runtime, 1000)
    assert _retention_counts(runtime, 100) == _retention_counts(runtime, 1000)
