"""The reap's checkpoint as a typed record (issue 25 item 3): a new reap's checkpoint is a
:class:`ReapCheckpoint` stored by ``to_item``, a task's changes a :class:`CheckpointChange` stored by
``stored``, and the report a :class:`ReapReport` — with the stored form and the printed report what
they have always been (the attribute names, their order and values below are the ones the untyped
code wrote; docs/control-table.md "Reap checkpoint")."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ident
from memory_support import memory_world
from reap_support import drive

from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.control_store import plain
from lightmetrics.protocol.own_writes import WRITE_TOKEN
from lightmetrics.reaps import Reaper
from lightmetrics.reaps.params import CHECKPOINT_PK, CHECKPOINT_SK, source_cursor_sk
from lightmetrics.reaps.report import report_of
from lightmetrics.reaps.state import CheckpointChange, ReapCheckpoint, ReapPhase

#: the attributes of a new reap's checkpoint, in the order the untyped builder wrote them
FRESH = ["pk", "sk", "epoch", "owner", "mode", "dry_run", "status", "started_at_ns", "updated_at_ns", "owned_since_ns",
         "execution", "params", "scope", "source", "audit_run", "hour", "page_size", "concurrency",
         "max_pending_pages", "tombstone_wait_s", "verify_passes", "phase", "after", "page", "hours", "hour_index",
         "passes", "hour_status", "wait_until_ns", "listing_done", "max_pages", "executions", "range_parallelism"]


def _stored(w: Any) -> dict[str, Any]:
    return plain(w.table.get(CHECKPOINT_PK, CHECKPOINT_SK))


def _kept(names: list[str], *dropped: str) -> list[str]:
    """``names`` but those whose value is None (the adapter's serializer drops them, as DynamoDB's does)."""
    return [n for n in names if n not in dropped]


def test_a_new_gc_checkpoint_is_stored_as_it_always_was() -> None:
    w = memory_world()
    reaper = Reaper(w.ctx, w.settings)
    out = reaper.begin({"input": {"mode": "gc", "dry_run": False, "source": "by-time", "resume": False},
                        "execution_arn": "arn:x"})
    item = _stored(w)
    assert list(item) == _kept([*FRESH, "source_cursor", "through", WRITE_TOKEN], "audit_run", "hour", "through")
    now = w.clock.now_ns()
    assert {k: item.get(k) for k in ("epoch", "owner", "mode", "dry_run", "status", "started_at_ns", "execution",
                                     "params", "source", "audit_run", "hour", "phase", "after", "hours", "hour_status",
                                     "source_cursor", "through")} == {
        "epoch": 1, "owner": out["reap"]["owner"], "mode": "gc", "dry_run": False, "status": "running",
        "started_at_ns": now, "execution": "arn:x", "params": {"mode": "gc", "dry_run": False, "source": "by-time"},
        "source": "by-time", "audit_run": None, "hour": None, "phase": "mark", "after": "", "hours": [],
        "hour_status": {}, "source_cursor": source_cursor_sk("by-time"), "through": None}
    # read back and stored again: the same item (its None values dropped as the table drops them)
    again = {k: v for k, v in ReapCheckpoint.of(item).to_item().items() if v is not None}
    assert again == item and list(again) == list(item)


def test_a_new_dry_run_retention_checkpoint_counts_what_it_would_settle() -> None:
    w = memory_world(now_ns=None)
    w.accept(ident(1))
    w.clock.advance(3 * 86400)
    Reaper(w.ctx, w.settings).begin({"input": {"mode": "retention", "dry_run": True}, "execution_arn": ""})
    item = _stored(w)
    assert list(item) == _kept([*FRESH, "c_would_settle", WRITE_TOKEN], "audit_run", "hour")
    assert (item["phase"], item["c_would_settle"], item["execution"]) == ("commit", 0, "")
    assert item["hours"] and ReapCheckpoint.of(item).hours == item["hours"]


def test_an_audit_gc_with_no_run_ends_at_once_with_its_note() -> None:
    w = memory_world()
    Reaper(w.ctx, w.settings).begin({"input": {"mode": "gc", "dry_run": False, "source": "audit",
                                                          "audit_run": "latest"}})
    item = _stored(w)
    assert list(item) == _kept([*FRESH, "note", WRITE_TOKEN], "audit_run", "hour")
    assert (item["phase"], item["note"]) == ("done", "no committed audit run yet: nothing to prove")


CHANGES = [
    (CheckpointChange(phase=ReapPhase.SETTLE, closing=True, listing_done=True, wait_until_ns=0),
     {"phase": "settle", "listing_done": True, "wait_until_ns": 0, "closing": True}),
    (CheckpointChange(hour_status={"h": "reaped"}, hour_index=1, passes=1, after="", blocked=("a", "b"), ranges=1),
     {"after": "", "passes": 1, "hour_index": 1, "hour_status": {"h": "reaped"}, "ranges": 1, "blocked": ["a", "b"]}),
    (CheckpointChange(status=JobStatus.FAILED, finished_at_ns=7, error="{}"),
     {"status": "failed", "finished_at_ns": 7, "error": "{}"}),
    (CheckpointChange(after="k", page=3, through="2026-08-01T13", budget_exhausted=True),
     {"after": "k", "page": 3, "through": "2026-08-01T13", "budget_exhausted": True}),
    (CheckpointChange(), {}),
]


@pytest.mark.parametrize(("change", "stored"), CHANGES)
def test_a_change_is_stored_by_the_checkpoints_names_and_read_back_as_stored(change: CheckpointChange,
                                                                           stored: dict[str, Any]) -> None:
    assert change.stored() == stored
    cp = ReapCheckpoint.of({"pk": CHECKPOINT_PK, "sk": CHECKPOINT_SK, "epoch": 4, "owner": "o", "mode": "retention",
                            "dry_run": False, "status": "running", "phase": "verify", "hours": ["h"],
                            "c_examined": 2, "kept#young": 1})
    # what a task routes on after its commit is what a read of the committed item gives
    assert cp.with_changes(change) == ReapCheckpoint.of({**cp.to_item(), **stored})


def test_the_report_is_the_one_lmctl_has_always_printed() -> None:
    item = {"pk": CHECKPOINT_PK, "sk": CHECKPOINT_SK, "epoch": 3, "owner": "o", "mode": "retention", "dry_run": False,
            "status": "finished", "started_at_ns": 5, "execution": "arn:e", "phase": "done", "page": 4,
            "hours": ["h1", "h2"], "hour_status": {"h1": "reaped", "h2": "skipped: entries kept appearing"},
            "c_examined": 9, "c_purged": 4, "kept#referenced": 2, "kept#young": 1, "finished_at_ns": 8,
            "blocked": ["k"], "executions": 2, "source": "scan"}
    assert report_of(ReapCheckpoint.of(item)).to_json() == {
        "mode": "retention", "dry_run": False, "epoch": 3, "status": "finished", "phase": "done",
        "examined": 9, "deletable": 0, "marked": 0, "purged": 4, "restored": 0, "would_settle": 0,
        "kept": {"referenced": 2, "young": 1}, "pages": 4, "hours": ["h1", "h2"], "hours_reaped": ["h1"],
        "hours_skipped": {"h2": "skipped: entries kept appearing"}, "started_at_ns": 5, "finished_at_ns": 8,
        "execution": "arn:e", "error": None, "blocked": ["k"], "more": False, "executions": 2, "source": None,
        "through": None, "audit_run": None, "note": None}


def test_a_finished_reap_returns_the_report_of_its_stored_checkpoint() -> None:
    w = memory_world()
    w.orphan(ident(2))
    report = drive(Reaper(w.ctx, w.settings), {"mode": "gc", "dry_run": False}, w.clock)
    assert report == report_of(ReapCheckpoint.of(_stored(w))).to_json()
    assert report["status"] == "finished" and report["purged"] == 1 and report["phase"] == "done", report
