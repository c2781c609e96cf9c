"""Issue 14, reconciler: a healthy entry costs one GET, flat in history; runs are bounded and keep
their progress; the indexer's ordering and integrity rules it relies on (docs/protocol.md §9 D5,
D6, §12 R3, R7)."""

from __future__ import annotations

import base64
import hashlib
import time

import pytest
from conftest import FAST, T0_NS, ident, make_frame
from test_reconcile import H0, index_blob_in_record_hour, make_system, purge
from walk_support import set_last_modified

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import CP_BY_BLOB_WRITTEN, index_accepted, index_raw_blob
from lightmetrics.derived.reconcile import CP_HOUR_SAVED
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.work import crashpoints
from lightmetrics.work.outcome import PermanentWorkError

_NS = 1_000_000_000


def seed_history(bucket: str, depth: int) -> None:
    """``depth`` derived entries (half ``accepted-by-time``, half ``raw-blobs-by-time``) in old,
    closed hours, written straight into the in-process moto server (as if years of batches had
    been indexed)."""
    from moto.s3.models import s3_backends

    old = H0 + -24 * 400
    for account in list(s3_backends.keys()):
        backend = s3_backends[account]["global"]
        if bucket in backend.buckets:
            for n in range(depth):
                hour = old + n // 5000
                sha = hashlib.sha256(n.to_bytes(8, "big")).hexdigest()
                if n % 2:
                    backend.put_object(bucket, f"raw-blobs-by-time/v1/{hour.partition}/sha256={sha}.json", b"{}")
                else:
                    backend.put_object(bucket, f"accepted-by-time/v1/{hour.partition}/h{n:08d}.json", b"{}")
            return
    raise KeyError(bucket)


def accept_indexed(system, clock, agent: str, n: int, first: int = 0):  # type: ignore[no-untyped-def]
    """Accept batches ``first`` to ``n - 1`` now and index them as the event path does (under
    S3's clock)."""
    actx = accept_context(system.settings, client=system.runtime.boto3_client("s3"), clock=clock, policy=FAST)
    ctx = system.work_context(policy=FAST)
    results = []
    for k in range(first, n):
        r = accept_batch(actx, ident(k, agent=agent), make_frame(ident(k, agent=agent)))
        index_accepted(ctx, r.manifest_key)
        index_blob_in_record_hour(ctx, r, clock.now_ns())
        results.append(r)
    return results


def measured_run(system, **kw):  # type: ignore[no-untyped-def]
    counter = RequestCounter()
    with counter.operation("reconcile") as op:
        report = system.reconciler(system.work_context(policy=FAST, counter=counter)).run(**kw)
    # an attempt a busy machine timed out is retried by the store: the cost under test is the
    # requests the reconciler's logic sent
    return report, dict(op.answered())


def _healthy_cost(runtime, clock, depth: int):  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock)
    try:
        system.notifications(False)
        purge(system, runtime)
        seed_history(system.bucket, depth)
        assert system.reconciler()._save(H0, None, clock.now_ns())  # history's hours closed long ago
        accept_indexed(system, clock, "new", 6)
        report, cost = measured_run(system)
        assert report.entries == 6 and report.outcomes == {"NOOP_RESOLVED": 6}, report.to_json()
        return cost
    finally:
        system.stop()


def test_a_healthy_entry_costs_one_get_and_no_put_whatever_the_history(runtime, clock):  # type: ignore[no-untyped-def]
    shallow = _healthy_cost(runtime, clock, 1_000)
    deep = _healthy_cost(runtime, clock, 100_000)
    print(f"\nreconcile, 6 healthy entries: history 1,000 -> {shallow}; history 100,000 -> {deep}")
    assert shallow == deep
    # per entry one GET; per run the hour's LIST, the two raw-blobs-by-time hours, the checkpoint
    assert shallow == {"s3.GetObject": 6, "s3.ListObjectsV2": 3, "dynamodb.GetItem": 1, "dynamodb.PutItem": 1}


def test_a_lost_blob_event_is_repaired_with_reads_before_writes(runtime, clock):  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock)
    try:
        system.notifications(False)
        purge(system, runtime)
        actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
        ctx = system.work_context(policy=FAST)
        r = accept_batch(actx, ident(1), make_frame(ident(1)))
        index_accepted(ctx, r.manifest_key)  # the blob's event was lost
        assert system.reconciler()._save(H0, None, clock.now_ns())
        report, cost = measured_run(system)
        assert report.outcomes == {"DONE": 1}
        # GET record, HEAD accepted-by-blob (present: no PUT), HEAD blob, HEAD of the blob's entry in
        # S3's hour (not listed), its tombstone, one PUT; LISTs: the hour and two blob hours
        assert cost == {"s3.GetObject": 1, "s3.HeadObject": 4, "s3.PutObject": 1, "s3.ListObjectsV2": 3,
                        "dynamodb.GetItem": 1, "dynamodb.PutItem": 1}
        again, cost = measured_run(system)
        assert again.outcomes == {"NOOP_RESOLVED": 1} and "s3.PutObject" not in cost
    finally:
        system.stop()


