"""A conditional write whose answer was lost is recognised as our own (docs/protocol.md §11.1).

On moto's DynamoDB, with the fault at the client: the request lands, its answer times out, and
botocore sends it again (the control table's client keeps botocore's retries). The retry fails its
own condition. Every conditional create or conditioned update of the control table must then read
what is there and carry on as a success when it is its own write — never report it as someone else's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from conftest import ident
from memory_support import memory_world, walk
from reap_support import drive, make_table, make_world, session

from lightmetrics.acceptance.conflict_records import ConflictEntry, register
from lightmetrics.aws.control_table import ControlTable
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.derived.hour_ranges import RangePlans
from lightmetrics.derived.indexing import index_accepted
from lightmetrics.derived.reconcile_state import CHECKPOINT_SK, write_checkpoint
from lightmetrics.derived.walk import Walker, read_watermarks
from lightmetrics.derived.walk.state import set_watermark
from lightmetrics.harness.testing.faults import FaultInjector, FaultRule
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.control_store import ConditionFailed
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.own_writes import WRITE_TOKEN, WrittenByOther, put_own, update_own
from lightmetrics.reaps import Reaper
from lightmetrics.reaps.retention_ranges import RangeTask
from lightmetrics.work import leases
from lightmetrics.work.blockers import BlockerStore
from lightmetrics.work.outcome import Outcome
from lightmetrics.work.retry_budget import RetryBudget

_NS = 1_000_000_000
NOW = 1_764_000_000 * _NS
HOUR = UtcHour.of_unix_ns(NOW)


@pytest.fixture
def table(runtime: Any) -> ControlTable:
    name = f"lost-{uuid.uuid4().hex[:8]}"
    make_table(name)
    return ControlTable(session().client("dynamodb"), name)


def lose_answer(table: ControlTable, operation: str, pk: str, after: int = 0) -> FaultRule:
    """The next ``operation`` on ``pk`` (after ``after`` of them) lands, its answer is lost, botocore retries it."""
    return FaultInjector(table.client).add(FaultRule(fault="timeout_after_landing", operation=operation,
                                                     body_contains=pk, after=after))


def _lease_fresh(table: ControlTable) -> str:
    item = leases.take(table, "lease#lost", None, owner="me", lease_seconds=60, now_ns=NOW, what="walk",
                       execution="exec-1")
    return f"epoch {item.epoch}"


def _lease_over_expired(table: ControlTable) -> str:
    leases.take(table, "lease#lost", None, owner="earlier", lease_seconds=60, now_ns=NOW - 3600 * _NS, what="walk")
    before = leases.read(table, "lease#lost")
    item = leases.take(table, "lease#lost", before, owner="me", lease_seconds=60, now_ns=NOW, what="walk")
    return f"epoch {item.epoch}"


def _range_plan(table: ControlTable) -> str:
    plan = RangePlans(table).propose(["m"], effective_from=HOUR + 48, now_ns=NOW)
    return f"{plan.ranges} ranges"


def _reconcile_checkpoint(table: ControlTable) -> str:
    assert write_checkpoint(table, CHECKPOINT_SK, HOUR, None, NOW), "the reconciler lost its own checkpoint"
    return "written"


def _conflict_record(table: ControlTable) -> str:
    entry = ConflictEntry("c1", "q", "agent-a", "boot-1", 0, 9, "m", "b", "s" * 64, "b2", "t" * 64, 10, NOW,
                          "col-a", "col-b")
    assert register(table, entry), "the conflict record it wrote was called an earlier one"
    return "registered"


def _blocker(table: ControlTable) -> str:
    created = BlockerStore(table, FrozenClock(NOW)).open_once("work-1", kind="k", object_key="o", reason="r",
                                                          source="test")
    assert created, "the blocker it opened was called an earlier one"
    return "opened"


def _watermark(table: ControlTable) -> str:
    assert set_watermark(table, "by-time", NOW, epoch=1, now_ns=NOW), "the watermark it raised was called unmoved"
    return "raised"


# (site, the operation whose answer is lost, the partition key it writes, writes to let through first, the call)
SITES: list[tuple[str, str, str, int, Callable[[ControlTable], str]]] = [
    ("lease-take", "PutItem", "lease#lost", 0, _lease_fresh),
    ("lease-take-over-expired", "PutItem", "lease#lost", 1, _lease_over_expired),
    ("range-plan", "PutItem", "plan#hour-ranges", 0, _range_plan),
    ("reconcile-checkpoint", "PutItem", "checkpoint#reconcile", 0, _reconcile_checkpoint),
    ("conflict-record", "PutItem", "conflicts", 0, _conflict_record),
    ("blocker-open-once", "PutItem", "blockers", 0, _blocker),
    ("watermark", "UpdateItem", "watermark#by-time", 0, _watermark),
]


@pytest.mark.parametrize(("operation", "pk", "after", "call"), [s[1:] for s in SITES], ids=[s[0] for s in SITES])
def test_a_conditional_write_whose_answer_was_lost_is_recognised_as_our_own(
        table: ControlTable, operation: str, pk: str, after: int, call: Callable[[ControlTable], str]) -> None:
    rule = lose_answer(table, operation, pk, after)
    call(table)  # raises (LeaseHeld, RangePlanError, ...) or asserts if its own write is someone else's
    assert rule.fired == 1, "the fault never fired: the test proves nothing"


def test_a_write_that_really_is_another_s_still_fails_and_says_what_is_there(table: ControlTable) -> None:
    put_own(table, {"pk": "p", "sk": "s", "who": "other"}, condition="attribute_not_exists(pk)")
    with pytest.raises(WrittenByOther) as lost:
        put_own(table, {"pk": "p", "sk": "s", "who": "me"}, condition="attribute_not_exists(pk)")
    assert lost.value.current is not None and lost.value.current["who"] == "other"
    assert isinstance(lost.value, ConditionFailed)  # callers' existing handling keeps working
    leases.take(table, "lease#x", None, owner="a", lease_seconds=60, now_ns=NOW, what="walk", execution="exec-other")
    with pytest.raises(leases.LeaseHeld, match="execution exec-other"):
        leases.take(table, "lease#x", None, owner="b", lease_seconds=60, now_ns=NOW, what="walk", execution="exec-b")


def test_a_condition_that_failed_at_its_first_attempt_costs_no_read(table: ControlTable) -> None:
    """Cost: a background job that finds its record already there (the walk re-registering every
    conflict, GC re-opening a blocker) sends no more requests than before; only a retried request
    can have failed against its own write, and only then is the item read back."""
    counter = RequestCounter()
    counter.attach(table.client)
    entry = ConflictEntry("c1", "q", "agent-a", "boot-1", 0, 9, "m", "b", "s" * 64, "b2", "t" * 64, 10, NOW,
                          "col-a", "col-b")
    blockers = BlockerStore(table, FrozenClock(NOW))
    assert register(table, entry) and blockers.open_once("w", kind="k", object_key="o", reason="r", source="t")
    assert not register(table, entry) and not blockers.open_once("w", kind="k", object_key="o", reason="r", source="t")
    assert counter.totals == {"dynamodb.PutItem": 4}
    with pytest.raises(WrittenByOther) as lost:
        put_own(table, {"pk": "blockers", "sk": "w"}, condition="attribute_not_exists(pk)")
    assert counter.totals["dynamodb.GetItem"] == 0
    assert lost.value.current is not None and lost.value.current["status"] == "open"  # read when asked
    assert counter.totals["dynamodb.GetItem"] == 1


def test_an_update_whose_answer_was_lost_returns_the_item_it_wrote(table: ControlTable) -> None:
    table.put({"pk": "p", "sk": "s", "n": 1})
    rule = lose_answer(table, "UpdateItem", '"p"')
    item = update_own(table, "p", "s", "SET #n = :two", names={"#n": "n"}, values={":one": 1, ":two": 2},
                      condition="#n = :one")
    assert rule.fired == 1 and item["n"] == 2 and item[WRITE_TOKEN]
    # an expression without a SET clause gets one; a clause after SET keeps working
    item = update_own(table, "p", "s", "ADD #n :one", names={"#n": "n"}, values={":one": 1},
                      condition="attribute_exists(pk)")
    assert item["n"] == 3
    item = update_own(table, "p", "s", "REMOVE #q SET #n = :one", names={"#n": "n", "#q": "q"},
                      values={":one": 1}, condition="attribute_exists(pk)")
    assert item["n"] == 1


def test_a_retry_budget_failure_whose_answer_was_lost_counts_once(table: ControlTable) -> None:
    """Protocol §11.1 CW2: the budget's count is idempotent — a failure whose UpdateItem landed and
    whose answer was lost, retried by botocore, is one failure, not two (else a unit is promoted to
    a blocker an attempt early). Both of record_failure's writes: counting on, and starting over."""
    budget = RetryBudget(table, max_count=3, max_age_s=3600, clock=FrozenClock(NOW))
    rule = lose_answer(table, "UpdateItem", "budget#w1")
    assert budget.record_failure("w1", "503").count == 1 and rule.fired == 1
    rule = lose_answer(table, "UpdateItem", "budget#w1")
    state = budget.record_failure("w1", "503")
    assert rule.fired == 1 and (state.count, state.exhausted) == (2, False)
    assert int(table.get("budget#w1", "budget")["count"]) == 2
    later = RetryBudget(table, max_count=3, max_age_s=3600, clock=FrozenClock(NOW + 7200 * _NS))
    rule = lose_answer(table, "UpdateItem", "budget#w1", after=1)  # the reset of the stale item
    assert later.record_failure("w1", "503").count == 1 and rule.fired == 1


