"""Retention reaps one hour's key ranges in parallel (issue 14, "keeps up"; docs/protocol.md §16,
"An hour in R ranges").

An expired hour whose range plan (:mod:`lightmetrics.derived.hour_ranges`) has R > 1 ranges runs its blobs
and derived phases per range, in separate Lambda invocations: the ``Ranges`` Map of
infra/statemachines/reap.asl.json, ``range_parallelism`` at once. The properties:

* every entry, its ``accepted-by-blob`` entry and its blob are deleted exactly once, the hour is
  marked reaped, and the requests per batch are those of the one-range reap (a & flat in size);
* the range tasks run at once on moto's interpreter (its inline Map runs iterations on threads);
* a range task that lost the lease changes nothing afterwards (rule L2);
* a reap of 4 ranges continues into new executions (rule G-B2) and finishes;
* an entry written late in range 2 is found by verify and reaped in a second pass (R-I8);
* two range tasks proving, marking and settling one blob at once end clean;
* a crash at every point a range reap passes, then the retry: nothing lost, nothing counted twice.

The state-machine tests run the real ASL on moto's Step Functions with the tasks in the runtime's
function host (as tests/test_reap_statemachine.py); the others drive the same task methods in
Python (``reap_support.drive``, which runs a Map visit's range tasks on threads).
"""

from __future__ import annotations

import contextvars
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import ALL_BACKENDS, FAST, ident, make_bucket, make_frame
from reap_support import OLD_NS, World, drive, make_world, request_recorder
from test_retention_late import stale_writer

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.hour_ranges import RangePlans, equal_count_cuts
from lightmetrics.derived.indexing import index_accepted, index_raw_blob, write_accepted_entries
from lightmetrics.derived.walk import INDEXES, set_watermark
from lightmetrics.harness.bench.cost_table import execution_counts
from lightmetrics.local.system import LocalSystem
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.clock import FrozenClock, OffsetClock
from lightmetrics.protocol.control_store import plain
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest
from lightmetrics.reaps import (
    EVENTS_PER_MAP_VISIT,
    EVENTS_PER_RANGE_ITERATION,
    InvalidReapInput,
    LeaseLost,
    ReapParams,
)
from lightmetrics.reaps.gc_marks import decode_marks_item, marks_pk, stored_marks_items
from lightmetrics.reaps.retention_ranges import RANGE_PK
from lightmetrics.work import crashpoints

#: A representative core on MiniStack too: the ranges' deletes, a lost lease, a late entry, two tasks at once,
#: a resumed reap — their storage steps. The cost counts, crash points (every step; tests/test_reap_crash.py
#: runs the reap's on both) and state-machine tests stay on moto, keeping MiniStack's share of the suite short.
STORAGE = pytest.mark.backends(*ALL_BACKENDS)

_NS = 1_000_000_000
HOUR = UtcHour.of_unix_ns(OLD_NS)
RETENTION = {"mode": "retention", "dry_run": False, "hour": str(HOUR), "tombstone_wait_s": 0}


def entry_names(ctx: Any, hour: UtcHour = HOUR) -> list[str]:
    return [k.rsplit("/", 1)[1] for k in ctx.store.list_keys(ctx.codec.accepted_by_time_hour(hour), limit=100_000)]


def plan(ctx: Any, ranges: int, names: list[str] | None = None) -> Any:
    """A plan of ``ranges`` equal-count ranges for HOUR, written as an operator would (two hours ahead)."""
    cuts = equal_count_cuts(names if names is not None else entry_names(ctx), ranges)
    written = RangePlans(ctx.table).propose(cuts, effective_from=HOUR, now_ns=(HOUR + -2).start_ns)
    assert written.ranges == ranges
    return written


def accept_many(w: World, idents: list[Any]) -> list[Any]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(w.accept, idents))


def derived_left(w: World, results: list[Any]) -> list[str]:
    codec = w.ctx.codec
    left = list(w.ctx.store.list_keys(codec.accepted_by_time_hour(HOUR)))
    for r in results:
        m = AcceptedBatchManifest.from_bytes(w.ctx.store.get(r.manifest_key))
        key = codec.accepted_by_blob(m.frame_sha256, m.identity)
        if w.ctx.store.head(key) is not None:
            left.append(key)
    return left


# ---------------------------------------------------------------------- the input, the history bound
def test_range_parallelism_is_validated_with_a_clear_message() -> None:
    assert ReapParams.parse({"mode": "retention", "dry_run": True}).range_parallelism == 16
    assert ReapParams.parse({"mode": "retention", "dry_run": True, "range_parallelism": 40}).range_parallelism == 40
    for bad in (0, 41, "8", True, 2.5):
        with pytest.raises(InvalidReapInput, match=r"range_parallelism must be an integer in \[1, 40\].*MaxConcurrency"):
            ReapParams.parse({"mode": "retention", "dry_run": True, "range_parallelism": bad})


