"""Issue 23, property 4: a refusal that passes never blocks for good (docs/protocol.md §11 O4).

One ``AccessDenied`` (IAM or KMS propagation after a deploy), injected at the S3 client on one
entry's unit, opens a blocker whose reason names the operation and the key. The next run that
reaches the unit checks it again; its success resolves the blocker by itself (the audit trail says
so), and the reconciler closes the hour, retention reaps it. A refusal that persists keeps its
blocker open and stops nothing but its own unit.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import FAST, ident, make_frame
from reap_support import OLD_NS, drive, make_world
from test_invariant_reaps import real_s3_listing
from test_reconcile import H0, make_system, purge

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import KIND_ACCEPTED, KIND_REPAIR, index_accepted, raw_blob_entry
from lightmetrics.harness.testing.faults import FaultInjector, FaultRule
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps.retention import KIND_RETENTION
from lightmetrics.work.blockers import Blocker
from lightmetrics.work.outcome import Outcome
from lightmetrics.work.units import run_unit

HOUR = UtcHour.of_unix_ns(OLD_NS)
RETENTION = {"mode": "retention", "dry_run": False, "hour": str(HOUR), "tombstone_wait_s": 0}


def assert_names_the_request(blocker: Blocker, key: str) -> None:
    assert "GetObject" in blocker.reason and key in blocker.reason, blocker.reason
    assert "refused access" not in blocker.reason, blocker.reason


def assert_resolved_by_itself(blocker: Blocker) -> None:
    assert blocker.status == "resolved", blocker
    last = blocker.audit[-1]
    assert last["action"] == "auto-resolve" and "succeeded" in last["reason"], blocker.audit


# ------------------------------------------------------------------------------- the reconciler
@pytest.fixture
def reconciled(runtime, clock):  # type: ignore[no-untyped-def]
    """Two indexed batches of H0 and a reconciler two hours later (H0 settled)."""
    system = make_system(runtime, clock)
    try:
        actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
        ctx = system.work_context(policy=FAST)
        results = [accept_batch(actx, ident(n), make_frame(ident(n))) for n in (1, 2)]
        for r in results:
            index_accepted(ctx, r.manifest_key)
        purge(system, runtime)
        clock.advance(seconds=2 * 3600)
        yield system, ctx, results
    finally:
        system.stop()


def test_a_refusal_that_passes_never_keeps_the_reconcilers_hours_open(reconciled):  # type: ignore[no-untyped-def]
    system, ctx, (denied, _) = reconciled
    FaultInjector(ctx.store.client).add(FaultRule(fault="403", operation="GetObject",
                                                  key_contains=denied.manifest_key, times=1))
    first = system.reconciler(ctx).run()
    assert first.outcomes.get("BLOCKED") == 1, first.to_json()
    [blocker] = ctx.blockers.list()
    assert blocker.work_key == f"{KIND_REPAIR}:{denied.manifest_key}"
    assert_names_the_request(blocker, denied.manifest_key)
    assert first.checkpoint_after == str(H0) and "blocker" in first.not_closed_because, first.to_json()

    counter = RequestCounter()  # the next run: a new process, knowing only the checkpoint
    ctx = system.work_context(policy=FAST, counter=counter)
    with counter.operation("reconcile") as op:
        second = system.reconciler(ctx).run()  # the refusal has passed: the entry is checked again
    # O4's cost: the budget's DeleteItem (O1a) and the blocker's conditional UpdateItem, nothing else
    # (R1's one Query finds no blocker left to re-check)
    cost = dict(op.by_api)
    assert (cost["dynamodb.DeleteItem"], cost["dynamodb.UpdateItem"], cost["dynamodb.Query"]) == (1, 1, 1), cost
    assert second.outcomes.get("BLOCKED") is None and sum(second.outcomes.values()) >= 1, second.to_json()
    assert ctx.blockers.list() == []
    assert_resolved_by_itself(ctx.blockers.get(blocker.work_key))
    assert str(H0) in second.closed and second.checkpoint_after > str(H0), second.to_json()


def test_a_refusal_that_persists_stays_open_and_stops_only_its_own_unit(reconciled):  # type: ignore[no-untyped-def]
    system, ctx, (denied, _) = reconciled
    FaultInjector(ctx.store.client).add(FaultRule(fault="403", operation="GetObject",
                                                  key_contains=denied.manifest_key, times=-1))
    for _ in range(2):
        report = system.reconciler(ctx).run()
        # the other entry is checked (and ends well) on every run
        assert report.outcomes.get("BLOCKED") == 1 and sum(report.outcomes.values()) == 2, report.to_json()
    [blocker] = ctx.blockers.list()
    assert blocker.status == "open" and blocker.attempts == 2 and blocker.audit == [], blocker  # one check a run
    assert_names_the_request(blocker, denied.manifest_key)


def test_a_refusal_that_passes_on_the_event_path_never_keeps_the_reconcilers_hours_open(  # type: ignore[no-untyped-def]
        runtime, clock):
    """An indexing blocker opened by another job (here the event path) holds every hour (R1): the
    reconciler checks its unit again by itself, and the success resolves it."""
    system = make_system(runtime, clock)
    try:
        actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
        ctx = system.work_context(policy=FAST)
        key = accept_batch(actx, ident(7), make_frame(ident(7))).manifest_key
        purge(system, runtime)
        FaultInjector(ctx.store.client).add(FaultRule(fault="403", operation="GetObject", key_contains=key, times=1))
        result = run_unit(ctx, kind=KIND_ACCEPTED, object_key=key, source="event", fn=lambda: index_accepted(ctx, key))
        assert result.outcome is Outcome.BLOCKED
        [blocker] = ctx.blockers.list()
        assert_names_the_request(blocker, key)
        clock.advance(seconds=2 * 3600)
        counter = RequestCounter()
        with counter.operation("reconcile") as op:
            report = system.reconciler(system.work_context(policy=FAST, counter=counter)).run()
        # the re-check: the unit's own requests, its DeleteItem and UpdateItem, and R1's Query again
        cost = dict(op.by_api)
        assert (cost["dynamodb.DeleteItem"], cost["dynamodb.UpdateItem"], cost["dynamodb.Query"]) == (1, 1, 2), cost
        assert cost["s3.GetObject"] == 1, cost
        assert ctx.blockers.list() == []
        assert_resolved_by_itself(ctx.blockers.get(blocker.work_key))
        assert str(H0) in report.closed, report.to_json()
        assert ctx.store.head(ctx.codec.accepted_by_time(H0, ident(7))) is not None  # indexed by the re-check
    finally:
        system.stop()


def test_a_blocker_is_resolved_only_by_a_run_that_checked_again_what_opened_it(  # type: ignore[no-untyped-def]
        reconciled, runtime):
    """O4: an integrity blocker (the blob behind the record is the wrong size) stays open when the
    blob's raw-blobs-by-time hint arrives later: the reconciler's shortcut (the hint says the blob is
    indexed) never looked at the blob, so the unit that failed before is checked in full again."""
    system, ctx, (damaged, _) = reconciled
    ctx.store.delete_objects([(damaged.blob_key, None)])
    ctx.store.put_if_absent(damaged.blob_key, b"truncated")
    purge(system, runtime)
    first = system.reconciler(ctx).run()
    assert first.outcomes.get("BLOCKED") == 1, first.to_json()
    [blocker] = ctx.blockers.list()
    assert blocker.work_key == f"{KIND_REPAIR}:{damaged.manifest_key}" and "blob is 9 bytes" in blocker.reason

    # the blob's event, late: its hint (no size check), in H0 as the blob's LastModified would put it
    # (moto stamps the wall clock)
    sha = ctx.codec.parse(damaged.blob_key).sha256 or ""
    _, hint = raw_blob_entry(ctx, ctx.store.head(damaged.blob_key, checksum=True), sha)
    ctx.store.put_if_absent(ctx.codec.raw_blobs_by_time(H0, sha), hint.to_bytes())
    system.clock.advance(seconds=60)
    later = system.work_context(policy=FAST)  # a new process: it knows the checkpoint only
    heads: list[str] = []
    later.store.client.meta.events.register("before-parameter-build.s3.HeadObject",  # type: ignore[attr-defined]
                                            lambda params, **_: heads.append(params["Key"]))
    second = system.reconciler(later).run()
    assert second.outcomes.get("BLOCKED") == 1, second.to_json()
    # the full check's cost: two HEADs (accepted-by-blob, the blob); the listing found its hint
    assert [k.split("/")[0] for k in sorted(heads) if sha in k] == ["accepted-by-blob", "raw-blobs"], heads
    [still] = ctx.blockers.list()
    assert still.work_key == blocker.work_key and still.status == "open" and still.audit == [], still
    assert still.reason.startswith("integrity:") and "blob is 9 bytes" in still.reason
    assert str(H0) not in second.closed and "blocker" in second.not_closed_because, second.to_json()
    assert ctx.store.head(damaged.blob_key).size == 9


# ------------------------------------------------------------------------------------ retention
def test_a_refusal_that_passes_never_keeps_retention_from_reaping_the_hour(bucket: str,  # type: ignore[no-untyped-def]
                                                                         monkeypatch: pytest.MonkeyPatch):
    w = make_world(bucket)
    real_s3_listing(w, monkeypatch)
    results = [w.accept(ident(n)) for n in range(3)]
    w.cover_watermark()
    denied = results[1]
    FaultInjector(w.s3).add(FaultRule(fault="403", operation="GetObject", key_contains=denied.manifest_key, times=1))
    first = drive(w.reaper(), RETENTION, w.clock)
    entry = w.ctx.codec.accepted_by_time(HOUR, ident(1))
    blocker = w.ctx.blockers.get(f"{KIND_RETENTION}:{entry}")
    assert_names_the_request(blocker, denied.manifest_key)
    assert first["hours_reaped"] == [] and first["kept"].get("blocked") == 1, first
    assert w.ctx.store.head(entry) is not None  # its blob was not collected: the enumeration stays

    again = drive(w.reaper(), {"mode": "retention", "dry_run": False, "tombstone_wait_s": 0}, w.clock)
    assert again["hours_reaped"] == [str(HOUR)], again
    assert w.ctx.blockers.list() == []
    assert_resolved_by_itself(w.ctx.blockers.get(blocker.work_key))
    assert w.ctx.store.list_keys(w.ctx.codec.accepted_by_time_hour(HOUR)) == []
    assert not w.blob_exists(denied.blob_key)


def test_a_refusal_that_persists_keeps_only_its_own_entry_in_retention(bucket: str,  # type: ignore[no-untyped-def]
                                                                      monkeypatch: pytest.MonkeyPatch):
    w = make_world(bucket)
    real_s3_listing(w, monkeypatch)
    results = [w.accept(ident(n)) for n in range(3)]
    w.cover_watermark()
    denied = results[1]
    FaultInjector(w.s3).add(FaultRule(fault="403", operation="GetObject", key_contains=denied.manifest_key, times=-1))
    for _ in range(2):
        report = drive(w.reaper(), RETENTION, w.clock)
        assert report["hours_reaped"] == [], report
    [blocker] = w.ctx.blockers.list()
    assert blocker.status == "open" and blocker.attempts >= 2, blocker
    entry = w.ctx.codec.accepted_by_time(HOUR, ident(1))
    assert w.ctx.store.list_keys(w.ctx.codec.accepted_by_time_hour(HOUR)) == [entry]  # only its own entry stays
    assert all(not w.blob_exists(r.blob_key) for r in (results[0], results[2]))
    assert w.blob_exists(denied.blob_key)



# ------------------------------------------------------------------------------------ the walk
@pytest.mark.parametrize("retention_blockers", [0, 3])
def test_a_refusal_that_passes_is_resolved_by_the_next_walk(  # type: ignore[no-untyped-def]
        runtime, clock, monkeypatch, retention_blockers):
    """The walk opens the same kind of blocker through the same mechanism: the next walk's round
    hands the blocked key to its page as failed before, and the page's success resolves it — even
    when more open blockers than the round's re-check slots are ones the walk cannot act on
    (retention's, under ``accepted-by-time/``, which sort before ``accepted/``)."""
    from test_walk import accept_all, run_walk

    from lightmetrics.derived.walk import steps
    from lightmetrics.work.units import work_key

    monkeypatch.setattr(steps, "RECHECK_MAX", 2)

    system = make_system(runtime, clock)
    try:
        results = accept_all(system, runtime, clock, [ident(n) for n in range(3)])
        denied = results[1].manifest_key
        rule = FaultRule(fault="403", operation="GetObject", key_contains=denied, times=1)
        made = system.work_context

        def with_fault(**kw: Any) -> Any:
            ctx = made(**kw)
            if kw.get("component") == "walk":
                FaultInjector(ctx.store.client).add(rule)
            return ctx

        monkeypatch.setattr(system, "work_context", with_fault)
        system.register_task_functions()
        first = run_walk(system, page_size=2)
        assert first.status == "finished" and first.summary_json()["outcomes"]["BLOCKED"] == 1, first.summary
        [blocker] = system.work_context().blockers.list()
        assert blocker.work_key == f"{KIND_REPAIR}:{denied}" and blocker.source == "walk"
        assert_names_the_request(blocker, denied)
        ctx = system.work_context()
        others = [ctx.codec.accepted_by_time(H0, ident(100 + n)) for n in range(retention_blockers)]
        for key in others:
            ctx.blockers.block(work_key(KIND_RETENTION, key), kind=KIND_RETENTION, object_key=key,
                               reason="access: denied", source="reap")

        system.register_task_functions()  # a new process: it knows nothing of the first walk's failures
        again = run_walk(system, page_size=2)
        assert again.summary_json()["outcomes"].get("BLOCKED", 0) == 0, again.summary
        assert sorted(b.object_key for b in ctx.blockers.list()) == others
        assert_resolved_by_itself(ctx.blockers.get(blocker.work_key))
    finally:
        system.stop()


def test_a_shortcut_never_resolves_a_blocker_in_general() -> None:
    """O4 in run_unit, for any driver: a unit that failed before (the driver says so, or this
    process recorded it) runs its ``full_check``, never the shortcut; a shortcut's success resolves
    nothing. In-memory adapters: the rule lives in run_unit alone."""
    from memory_support import memory_world

    from lightmetrics.work.outcome import PermanentWorkError

    ctx = memory_world().ctx
    ran: list[str] = []

    def shortcut() -> Outcome:
        ran.append("shortcut")
        return Outcome.NOOP_RESOLVED

    def failing_check() -> Outcome:
        ran.append("full")
        raise PermanentWorkError("blob is 9 bytes, record says 177", kind="integrity")

    def unit(fn: Any, **kw: Any) -> Outcome:
        return run_unit(ctx, kind=KIND_REPAIR, object_key="k", source="reconcile", fn=fn, full_check=failing_check,
                        **kw).outcome

    assert unit(shortcut) is Outcome.NOOP_RESOLVED and ran == ["shortcut"]  # nothing on record: the shortcut
    assert unit(failing_check) is Outcome.BLOCKED
    assert unit(shortcut) is Outcome.BLOCKED and ran[-1] == "full"  # failed in this process
    ctx.budget.clear(f"{KIND_REPAIR}:k")  # a new process: only the driver knows
    assert unit(shortcut, previously_failed=True) is Outcome.BLOCKED and ran[-1] == "full"
    assert [b.status for b in ctx.blockers.list()] == ["open"]
