"""The steady-state reconciler: repairs, hour closing, concurrency, cost (docs/protocol.md §12)."""

from __future__ import annotations

import dataclasses
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ALL_BACKENDS, FAST, T0_NS, consume_all, ident, make_frame

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import KIND_REPAIR, index_accepted, index_raw_blob, write_raw_blob_entry
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.keys import UtcHour

BACKENDS = ALL_BACKENDS  # storage semantics: every test runs on moto and on MiniStack

H0 = UtcHour.of_unix_ns(T0_NS)  # 2025-11-24T16


def make_system(runtime, clock, **overrides):  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:10]
    values = {"settle_s": 600, "reconcile_lookback_s": 7200, **overrides}
    return LocalSystem(runtime, bucket=f"lm-rc-{tag}", table=f"lm-rc-{tag}", secret_name=f"lm-rc/{tag}",
                       queue_name_prefix=f"rc{tag}-", clock=clock, overrides=values).provision()


@pytest.fixture
def system(runtime, clock):  # type: ignore[no-untyped-def]
    s = make_system(runtime, clock)
    yield s
    s.stop()


@pytest.fixture
def actx(system, runtime, clock):  # type: ignore[no-untyped-def]
    return accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)


def keys(runtime, bucket, prefix):  # type: ignore[no-untyped-def]
    return [o["Key"] for o in runtime.boto3_client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


def index_blob_in_record_hour(ctx, r, accepted_at_ns: int) -> None:  # type: ignore[no-untyped-def]
    """Index ``r``'s blob as the event path would if S3's clock were the test's: moto stamps
    LastModified with the real time, the records carry the test clock's."""
    head = ctx.store.head(r.blob_key, checksum=True)
    write_raw_blob_entry(ctx, dataclasses.replace(head, last_modified_unix_s=accepted_at_ns / 1e9), r.frame_sha256)


def purge(system, runtime):  # type: ignore[no-untyped-def]
    """Consume the notifications our direct writes produced (as the pump would)."""
    sqs = runtime.boto3_client("sqs")
    for url in system.queue_urls():
        consume_all(sqs, url)


def test_lost_event_and_crash_between_derived_writes_are_repaired(system, actx, runtime, clock):  # type: ignore[no-untyped-def]
    ctx = system.work_context(policy=FAST)
    a = accept_batch(actx, ident(1), make_frame(ident(1)))
    b = accept_batch(actx, ident(2), make_frame(ident(2)))
    for r in (a, b):
        index_accepted(ctx, r.manifest_key)
    index_raw_blob(ctx, b.blob_key)  # a's blob event was lost
    s3 = runtime.boto3_client("s3")
    crashed = ctx.codec.accepted_by_blob(b.frame_sha256, ident(2))
    # b's accepted-by-blob entry is gone (deleted behind the system's back: an indexer crash between
    # the two writes leaves the other one missing, §9 D5). b's blob is indexed in S3's hour (real
    # time), not the record's hour or the one before, so its check falls back to the full repair.
    s3.delete_object(Bucket=system.bucket, Key=crashed)
    assert len(keys(runtime, system.bucket, "raw-blobs-by-time/")) == 1

    report = system.reconciler(ctx).run()
    assert report.entries == 2 and report.outcomes == {"DONE": 2}
    assert len(keys(runtime, system.bucket, "raw-blobs-by-time/")) == 2
    assert crashed in keys(runtime, system.bucket, "accepted-by-blob/")
    again = system.reconciler(ctx).run()
    assert again.outcomes == {"NOOP_RESOLVED": 2}  # idempotent


def test_missing_blob_is_an_integrity_blocker_that_keeps_the_hour_open(system, actx, runtime, clock):  # type: ignore[no-untyped-def]
    ctx = system.work_context(policy=FAST)
    r = accept_batch(actx, ident(3), make_frame(ident(3)))
    index_accepted(ctx, r.manifest_key)
    runtime.boto3_client("s3").delete_object(Bucket=system.bucket, Key=r.blob_key)
    purge(system, runtime)
    clock.advance(seconds=2 * 3600)
    report = system.reconciler(ctx).run()
    assert report.outcomes == {"BLOCKED": 1}
    [b] = ctx.blockers.list()
    assert b.kind == KIND_REPAIR and "integrity" in b.reason and r.blob_key in b.reason
    assert report.checkpoint_after == str(H0) and "blocker" in report.not_closed_because


def test_hours_close_only_after_settle_quiet_queues_and_no_blockers(system, actx, runtime, clock):  # type: ignore[no-untyped-def]
    ctx = system.work_context(policy=FAST)
    rec = system.reconciler(ctx)
    accept_batch(actx, ident(4), make_frame(ident(4)))
    purge(system, runtime)
    first = rec.run()  # at 16:00, from a lookback (2 h) back: hour 14 closes, 15 is settling
    assert first.hours_scanned == [str(H0 + -2), str(H0 + -1), str(H0)]
    assert first.closed == [str(H0 + -2)] and first.checkpoint_after == str(H0 + -1)
    assert "settle" in first.not_closed_because
    clock.advance(seconds=3600 + 60)  # 17:01 -- hour 15 closes; 16 is over but inside the settle window
    report = rec.run()
    assert report.closed == [str(H0 + -1)]
    assert report.checkpoint_after == str(H0) and "settle" in report.not_closed_because
    clock.advance(seconds=600)  # 17:11 -- settled, but a notification is still queued
    accept_batch(actx, ident(5), make_frame(ident(5)))
    report = rec.run()
    assert report.checkpoint_after == str(H0) and "older messages" in report.not_closed_because
    system.start()
    assert system.drain(timeout_s=60)
    report = rec.run()
    assert report.checkpoint_after == str(H0.next())
    assert report.lag_s == pytest.approx(11 * 60, abs=1)
    assert rec.lag_s() == pytest.approx(report.lag_s, abs=1)


def test_overlapping_runs_never_move_the_checkpoint_back(system, actx, runtime, clock):  # type: ignore[no-untyped-def]
    ctx = system.work_context(policy=FAST)
    purge(system, runtime)
    system.reconciler(ctx).run()  # checkpoint at H0-2 (lookback)
    clock.advance(seconds=3 * 3600)  # 19:00
    slow = system.reconciler(ctx)
    fast = system.reconciler(ctx)
    real_probe = slow.probe
    ran_fast = []

    class InterleavingProbe:
        """While the slow run decides, a fast run advances the checkpoint."""

        def quiet_since(self, hour_end_ns, now_ns):  # type: ignore[no-untyped-def]
            if not ran_fast:
                ran_fast.append(fast.run())
            return real_probe.quiet_since(hour_end_ns, now_ns)

        def dlqs_empty(self):  # type: ignore[no-untyped-def]
            return real_probe.dlqs_empty()

    slow.probe = InterleavingProbe()
    report = slow.run()
    assert ran_fast and ran_fast[0].checkpoint_after == str(H0 + 2)  # 18 is still settling
    assert report.moved_by_other_run is True
    assert slow.checkpoint().hour == H0 + 2 and report.checkpoint_after == str(H0 + 2)


def _reconcile_cost(runtime, clock, depth: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock)
    actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
    ctx = system.work_context(policy=FAST)
    def old(n: int) -> None:  # history, two hours before the new entries, indexed by events
        index_accepted(ctx, accept_batch(actx, ident(n, agent="old"), make_frame(ident(n, agent="old"))).manifest_key)

    system.notifications(False)  # history is already indexed: its events were consumed long ago
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(old, range(depth)))
    system.notifications(True)
    clock.advance(seconds=2 * 3600 + 900)  # 18:15: hours up to 17 have settled
    # Earlier runs reconciled and closed the history hours (test_hours_close_... shows how);
    # record that state directly instead of paying for it again here.
    assert system.reconciler(ctx)._save(H0 + 2, None, clock.now_ns())
    for n in range(10):  # ten new entries in the open hour, fully indexed (the events were not lost)
        r = accept_batch(actx, ident(n, agent="new"), make_frame(ident(n, agent="new")))
        index_accepted(ctx, r.manifest_key)
        index_blob_in_record_hour(ctx, r, clock.now_ns())
    purge(system, runtime)
    counter = RequestCounter()
    measured = system.reconciler(system.work_context(policy=FAST, counter=counter))
    with counter.operation("reconcile") as op:
        report = measured.run()
    assert report.entries == 10 and report.hours_scanned == [str(H0 + 2)]
    clock.advance(seconds=-(2 * 3600 + 900))
    return dict(op.by_api)