# ------------------------------------------------------------------- (a) exactly once, Python-driven
@STORAGE
def test_every_entry_blob_and_derived_entry_of_four_ranges_is_deleted_exactly_once(bucket: str) -> None:
    w = make_world(bucket)
    results = accept_many(w, [ident(n) for n in range(16)])
    w.old.clock.advance(3600)  # a batch of the next hour: its hour is not reaped, nothing of it may go
    kept = w.accept(ident(99))
    w.old.clock.advance(-3600)
    w.cover_watermark()
    plan(w.ctx, 4)
    deletes: dict[tuple[str, str | None], int] = {}
    lock = threading.Lock()

    def on_delete(params: dict[str, Any], **_: Any) -> None:
        with lock:
            for o in params["Delete"]["Objects"]:
                k = (o["Key"], o.get("VersionId"))
                deletes[k] = deletes.get(k, 0) + 1

    ranges_run: set[tuple[str, int]] = set()

    def before_task(task: str, event: dict[str, Any]) -> None:
        if "range" in event:
            with lock:
                ranges_run.add((task, int(event["range"]["r"])))

    w.s3.meta.events.register("before-parameter-build.s3.DeleteObjects", on_delete)
    try:
        report = drive(w.reaper(), {**RETENTION, "page_size": 2}, w.clock, range_threads=4, before_task=before_task)
    finally:
        w.s3.meta.events.unregister("before-parameter-build.s3.DeleteObjects", on_delete)
    assert report["hours_reaped"] == [str(HOUR)], report
    # each range in its own tasks: the blobs in the GC role, the derived entries in the retention role
    assert ranges_run == {(task, r) for task in ("gc", "retention") for r in range(4)}, ranges_run
    assert (report["examined"], report["marked"], report["purged"], report["pages"]) == (16, 16, 16, 8), report
    codec = w.ctx.codec
    expected: set[tuple[str, str | None]] = set()
    for r in results:
        m = AcceptedBatchManifest.from_bytes(w.ctx.store.get(r.manifest_key))  # records stay (R-I1)
        expected |= {(codec.accepted_by_time(HOUR, m.identity), None),
                     (codec.accepted_by_blob(m.frame_sha256, m.identity), None), (r.blob_key, None)}
        assert w.versions(r.blob_key) == ([], []), r.blob_key  # neither version nor marker left
    by_key = {(k, None if v is None else "v") for k, v in deletes}
    assert expected <= by_key
    # exactly once: one key of a DeleteObjects per derived entry, per marker placed, per version purged
    assert all(n == 1 for n in deletes.values()), {k: n for k, n in deletes.items() if n > 1}
    assert all(k.startswith((codec.prefix + "accepted-by-time/v1/" + HOUR.partition,
                             codec.prefix + "accepted-by-blob/v1/", codec.prefix + "raw-blobs/v1/",
                             codec.prefix + "raw-blobs-by-time/v1/")) for k, _ in deletes)
    assert w.blob_exists(kept.blob_key) and w.ctx.store.head(codec.accepted_by_time(HOUR + 1, ident(99)))
    assert w.ctx.store.head(codec.retention_reaped("raw", HOUR)) is not None
    assert derived_left(w, results) == []
    # the ranges' items are gone with the pass; their marks were settled
    table = w.ctx.table
    assert table.query(RANGE_PK) == [] and not stored_marks_items(table)
    assert verify(w.ctx, strict=True).ok


# ----------------------------------------------------------- on moto's Step Functions interpreter
def make_system(runtime: Any, **overrides: Any) -> LocalSystem:
    tag = uuid.uuid4().hex[:10]
    system = LocalSystem(runtime, bucket=f"lm-rr-{tag}", table=f"lm-rr-{tag}", secret_name=f"lm-rr/{tag}",
                         queue_name_prefix=f"rr{tag}-", clock=OffsetClock(120 * _NS),
                         overrides={"retry_horizon_s": 60, "gc_grace_s": 1, "retention_s": 86400, **overrides})
    system.provision().notifications(False)
    return system


@pytest.fixture
def system(runtime):  # type: ignore[no-untyped-def]
    s = make_system(runtime)
    yield s
    s.stop()


def seed(system: LocalSystem, runtime: Any, n: int, ranges: int) -> list[Any]:
    """``n`` batches accepted in HOUR and indexed (agents of 8 batches), W covering it; a plan of
    ``ranges`` equal ranges (none for 1)."""
    ctx = system.work_context(policy=FAST)
    actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=FrozenClock(OLD_NS), policy=FAST)

    def one(identity: Any) -> Any:
        r = accept_batch(actx, identity, make_frame(identity))
        index_accepted(ctx, r.manifest_key)
        index_raw_blob(ctx, r.blob_key)
        return r

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, [ident(k, agent=f"agent-{k // 8}") for k in range(n)]))
    now = system.clock.now_ns()
    for index in INDEXES:  # as a clean full walk would
        set_watermark(ctx.table, index, now - 3600 * _NS, epoch=1, now_ns=now)
    if ranges > 1:
        plan(ctx, ranges)
    return results