# --------------------------------------------------------------------------- the walk's writes, end to end
# S3 in memory, the control table on moto with the fault at its client: a whole walk.
WALK_SITES = [
    ("walk-lease-take", "PutItem", "lease#walk"),
    ("walk-checkpoint-create", "PutItem", '"current"'),
    ("walk-page-cursor", "UpdateItem", ":prev"),
    ("walk-watermark", "UpdateItem", "watermark#"),
]


class PageRecordingWalker(Walker):
    """Keeps every page task's result: a page that calls its own cursor move "stale" counts nothing."""

    pages: list[dict[str, Any]]

    def page(self, event: dict[str, Any]) -> dict[str, Any]:
        result = super().page(event)
        self.pages.append(result)
        return result


@pytest.mark.parametrize(("operation", "marker"), [s[1:] for s in WALK_SITES], ids=[s[0] for s in WALK_SITES])
def test_a_walk_whose_write_answer_was_lost_finishes_as_if_nothing_happened(
        table: ControlTable, operation: str, marker: str) -> None:
    w = memory_world(settle_s=600)
    for i in range(4):
        w.accept(ident(i, agent=f"agent-{i % 2}"))
    ctx = replace(w.ctx, table=table, blockers=BlockerStore(table, w.clock),
                  budget=RetryBudget(table, max_count=5, max_age_s=3600, clock=w.clock))
    rule = lose_answer(table, operation, marker)
    walker = PageRecordingWalker(ctx, w.settings)
    walker.pages = []
    summary = walk(walker, w.clock, page_size=2, full=True)
    assert rule.fired == 1, "the fault never fired: the test proves nothing"
    assert not [p for p in walker.pages if p.get("stale")], "a page took its own cursor move for a twin's"
    assert summary["status"] == "finished" and summary["watermark_withheld"] is None, summary
    assert summary["keys_accepted"] == 4, summary
    assert all(v is not None for v in read_watermarks(table).values())