def test_the_entry_cap_continues_inside_an_hour_and_every_entry_is_checked_once(runtime, clock):  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock, reconcile_margin_s=0)
    try:
        system.notifications(False)
        purge(system, runtime)
        older = accept_indexed(system, clock, "cap", 3)
        newer = accept_indexed(system, clock, "cap", 7, first=3)
        # LastModified has whole seconds: the first three are older than the rest, which share one
        # second (set as S3 would have stamped them: on a busy machine seven accepts can span two)
        codec, now_s = system.work_context().codec, time.time_ns() // _NS * _NS
        for results, stamp in ((older, now_s - 4 * _NS), (newer, now_s - 2 * _NS)):
            for r in results:
                set_last_modified(system.bucket, codec.accepted_by_time(H0, codec.parse(r.manifest_key).identity), stamp)
        clock.advance(seconds=3600 + 900)  # 17:15: hour 16 has settled
        assert system.reconciler()._save(H0, None, clock.now_ns())
        first, cost1 = measured_run(system, max_entries=3)
        assert first.outcomes == {"NOOP_RESOLVED": 3} and cost1["s3.GetObject"] == 3
        assert first.continues_from == str(H0) and first.continues_after and first.closed == []
        second, cost2 = measured_run(system, max_entries=3)
        # the 3 checked before are older than the cursor's bound: not read again
        assert second.verified_earlier == 3 and second.outcomes == {"NOOP_RESOLVED": 3}, second.to_json()
        third, _ = measured_run(system, max_entries=3)
        # the last entry, and again the three written in the same second as the hour's newest (they
        # could have been in flight at the second run's listing): not counted against the cap
        assert third.verified_earlier == 3 and third.outcomes == {"NOOP_RESOLVED": 4}, third.to_json()
        assert third.closed == [str(H0)] and not third.continues_after
        assert system.reconciler().checkpoint().hour == H0 + 1
    finally:
        system.stop()


def test_a_run_killed_after_an_hour_keeps_that_hour_and_the_next_continues(runtime, clock):  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock)
    try:
        system.notifications(False)
        purge(system, runtime)
        clock.advance(seconds=-3600)
        accept_indexed(system, clock, "earlier", 2)  # hour 15
        clock.advance(seconds=3600)
        accept_indexed(system, clock, "now", 2)  # hour 16
        assert system.reconciler()._save(H0 + -1, None, clock.now_ns())
        hook, _ = crashpoints.crash_once_at(CP_HOUR_SAVED)
        with crashpoints.hooked(hook), pytest.raises(crashpoints.InjectedCrash):
            system.reconciler().run()  # the Lambda dies after saving hour 15's progress
        cp = system.reconciler().checkpoint()
        assert cp.scan_from == H0 and cp.hour == H0 + -1
        resumed, cost = measured_run(system)
        assert resumed.hours_scanned == [str(H0)] and cost["s3.GetObject"] == 2  # hour 15 not redone
        assert resumed.closed == []  # it began past the checkpoint (R1)
        assert system.reconciler().run().hours_scanned[0] == str(H0 + -1)  # and round again
    finally:
        system.stop()


def test_a_crash_between_the_accepted_writes_leaves_by_blob_without_by_time(runtime, clock):  # type: ignore[no-untyped-def]
    """§9 D5: never the reverse, so an accepted-by-time entry present vouches for its by-blob entry."""
    system = make_system(runtime, clock)
    try:
        actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
        ctx = system.work_context(policy=FAST)
        r = accept_batch(actx, ident(2), make_frame(ident(2)))
        hook, _ = crashpoints.crash_once_at(CP_BY_BLOB_WRITTEN)
        with crashpoints.hooked(hook), pytest.raises(crashpoints.InjectedCrash):
            index_accepted(ctx, r.manifest_key)
        by_blob = ctx.codec.accepted_by_blob(r.frame_sha256, ident(2))
        by_time = ctx.codec.accepted_by_time(UtcHour.of_unix_ns(T0_NS), ident(2))
        assert ctx.store.head(by_blob) is not None and ctx.store.head(by_time) is None
        index_accepted(ctx, r.manifest_key)  # the event is redelivered
        assert ctx.store.head(by_time) is not None
    finally:
        system.stop()


def test_a_blob_whose_bytes_do_not_hash_to_its_key_is_not_indexed(runtime, clock, metrics):  # type: ignore[no-untyped-def]
    """§9 D6: a raw-blobs-by-time entry certifies its blob's bytes."""
    system = make_system(runtime, clock)
    try:
        ctx = system.work_context(policy=FAST, metrics=metrics)
        frame = make_frame(ident(3))
        key = ctx.codec.raw_blob(hashlib.sha256(frame).hexdigest())
        other = bytes(b ^ 0xFF for b in frame)
        ctx.store.client.put_object(Bucket=system.bucket, Key=key, Body=other, ChecksumAlgorithm="SHA256",
                                    ChecksumSHA256=base64.b64encode(hashlib.sha256(other).digest()).decode())
        with pytest.raises(PermanentWorkError) as err:
            index_raw_blob(ctx, key)
        assert err.value.kind == "integrity" and err.value.alarm == "IntegrityViolation" and "checksum" in str(err.value)
        assert ctx.store.list_keys(ctx.codec.prefix + "raw-blobs-by-time/") == []
    finally:
        system.stop()