def reap_counted(system: LocalSystem, *, wrap: Any = None, **inp: Any) -> tuple[dict[str, int], dict[str, Any], list[str]]:
    """One reap through the state machine, every execution it continued into: requests by API of
    its tasks, states entered and Lambda tasks (from the histories); its report; its executions."""
    counter = RequestCounter()
    system.register_task_functions(counter=counter, wrap=wrap)
    control = system.reap_control()
    followed = control.follow(control.start(**inp), poll_s=0.05, timeout_s=300)
    assert followed.status == "finished", followed.detail
    sfn = system.runtime.boto3_client("stepfunctions")
    arns = [e["executionArn"] for e in sfn.list_executions(stateMachineArn=system.state_machine_arn("reap"))["executions"]]
    return {**dict(counter.totals), **execution_counts(sfn, arns)}, followed.report.to_json(), arns


#: APIs a batch costs a fixed number of (docs/reaps.md "What a batch costs retention"), and the
#: per-page and per-hour ones that do not depend on how the hour is split.
#: DeleteObjects: 6 a page (markers; versions, markers, hints; accepted-by-blob, accepted-by-time),
#: pages of 4 entries here.
PER_BATCH = {"s3.GetObject": 2, "s3.DeleteObjects": 6 / 4}
SAME_SPLIT_OR_NOT = ("s3.GetObject", "s3.DeleteObjects", "s3.ListObjectsV2", "s3.PutObject")
MEASURED: dict[tuple[int, int], dict[str, int]] = {}


@pytest.mark.parametrize("batches", [32, 64])
def test_four_ranges_cost_per_batch_what_one_range_costs(runtime: Any, batches: int) -> None:
    """The same hour reaped in 1 and in 4 ranges (pages of 4 entries; each range a whole number of
    pages): identical S3 requests per batch and per page, fewer tombstone HEADs (a range task proves
    and settles several pages), and no more DynamoDB or Step Functions requests per batch."""
    for ranges in (1, 4):
        # No grace: how many Map visits an hour takes must not depend on the real clock (with a 1-s
        # grace a range task finds its marks due or not by timing, and each visit has a cost).
        system = make_system(runtime, gc_grace_s=0)
        try:
            results = seed(system, runtime, batches, ranges)
            counts, report, arns = reap_counted(system, mode="retention", dry_run=False, hour=str(HOUR),
                                                page_size=4, tombstone_wait_s=1)
            visits = map_visits(system.runtime.boto3_client("stepfunctions"), arns[0])
            assert (len(visits) > 0) == (ranges > 1), visits  # one range: today's execution, no Map
            assert report["hours_reaped"] == [str(HOUR)] and report["purged"] == batches, report
            ctx = system.work_context()
            assert not any(ctx.store.head(r.blob_key) for r in results)
            assert ctx.store.list_keys(ctx.codec.accepted_by_time_hour(HOUR)) == []
            assert verify(ctx, strict=True).ok
            MEASURED[(ranges, batches)] = counts
        finally:
            system.stop()
    one, four = MEASURED[(1, batches)], MEASURED[(4, batches)]
    print(f"\n{batches} batches: 1 range {one}\n{batches} batches: 4 ranges {four}")
    for api, per in PER_BATCH.items():
        assert one[api] == four[api] == per * batches, api  # flat: the same per batch at both sizes
    for api in SAME_SPLIT_OR_NOT:
        assert four[api] == one[api], api
    assert four["s3.HeadObject"] <= one["s3.HeadObject"]  # tombstone HEADs: one per task that proves or settles
    # DynamoDB: a range costs a few requests of its own (its plan Query, its item, the planning of
    # the Map's visits; the number of visits varies with the real 1-s grace), a page fewer.
    assert ddb(four) <= ddb(one) + 10 * 4, (ddb(four), ddb(one))
    assert four["lambda.Invoke"] <= one["lambda.Invoke"] and four["sfn.transitions"] <= one["sfn.transitions"]


def ddb(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k.startswith("dynamodb."))


def test_per_batch_cost_of_four_ranges_is_flat_in_the_hours_size() -> None:
    """Runs after the parametrized cases: what 32 more batches cost, per batch, in 1 and in 4 ranges."""
    if len(MEASURED) < 4:
        pytest.skip("needs both sizes of test_four_ranges_cost_per_batch_what_one_range_costs")
    for ranges in (1, 4):
        small, large = MEASURED[(ranges, 32)], MEASURED[(ranges, 64)]
        marginal = {k: (large.get(k, 0) - small.get(k, 0)) / 32 for k in sorted(set(small) | set(large))}
        print(f"\n{ranges} range(s): requests per batch (32 -> 64 batches): {marginal}")
        for api, per in PER_BATCH.items():
            assert marginal[api] == per
    per_batch = {r: {k: (MEASURED[(r, 64)].get(k, 0) - MEASURED[(r, 32)].get(k, 0)) / 32 for k in MEASURED[(r, 64)]}
                 for r in (1, 4)}
    for api in SAME_SPLIT_OR_NOT:
        assert per_batch[4][api] == per_batch[1][api], api
    assert per_batch[4]["s3.HeadObject"] <= per_batch[1]["s3.HeadObject"]
    assert (ddb(MEASURED[(4, 64)]) - ddb(MEASURED[(4, 32)])) <= (ddb(MEASURED[(1, 64)]) - ddb(MEASURED[(1, 32)]))