# --------------------------------------------------------------------------- the reap's writes, end to end
REAP_SITES = [
    ("reap-lease-take", "PutItem", "lease#reap"),
    ("reap-checkpoint-create", "PutItem", '"current"'),
]


@pytest.mark.parametrize(("operation", "marker"), [s[1:] for s in REAP_SITES], ids=[s[0] for s in REAP_SITES])
def test_a_reap_whose_write_answer_was_lost_finishes_as_if_nothing_happened(
        table: ControlTable, operation: str, marker: str) -> None:
    w = memory_world()
    w.accept(ident(5))
    orphan = w.orphan(ident(6))
    ctx = replace(w.ctx, table=table, blockers=BlockerStore(table, w.clock),
                  budget=RetryBudget(table, max_count=5, max_age_s=3600, clock=w.clock))
    rule = lose_answer(table, operation, marker)
    report = drive(Reaper(ctx, w.settings), {"mode": "gc", "dry_run": False}, w.clock)
    assert rule.fired == 1, "the fault never fired: the test proves nothing"
    assert report["status"] == "finished" and report["purged"] == 1, report
    assert w.store.head(orphan) is None


# --------------------------------------------------------------------------- S3 creates outside the accept path
def test_a_pipeline_create_whose_answer_was_lost_is_reported_created(runtime: Any, bucket: str) -> None:
    """The rollup's manifest, the audit's summary and commit marker, chunks and inventory parts all
    go through ``s3io.put_if_absent``: its own landed create is ``created``, not someone's ``exists``."""
    from lightmetrics_pipeline import s3io

    access = s3io.S3Access(bucket=bucket, endpoint_url=runtime.endpoint_url, region="us-east-1",
                           access_key="testing", secret_key="testing")
    key = f"rollup/v1/lost-{uuid.uuid4().hex[:8]}/manifest.json"
    faults = FaultInjector(s3io.client(access))
    rule = faults.add(FaultRule(fault="timeout_after_landing", operation="PutObject", key_contains=key))
    try:
        assert s3io.put_if_absent(access, key, b'{"mine": true}') == "created"
        assert rule.fired == 1
        assert s3io.put_if_absent(access, key, b'{"other": true}') == "exists"  # a real second writer still is
    finally:
        faults.clear()