# moto only: 1,100 accepted batches to count requests over (about 45 s on MiniStack); the storage steps it
# counts run on MiniStack in this module's other tests
@pytest.mark.backends("moto")
def test_reconcile_cost_depends_on_new_entries_not_history(runtime, clock):  # type: ignore[no-untyped-def]
    at_100 = _reconcile_cost(runtime, clock, 100)
    at_1000 = _reconcile_cost(runtime, clock, 1000)
    print(f"\nreconcile requests for 10 new entries: history 100 -> {at_100}; history 1000 -> {at_1000}")
    assert at_100 == at_1000
    # per new entry with every derived entry present: GET record, nothing else (§12 R3);
    # per run: one LIST of the open hour and one of each of its two raw-blobs-by-time hours,
    # the checkpoint read and write
    assert at_100 == {"s3.GetObject": 10, "s3.ListObjectsV2": 1 + 2, "dynamodb.GetItem": 1, "dynamodb.PutItem": 1}


def test_after_downtime_it_rescans_the_lookback(system, actx, runtime, clock):  # type: ignore[no-untyped-def]
    """Lookback is 2 h in this system; downtime is more than max(2 x settle, 1 h) without a run."""
    ctx = system.work_context(policy=FAST)
    purge(system, runtime)
    rec = system.reconciler(ctx)
    clock.advance(seconds=20 * 60)  # 16:20: hours 14 and 15 close
    assert rec.run().checkpoint_after == str(H0)
    clock.advance(seconds=130 * 60)  # 18:30: hours 16 and 17 close
    assert rec.run().checkpoint_after == str(H0 + 2)
    clock.advance(seconds=75 * 60)  # 19:45, 75 minutes without a run: rescan from 17:45, before the checkpoint
    assert rec.run().hours_scanned == [str(H0 + 1), str(H0 + 2), str(H0 + 3)]
    clock.advance(seconds=5 * 60)  # 19:50, on schedule again: from the checkpoint only
    assert rec.run().hours_scanned[0] == str(rec.checkpoint().hour) != str(H0 + 1)