# ------------------------------------------------------------ (b) the range tasks really overlap
class InFlight:
    """Wraps the hosted reap tasks: counts range-task invocations in flight at once. Each range task
    is held 0.3 s (on AWS one runs for minutes), so that iterations the Map starts together overlap."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.calls: list[tuple[str, int]] = []

    def wrap(self, step: str, handler: Any) -> Any:
        def wrapped(event: dict[str, Any], context: Any) -> Any:
            if "range" not in event:
                return handler(event, context)
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
                self.calls.append((step, int(event["range"]["r"])))
            try:
                time.sleep(0.3)
                return handler(event, context)
            finally:
                with self.lock:
                    self.now -= 1
        return wrapped


def test_range_tasks_run_at_once_in_separate_invocations_on_the_state_machine(system: LocalSystem,
                                                                               runtime: Any) -> None:
    """moto's inline Map runs its iterations on threads (as many as MaxConcurrency allows), and the
    function host serves each Lambda invocation on its own thread: the range tasks overlap."""
    results = seed(system, runtime, 16, 4)
    flight = InFlight()
    counts, report, arns = reap_counted(system, wrap=flight.wrap, mode="retention", dry_run=False, hour=str(HOUR),
                                        page_size=2, tombstone_wait_s=1, range_parallelism=4)
    assert report["hours_reaped"] == [str(HOUR)] and report["purged"] == 16, report
    assert flight.most >= 2, f"range tasks never overlapped: {flight.calls}"
    assert flight.most <= 4  # range_parallelism: the Map's MaxConcurrencyPath
    assert {r for _, r in flight.calls} == {0, 1, 2, 3}
    assert {step for step, _ in flight.calls} == {"gc", "retention"}  # each in its role's function
    ctx = system.work_context()
    assert not any(ctx.store.head(r.blob_key) for r in results) and verify(ctx, strict=True).ok
    sfn = system.runtime.boto3_client("stepfunctions")
    visits = map_visits(sfn, arns[0])
    assert visits and all(v["events"] <= EVENTS_PER_MAP_VISIT + v["iterations"] * EVENTS_PER_RANGE_ITERATION
                          for v in visits), visits


def test_range_parallelism_one_runs_one_range_task_at_a_time(system: LocalSystem, runtime: Any) -> None:
    seed(system, runtime, 8, 4)
    flight = InFlight()
    _, report, _ = reap_counted(system, wrap=flight.wrap, mode="retention", dry_run=False, hour=str(HOUR),
                                page_size=2, tombstone_wait_s=1, range_parallelism=1)
    assert report["hours_reaped"] == [str(HOUR)] and flight.most == 1 and len(flight.calls) >= 8


def map_visits(sfn: Any, arn: str) -> list[dict[str, int]]:
    """Each visit of the Ranges Map in an execution's history: its events (MapStateEntered through
    MapStateExited) and its iterations."""
    events, kwargs = [], {"executionArn": arn, "maxResults": 1000}
    while True:
        page = sfn.get_execution_history(**kwargs)
        events += page["events"]
        if not page.get("nextToken"):
            break
        kwargs["nextToken"] = page["nextToken"]
    visits, current = [], None
    for e in events:
        if e["type"] == "MapStateEntered":
            current = {"events": 0, "iterations": 0}
        if current is not None:
            current["events"] += 1
            current["iterations"] += e["type"] == "MapIterationStarted"
        if e["type"] == "MapStateExited" and current is not None:
            visits.append(current)
            current = None
    return visits


# --------------------------------------------------------------- (d) continuation across executions
def test_a_reap_of_four_ranges_continues_into_new_executions_and_finishes(system: LocalSystem, runtime: Any) -> None:
    """Rule G-B2 with the Map: max_tasks_per_execution 1 — every execution runs one visit at most,
    then continues; the range items (cursors, pending marks) carry over; the result is complete."""
    results = seed(system, runtime, 16, 4)
    _, report, arns = reap_counted(system, mode="retention", dry_run=False, hour=str(HOUR), page_size=2,
                                   tombstone_wait_s=1, max_tasks_per_execution=1)
    assert report["hours_reaped"] == [str(HOUR)], report
    assert (report["examined"], report["marked"], report["purged"]) == (16, 16, 16), report
    assert report["executions"] >= 3 and len(arns) == report["executions"], (report["executions"], len(arns))
    sfn = system.runtime.boto3_client("stepfunctions")
    assert all(sfn.describe_execution(executionArn=a)["status"] == "SUCCEEDED" for a in arns)
    assert sum(len(map_visits(sfn, a)) for a in arns) >= 2  # the ranges' work crossed executions
    ctx = system.work_context()
    assert not any(ctx.store.head(r.blob_key) for r in results) and verify(ctx, strict=True).ok
    assert system.reap_control().lease_live() is None


class InRangeTask:
    """``drive``'s ``before_task``: remembers, in the task's context (which the task's request pools
    copy, ``lightmetrics.work.pool``), whether it is a range task — so a crash-point hook knows where it
    fired — and which ranges ran."""

    def __init__(self) -> None:
        self.current: contextvars.ContextVar[int | None] = contextvars.ContextVar(f"range-{id(self)}", default=None)
        self.ranges: set[int] = set()

    def __call__(self, task: str, event: dict[str, Any]) -> None:
        r = int(event["range"]["r"]) if "range" in event else None
        self.current.set(r)
        if r is not None:
            self.ranges.add(r)

    @property
    def here(self) -> bool:
        return self.current.get() is not None


# --------------------------------------------------- (c) a range task that lost the lease (rule L2)
def control_items(w: World) -> list[dict[str, Any]]:
    """The range items and every marks item, as stored (what a range task writes)."""
    table = w.ctx.table
    marks = stored_marks_items(table)
    return sorted((plain(i) for i in [*table.query(RANGE_PK), *marks]), key=lambda i: (i["pk"], i["sk"]))


#: Points inside a range task after which it deletes or writes more (one request at a time, so the
#: takeover lands between two of them): its markers, its purges, its derived deletes, its records.
LOST_IN_RANGE_AT = ["reap-range.intent-recorded", "gc.marked-one", "gc.rechecked", "retention.derived-one",
                    "retention.by-time-one", "reap-range.page-recorded"]


@pytest.mark.parametrize("point", LOST_IN_RANGE_AT)
@STORAGE
def test_a_range_task_that_lost_the_lease_changes_nothing_afterwards(bucket: str, point: str) -> None:
    w = make_world(bucket)
    accept_many(w, [ident(n) for n in range(8)])
    w.cover_watermark()
    plan(w.ctx, 4)
    taken: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []
    deletes = {"on": 0, "n": 0}
    lock = threading.Lock()
    where = InRangeTask()

    def count_delete(**_: Any) -> None:
        if deletes["on"]:
            deletes["n"] += 1

    def lose_the_lease(name: str) -> None:
        with lock:
            if name != point or taken:
                return
            assert where.here, f"{point} fired outside a range task"
            w.clock.advance(901)  # the lease expired; epoch B takes it (a new reap)
            taken.append(w.reaper().begin({"input": {"mode": "gc", "dry_run": True}, "execution_arn": "epoch-b"}))
            before.extend(control_items(w))
            deletes["on"] = 1  # from here on, the range task must not delete or write anything

    for op in ("DeleteObject", "DeleteObjects"):
        w.s3.meta.events.register(f"before-send.s3.{op}", count_delete)
    try:
        with crashpoints.hooked(lose_the_lease), pytest.raises(LeaseLost):
            drive(w.reaper(), {**RETENTION, "page_size": 2, "concurrency": 1}, w.clock, attempts=1,
                  before_task=where)
    finally:
        for op in ("DeleteObject", "DeleteObjects"):
            w.s3.meta.events.unregister(f"before-send.s3.{op}", count_delete)
    assert taken, f"{point} was never reached"
    assert deletes["n"] == 0, f"the range task sent {deletes['n']} DeleteObject after losing its lease at {point}"
    assert control_items(w) == before, "the range task wrote its items after losing its lease"
    lease = w.reaper().lease()
    assert (lease.epoch, lease.owner) == (taken[0]["reap"]["epoch"], taken[0]["reap"]["owner"])


# --------------------------------------------------- (e) a late entry in range 2: verify, second pass
@STORAGE
def test_an_entry_written_late_in_range_two_is_found_by_verify_and_reaped(bucket: str) -> None:
    """A late writer (a stale "not tombstoned" answer; D5: accepted-by-blob first) indexes a record
    of HOUR in range 2 after range 2's derived listing has passed: verify lists it, the hour runs a
    second pass over every range (new range items), and nothing derived outlives the hour."""
    w = make_world(bucket)
    results = accept_many(w, [ident(n) for n in range(13) if n != 7])
    late = w.accept(ident(7), index=False)
    w.cover_watermark()
    late_name = w.ctx.codec.accepted_by_time(HOUR, ident(7)).rsplit("/", 1)[1]
    names = entry_names(w.ctx)
    the_plan = plan(w.ctx, 4, sorted([*names, late_name]))
    assert the_plan.range_of(late_name) == 2, "the test needs the late entry in range 2"
    writer = stale_writer(w)
    record = AcceptedBatchManifest.from_bytes(w.ctx.store.get(late.manifest_key))
    table = w.ctx.table
    written: list[str] = []

    def late_write(name: str) -> None:
        if name != "reap-range.derived-recorded" or written:
            return
        range_two = [i for i in table.query(RANGE_PK) if int(i["range"]) == 2]
        if range_two and range_two[0]["phase"] == "done":  # range 2's listing has passed everything
            write_accepted_entries(writer, late.manifest_key, record)
            written.append(name)

    with crashpoints.hooked(late_write):
        report = drive(w.reaper(), {**RETENTION, "page_size": 2}, w.clock)
    assert written, "range 2 never finished its derived listing"
    assert report["hours_reaped"] == [str(HOUR)], report
    marker = w.ctx.store.get(w.ctx.codec.retention_reaped("raw", HOUR))
    assert b'"verify_passes":2' in marker, marker
    assert derived_left(w, [*results, late]) == []
    assert not w.blob_exists(late.blob_key) and w.versions(late.blob_key) == ([], [])
    assert report["purged"] == 13, report


# ------------------------------------------------------- (4) two range tasks deleting one blob at once
@STORAGE
def test_two_range_tasks_proving_marking_and_settling_one_blob_at_once_end_clean(bucket: str) -> None:
    """In the real system two entries of an hour never share a blob: a frame carries its identity, so
    a blob belongs to one record (docs/protocol.md §3.1), one record has one entry, and an entry lies
    in one range. A record forged to name another's blob makes the case anyway: two range tasks (two
    threads) prove the blob together, both mark it, and both settle it together — the collector's
    handshake is safe for two deleters: nothing else is touched, no version or marker is left, and
    both settles end clean."""
    w = make_world(bucket)
    a = w.accept(ident(1))
    codec = w.ctx.codec
    ma = AcceptedBatchManifest.from_bytes(w.ctx.store.get(a.manifest_key))
    forged = ma.model_copy(update={"seq_start": ident(2).seq_start, "seq_end": ident(2).seq_end})
    b_key = codec.accepted(ident(2))
    w.ctx.store.put_if_absent(b_key, forged.to_bytes())
    index_accepted(w.ctx, b_key)
    other = w.accept(ident(3))  # a blob of its own in the same hour
    w.cover_watermark()
    names = sorted(entry_names(w.ctx))
    name_a, name_b = (codec.accepted_by_time(HOUR, ident(n)).rsplit("/", 1)[1] for n in (1, 2))
    the_plan = RangePlans(w.ctx.table).propose([min(name_a, name_b)], effective_from=HOUR,
                                                         now_ns=(HOUR + -2).start_ns)
    assert the_plan.range_of(name_a) != the_plan.range_of(name_b) and len(names) == 3
    together = {p: threading.Barrier(2, timeout=30) for p in ("gc.proved", "gc.rechecked")}
    arrivals: dict[str, list[str]] = {p: [] for p in together}
    lock = threading.Lock()

    def meet(name: str) -> None:
        if name in together:
            with lock:
                arrivals[name].append(threading.current_thread().name)
                first_two = len(arrivals[name]) <= 2
            if first_two:
                together[name].wait()  # both range tasks are here before either goes on

    with crashpoints.hooked(meet):
        report = drive(w.reaper(), {**RETENTION, "page_size": 10}, w.clock, range_threads=2)
    assert report["hours_reaped"] == [str(HOUR)], report
    assert all(len(set(v[:2])) == 2 for v in arrivals.values()), arrivals  # two threads met at each point
    # Both proofs found the shared blob deletable; both placed a marker and both settled it "purged".
    assert (report["marked"], report["purged"], report["restored"]) == (3, 3, 0), report
    assert w.versions(a.blob_key) == ([], []) and w.versions(other.blob_key) == ([], [])
    assert w.ctx.store.get(a.manifest_key) and w.ctx.store.get(b_key)  # records stay (R-I1)
    hint_prefix = codec.prefix + "raw-blobs-by-time/v1/"
    assert not [k for k in w.ctx.store.list_keys(hint_prefix) if ma.frame_sha256 in k]
    assert verify(w.ctx, strict=True).ok


# ------------------------------------------------------------------ (5) a crash at every range step
#: Every point a reap in ranges passes: the range tasks' own (``reap-range.*``, every one registered),
#: the collector's and retention's inside a range task, the hour's, and a continuation's.
RANGE_REAP_POINTS = sorted({p for p in crashpoints.REGISTRY if p.startswith("reap-range.")}
                           | {"gc.proved", "gc.marked-one", "gc.rechecked", "gc.purged-version", "gc.settled-one",
                              "retention.derived-one", "retention.by-time-one", "retention.tombstoned",
                              "retention.committed", "retention.reaped-marker", "reap.retention-step",
                              "reap.continued", "reap.continuation-begun"})
CRASH_RESULTS: dict[str, str] = {}
#: Of those, the hour's own steps and a continuation's; every other one fires inside a range task.
HOUR_POINTS = {"retention.tombstoned", "retention.committed", "retention.reaped-marker", "reap.retention-step",
               "reap.continued", "reap.continuation-begun", "reap-range.folded"}


@pytest.mark.parametrize("point", RANGE_REAP_POINTS)
def test_a_crash_at_every_step_of_a_range_reap_then_the_retry_loses_and_repeats_nothing(runtime: Any,
                                                                                        point: str) -> None:
    """Killed once at ``point`` (the task is retried with the same input, as the ASL's Retry does),
    the reap of 4 ranges (pages of 1, two tasks an execution) still reaps the hour completely; its
    counts are exact (a page's effects are counted once, with the write that records them); the
    next hour's batch is untouched."""
    w = make_world(make_bucket(runtime))
    results = accept_many(w, [ident(n) for n in range(8)])
    w.old.clock.advance(3600)
    kept = w.accept(ident(99))
    w.old.clock.advance(-3600)
    w.cover_watermark()
    plan(w.ctx, 4)
    hook, seen = crashpoints.crash_once_at(point)
    fired: list[tuple[str, bool]] = []
    where = InRangeTask()

    def recording(name: str) -> None:
        try:
            hook(name)
        except crashpoints.InjectedCrash:
            fired.append((name, where.here))
            raise

    with crashpoints.hooked(recording):
        report = drive(w.reaper(), {**RETENTION, "page_size": 1, "max_tasks_per_execution": 2}, w.clock,
                       range_threads=2, before_task=where)
    assert [name for name, _ in fired] == [point], f"{point} was never reached (reached: {sorted(seen)})"
    assert fired[0][1] == (point not in HOUR_POINTS), f"{point}: in a range task {fired[0][1]}"
    assert where.ranges == {0, 1, 2, 3}
    assert report["hours_reaped"] == [str(HOUR)], report
    assert (report["examined"], report["marked"], report["purged"], report["restored"]) == (8, 8, 8, 0), report
    for r in results:
        assert w.ctx.store.get(r.manifest_key) is not None and w.versions(r.blob_key) == ([], []), r.blob_key
    assert derived_left(w, results) == []
    assert w.blob_exists(kept.blob_key) and w.ctx.store.head(w.ctx.codec.accepted_by_time(HOUR + 1, ident(99)))
    table = w.ctx.table
    assert not stored_marks_items(table)
    report_ok = verify(w.ctx, strict=True)
    assert report_ok.ok, report_ok.violations
    CRASH_RESULTS[point] = "crashed once, retried, reaped"


def test_every_range_step_was_killed() -> None:
    # Runs after the parametrized cases (file order): every registered range point was exercised.
    assert set(CRASH_RESULTS) == set(RANGE_REAP_POINTS), sorted(set(RANGE_REAP_POINTS) - set(CRASH_RESULTS))


# ------------------------------------------------------------------------- IAM of the range tasks
def test_every_s3_request_of_a_range_task_is_allowed_by_its_function_spec(bucket: str) -> None:
    """These tasks run here as the deployer, and moto does not evaluate s3:prefix conditions
    (docs/deploy.md, "IAM enforced locally"): each range task runs in an existing function (reap-gc for a range's
    blobs, reap-retention for its derived entries), so its requests must fit that function's spec."""
    from lightmetrics.deployment.resources import SPEC

    w = make_world(bucket)
    accept_many(w, [ident(n) for n in range(8)])
    w.cover_watermark()
    plan(w.ctx, 4)
    task = {"name": "reap-begin"}
    seen: list[tuple[str, str, str]] = []

    record = request_recorder(task, seen)

    def before(nxt: str, event: Any) -> None:
        task["name"] = f"reap-{nxt}" + (" (range)" if "range" in event else "")

    w.s3.meta.events.register("before-parameter-build.s3", record)
    drive(w.reaper(), {**RETENTION, "page_size": 2}, w.clock, before_task=before)
    allowed = {"GetObject": "s3_read", "HeadObject": "s3_read", "PutObject": "s3_write",
               "ListObjectsV2": "s3_list", "ListObjectVersions": "s3_list", "DeleteObject": "s3_delete"}
    refused = []
    for name, op, where in seen:
        prefixes = getattr(SPEC.function(name.removesuffix(" (range)")), allowed.get(op, "none"), ())
        if not any(where.startswith(w.ctx.codec.prefix + p) for p in prefixes):
            refused.append((name, op, where))
    assert {n for n, _, _ in seen} >= {"reap-gc (range)", "reap-retention (range)"}
    assert not refused, f"{len(refused)} requests a deployed role refuses, e.g. {refused[:5]}"


# ------------------------------------------------------------------ resume; one task stays bounded
@STORAGE
def test_a_resumed_reap_takes_over_the_ranges_of_its_epoch(bucket: str) -> None:
    """The execution dies right after a range recorded an intent (its markers may be on their way);
    ``resume`` continues the same epoch under a new owner: each range item is taken over at its
    first write, and the intent is recovered only once its writer cannot be running (rule L3)."""
    w = make_world(bucket)
    results = accept_many(w, [ident(n) for n in range(8)])
    w.cover_watermark()
    plan(w.ctx, 4)

    def die(name: str) -> None:
        if name == "reap-range.intent-recorded":
            raise crashpoints.InjectedCrash(name)

    with crashpoints.hooked(die), pytest.raises(crashpoints.InjectedCrash):
        drive(w.reaper(), {**RETENTION, "page_size": 2}, w.clock, attempts=1)
    table = w.ctx.table
    [first_owner] = {i["owner"] for i in table.query(RANGE_PK)}
    intents = [plain(i)["intent"] for i in table.query(RANGE_PK) if "intent" in i]
    intended = {m.key for intent in intents for k in range(int(intent["n"]))
                for m in decode_marks_item(table.get(marks_pk(intent['p']), f"{intent['p']}{k:03d}"), w.ctx.codec).marks}
    assert intents and intended
    w.clock.advance(901)  # the lease expired
    resumed_at = w.clock.now_ns()
    markers_at: list[int] = []

    def on_delete(params: dict[str, Any], **_: Any) -> None:
        if any(o["Key"] in intended and "VersionId" not in o for o in params["Delete"]["Objects"]):
            markers_at.append(w.clock.now_ns())

    w.s3.meta.events.register("before-parameter-build.s3.DeleteObjects", on_delete)
    try:
        report = drive(w.reaper(), {"mode": "retention", "dry_run": False, "resume": True}, w.clock)
    finally:
        w.s3.meta.events.unregister("before-parameter-build.s3.DeleteObjects", on_delete)
    assert report["hours_reaped"] == [str(HOUR)] and report["epoch"] == 1, report
    # the dead owner's intent: its markers placed only once that owner cannot be running (L3)
    assert markers_at and min(markers_at) >= resumed_at + 660 * _NS, (markers_at, resumed_at)
    assert (report["marked"], report["purged"]) == (8, 8), report
    assert all(w.versions(r.blob_key) == ([], []) for r in results)
    assert table.query(RANGE_PK) == [] and verify(w.ctx, strict=True).ok
    assert first_owner != w.reaper().lease().owner


def test_one_range_task_does_a_bounded_piece_of_its_range(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A range task stops after RANGE_TASK_UNITS units, and starts none once RANGE_TASK_SECONDS have
    passed: one Map iteration's events and one Lambda's time stay bounded, whatever the range's size."""
    import lightmetrics.reaps.retention_ranges as ranges_module

    w = make_world(bucket)
    accept_many(w, [ident(n) for n in range(12)])
    w.cover_watermark()
    plan(w.ctx, 2)  # 6 entries a range: 6 pages of 1
    monkeypatch.setattr(ranges_module, "RANGE_TASK_UNITS", 4)
    units: list[tuple[int, str]] = []

    def before_task(task: str, event: dict[str, Any]) -> None:
        if "range" in event:
            units.append((int(event["range"]["r"]), task))

    pages: list[str] = []

    def slow(name: str) -> None:
        if name == "reap-range.page-recorded":
            pages.append(name)
            if len(pages) == 1:
                w.clock.advance(241)  # the first page of the first task took longer than RANGE_TASK_SECONDS

    with crashpoints.hooked(slow):
        report = drive(w.reaper(), {**RETENTION, "page_size": 1}, w.clock, before_task=before_task)
    assert report["hours_reaped"] == [str(HOUR)], report
    # range 0's first GC task stopped after its first page (time), every other after at most 4 units
    gc_tasks = [r for r, task in units if task == "gc"]
    assert gc_tasks.count(0) >= 1 + 3 and gc_tasks.count(1) >= 3, units  # 6 marks + 6 settles: >= 3 tasks


def test_a_pass_reads_only_its_own_range_items(system: LocalSystem) -> None:
    """The planner's Query reads this pass's range items only: items a crashed epoch or pass left
    (kept until their TTL) cost it nothing (the review's F1: a visit needing 4 items read 772)."""
    from lightmetrics.aws.request_counter import RequestCounter
    from lightmetrics.composition.services import control_table
    from lightmetrics.reaps.retention_ranges import RANGE_PK, range_sk, read_ranges

    counter = RequestCounter()
    table = control_table(system.settings, counter=counter)
    for epoch, passes in ((1, 1), (2, 1), (3, 2)):  # other epochs and another pass of this epoch
        for r in range(50):
            table.put({"pk": RANGE_PK, "sk": range_sk(epoch, str(HOUR), passes, r), "range": r, "phase": "blobs"})
    for r in range(4):
        table.put({"pk": RANGE_PK, "sk": range_sk(3, str(HOUR), 1, r), "range": r, "phase": "done"})
    consumed: list[int] = []
    table.client.meta.events.register("after-call.dynamodb.Query",
                                      lambda parsed, **_: consumed.append(int(parsed.get("Count", 0))))
    assert sorted(read_ranges(table, 3, str(HOUR), 1)) == [0, 1, 2, 3]
    assert consumed == [4]  # one Query, four items read