def test_a_derived_entry_whose_answer_was_lost_is_done_not_found_done() -> None:
    """In memory (fast): both entries of a record land and lose their answers; the indexer wrote them."""
    w = memory_world()
    result = w.accept(ident(1), index=False)
    for index in ("accepted-by-blob/", "accepted-by-time/"):
        w.store.fail("PutObject", "RequestTimeout", key_contains=index, landed=True)
    assert index_accepted(w.ctx, result.manifest_key) is Outcome.DONE
    assert index_accepted(w.ctx, result.manifest_key) is Outcome.NOOP_RESOLVED  # really there already


def test_a_retention_range_whose_item_write_answer_was_lost_reaps_the_hour(bucket: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention in 2 key ranges on moto (S3 and the table): the first ``PutItem`` of a range item
    lands and loses its answer; the range task carries on as the owner it is, not a stale "twin"."""
    from test_retention_ranges import HOUR, RETENTION, accept_many, plan

    results: list[dict[str, Any]] = []

    def recording(phase: Callable[[RangeTask], dict[str, Any]]) -> Callable[[RangeTask], dict[str, Any]]:
        def run(self: RangeTask) -> dict[str, Any]:
            results.append(phase(self))
            return results[-1]
        return run

    monkeypatch.setattr(RangeTask, "gc", recording(RangeTask.gc))
    monkeypatch.setattr(RangeTask, "derived", recording(RangeTask.derived))
    w = make_world(bucket)
    accept_many(w, [ident(n) for n in range(6)])
    w.cover_watermark()
    plan(w.ctx, 2)
    rule = lose_answer(w.ctx.table, "PutItem", "checkpoint#reap#range")
    report = drive(w.reaper(), {**RETENTION, "page_size": 2}, w.clock)
    assert rule.fired == 1, "the fault never fired: the test proves nothing"
    assert not [r for r in results if r.get("stale")], "a range task took its own write for a twin's"
    assert report["hours_reaped"] == [str(HOUR)] and report["purged"] == 6, report