def test_an_entry_verified_once_is_not_repaired_again_until_a_failure_or_downtime(runtime, clock):  # type: ignore[no-untyped-def]
    """"Verified once" (docs/protocol.md §12 R3): S3's own LastModified decides what is new."""
    import time

    from lightmetrics.harness.testing.faults import FaultInjector, FaultRule

    system = make_system(runtime, clock, reconcile_margin_s=0)
    actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
    ctx = system.work_context(policy=FAST)
    system.notifications(False)  # the test indexes by hand

    def accept_and_index(agent: str, n: int) -> str:
        r = accept_batch(actx, ident(n, agent=agent), make_frame(ident(n, agent=agent)))
        index_accepted(ctx, r.manifest_key)
        return r.manifest_key

    old = [accept_and_index("old", n) for n in range(5)]
    time.sleep(1.1)  # LastModified has whole seconds: the next entries are strictly newer
    new = [accept_and_index("new", n) for n in range(3)]

    def run(**kw):  # type: ignore[no-untyped-def]
        counter = RequestCounter()
        c = system.work_context(policy=FAST, counter=counter)
        for rule in kw.get("faults", []):
            FaultInjector(c.store.client).add(rule)
        with counter.operation("reconcile") as op:
            report = system.reconciler(c).run()
        return report, dict(op.by_api)

    first, cost1 = run()
    assert first.entries == 8 and first.verified_earlier == 0 and cost1["s3.GetObject"] == 8
    second, cost2 = run()
    checked = second.entries - second.verified_earlier
    assert second.verified_earlier >= 5 and 1 <= checked <= 3  # the old ones are never read again
    # listings: every scanned hour, plus the raw-blobs-by-time hours of the hour with entries to check
    assert cost2.get("s3.GetObject", 0) == checked
    assert cost2["s3.ListObjectsV2"] == len(second.hours_scanned) + second.blob_hours_listed == 3 + 2

    # A new batch whose accepted-by-blob write was lost is still repaired ...
    time.sleep(1.1)
    late = accept_and_index("late", 0)
    by_blob_prefix = ctx.codec.prefix + "accepted-by-blob/v1/"
    lost = [k for k in keys(runtime, system.bucket, by_blob_prefix) if "agent=" + "late".encode().hex() in k]
    assert len(lost) == 1
    runtime.boto3_client("s3").delete_object(Bucket=system.bucket, Key=lost[0])
    # ... but not while S3 refuses the write: then nothing is marked verified ...
    before = system.reconciler(ctx).checkpoint().verified_before_ns
    failing, _ = run(faults=[FaultRule(fault="503", operation="PutObject", times=-1,
                                       key_contains="accepted-by-blob/v1/" + lost[0].split("accepted-by-blob/v1/")[1])])
    assert failing.outcomes["RETRY_LATER"] == 1
    assert system.reconciler(ctx).checkpoint().verified_before_ns == before
    assert lost[0] not in keys(runtime, system.bucket, by_blob_prefix)
    # ... and the next run repairs it, skipping what was verified before.
    repaired, cost4 = run()
    assert repaired.outcomes["DONE"] == 1 and lost[0] in keys(runtime, system.bucket, by_blob_prefix)
    assert repaired.verified_earlier >= 5 and late in [ctx.codec.accepted(ident(0, agent="late"))]
    # Downtime: the first run after it checks everything again.
    clock.advance(seconds=2 * 3600)
    after_downtime, _ = run()
    assert after_downtime.verified_earlier == 0 and after_downtime.entries >= 9
    assert set(old) | set(new)  # (the records themselves are untouched throughout)
    system.stop()
