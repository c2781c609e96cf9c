"""GC and retention reaps (issue 6): proofs, the delete-marker handshake, retention order, late retries.

Each test runs the reap's real task methods (lightmetrics.reaps.Reaper) against moto through
:func:`reap_support.drive`, the state machine's loop in Python; the state machine itself runs in
tests/test_reap_statemachine.py.
"""

from __future__ import annotations

import json
import time

from conftest import ALL_BACKENDS, ident, make_frame
from reap_support import OLD_NS, World, drive, make_world

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.derived.indexing import index_accepted, index_quarantine
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps.gc import BlobCollector

BACKENDS = ALL_BACKENDS  # storage semantics: every test runs on moto and on MiniStack

_NS = 1_000_000_000


def gc_input(**kw):  # type: ignore[no-untyped-def]
    return {"mode": "gc", "dry_run": False, **kw}


def test_orphan_past_horizon_is_purged_and_referenced_blobs_are_kept(bucket: str) -> None:
    w = make_world(bucket)
    kept = w.accept(ident(1))
    orphan = w.orphan(ident(2))
    w.clock.advance(0)
    report = drive(w.reaper(), gc_input(), w.clock)
    assert report["status"] == "finished"
    assert (report["examined"], report["marked"], report["purged"], report["restored"]) == (2, 1, 1, 0)
    assert report["kept"] == {"referenced": 1}
    assert not w.blob_exists(orphan) and w.versions(orphan) == ([], [])
    assert w.blob_exists(kept.blob_key)
    assert verify(w.ctx, strict=True).ok


def test_younger_orphan_is_kept(bucket: str) -> None:
    w = make_world(bucket)
    orphan = w.orphan(ident(3))
    w.clock.advance(-(w.settings.retry_horizon_s + 120))  # the blob is younger than the horizon
    report = drive(w.reaper(), gc_input(), w.clock)
    assert report["kept"] == {"younger-than-horizon": 1} and report["purged"] == 0
    assert w.blob_exists(orphan)


def test_unresolved_conflict_blob_is_kept(bucket: str) -> None:
    w = make_world(bucket)
    w.accept(ident(4))
    conflict = accept_batch(w.old, ident(4), make_frame(ident(4), variant=9.0))
    assert conflict.status.value == "identity_conflict"
    index_quarantine(w.ctx, conflict.quarantine_key or "")
    report = drive(w.reaper(), gc_input(), w.clock)
    assert report["kept"] == {"referenced": 1, "conflict-unresolved": 1}
    assert w.blob_exists(conflict.blob_key or "")


def test_gc_reads_the_spark_audits_candidates_and_proves_them_again(bucket: str) -> None:
    w = make_world(bucket)
    kept = w.accept(ident(11))
    orphan = w.orphan(ident(12))
    run = w.ctx.codec.audit_run("r1")
    # The audit's output (docs/pipeline.md §3): a referenced blob listed by mistake must survive.
    rows = [{"blob_key": orphan, "reason": "unreferenced"}, {"blob_key": kept.blob_key, "reason": "stale inventory"}]
    w.ctx.store.put_if_absent(f"{run}orphan-blob-candidates/part-00000.jsonl",
                              b"\n".join(json.dumps(r).encode() for r in rows))
    inp = gc_input(source="audit", audit_run="r1")
    from lightmetrics.reaps import InvalidReapInput

    try:  # not committed yet: no summary.json
        drive(w.reaper(), inp, w.clock)
    except InvalidReapInput:
        assert w.reaper().lease().expires_at_ns == 0  # the Abort path released the lease
    else:
        raise AssertionError("an uncommitted audit run was used")
    w.ctx.store.put_if_absent(f"{run}summary.json", b"{}")
    report = drive(w.reaper(), inp, w.clock)
    assert (report["examined"], report["purged"], report["kept"]) == (2, 1, {"referenced": 1})
    assert not w.blob_exists(orphan) and w.blob_exists(kept.blob_key)


def test_dry_run_deletes_nothing(bucket: str) -> None:
    w = make_world(bucket)
    orphan = w.orphan(ident(5))
    report = drive(w.reaper(), gc_input(dry_run=True), w.clock)
    assert (report["examined"], report["deletable"], report["marked"], report["purged"]) == (1, 1, 0, 0)
    assert w.blob_exists(orphan) and w.versions(orphan)[1] == []


def test_purge_removes_marker_and_pre_mark_version_but_a_newer_version_survives(bucket: str) -> None:
    w = make_world(bucket)
    orphan = w.orphan(ident(6))
    gc = BlobCollector(w.ctx, w.settings)
    proof = gc.prove(orphan)
    [mark] = gc.mark([gc.intent(proof, w.clock.now_ns())])
    assert not w.blob_exists(orphan)
    # A collector writes the same content again while the marker is current (no manifest yet).
    w.orphan(ident(6))
    (before, markers) = w.versions(orphan)
    assert len(before) == 2 and markers == [mark.marker_version_id]
    assert gc.settle([mark]) == ["purged"]
    versions, markers = w.versions(orphan)
    assert markers == [] and proof.version_id not in versions and len(versions) == 1
    assert w.blob_exists(orphan)


def test_gc_proof_cost_matches_the_contract(bucket: str) -> None:
    w = make_world(bucket)
    orphan = w.orphan(ident(7))
    counter = RequestCounter()
    counter.attach(w.s3)
    gc = BlobCollector(w.ctx, w.settings)
    with counter.operation("prove") as prove:
        proof = gc.prove(orphan)
    assert dict(prove.by_api) == {"s3.HeadObject": 2, "s3.GetObject": 1}  # blob, quarantine; manifest
    with counter.operation("mark") as mark_op:
        [mark] = gc.mark([gc.intent(proof, w.clock.now_ns())])
    assert dict(mark_op.by_api) == {"s3.DeleteObjects": 1}  # one request a page (up to 1,000 markers)
    with counter.operation("settle") as settle:
        gc.settle([mark])
    # manifest GET + quarantine HEAD again, then one DeleteObjects each for the versions, the markers
    # and the raw-blobs-by-time hints (in that order)
    assert dict(settle.by_api) == {"s3.GetObject": 1, "s3.HeadObject": 1, "s3.DeleteObjects": 3}


def retention_world(bucket: str) -> tuple[World, list, str]:  # type: ignore[type-arg]
    w = make_world(bucket)
    results = [w.accept(ident(n)) for n in range(3)]
    orphan = w.orphan(ident(9))
    w.cover_watermark()
    return w, results, orphan


def test_retention_of_an_hour_then_a_late_retry(bucket: str) -> None:
    w, results, orphan = retention_world(bucket)
    hour = UtcHour.of_unix_ns(OLD_NS)
    report = drive(w.reaper(), {"mode": "retention", "dry_run": False, "hour": str(hour), "tombstone_wait_s": 0},
                   w.clock)
    assert report["hours_reaped"] == [str(hour)] and report["purged"] == 3, report
    codec = w.ctx.codec
    for r in results:
        assert w.ctx.store.get(r.manifest_key) is not None  # acceptance records stay
        assert not w.blob_exists(r.blob_key)
    assert w.ctx.store.list_keys(codec.accepted_by_time_hour(hour)) == []
    assert w.ctx.store.list_keys(codec.prefix + "accepted-by-blob/v1/") == []
    assert w.ctx.store.head(codec.retention_reaped("raw", hour)) is not None
    assert w.blob_exists(orphan)  # retention only touches the hour's accepted batches
    assert verify(w.ctx, strict=True).ok

    # A late retry of a reaped batch: duplicate; nothing derived re-created; the blob comes back ...
    again = accept_batch(w.old, ident(1), make_frame(ident(1)))
    assert again.status.value == "duplicate"
    # The indexer's negative tombstone answer is cached for 60 s; the reap's tombstone_wait_s (default
    # 120, 0 here) outlasts it. A fresh context stands for an indexer after that wait.
    w.ctx.tombstones = None
    index_accepted(w.ctx, again.manifest_key or "")
    assert w.ctx.store.list_keys(codec.accepted_by_time_hour(hour)) == []
    assert w.ctx.store.list_keys(codec.prefix + "accepted-by-blob/v1/") == []
    assert w.blob_exists(again.blob_key or "")
    # ... and GC collects it again: its manifest's hour is tombstoned.
    w.clock.advance(w.settings.retry_horizon_s + 60)
    report = drive(w.reaper(), gc_input(), w.clock)
    assert not w.blob_exists(again.blob_key or "")
    assert report["purged"] == 2  # the re-created blob and the orphan
    assert verify(w.ctx, strict=True).ok
    # verify would catch a writer that re-created derived state under the tombstone.
    w.ctx.store.put_if_absent(codec.accepted_by_time(hour, ident(1)), b"{}")
    assert "reaped-not-empty" in verify(w.ctx, strict=True).violation_counts()


def test_rollup_retention_deletes_chunks_then_manifests_and_marks_the_hour(bucket: str) -> None:
    w = make_world(bucket)
    hour = UtcHour.of_unix_ns(OLD_NS)
    keys = w.rollups(hour)
    newer = w.rollups(hour + 24)  # another hour: not part of this reap
    inp = {"mode": "retention", "scope": "rollup", "dry_run": False, "hour": str(hour), "tombstone_wait_s": 0}
    report = drive(w.reaper(), inp, w.clock)
    assert report["hours_reaped"] == [str(hour)] and report["purged"] == len(keys)
    assert all(w.ctx.store.head(k) is None for k in keys) and all(w.ctx.store.head(k) for k in newer)
    codec = w.ctx.codec
    assert w.ctx.store.head(codec.retention_tombstone("rollup", hour)) is not None
    assert w.ctx.store.head(codec.retention_reaped("rollup", hour)) is not None
    assert w.ctx.store.head(codec.retention_tombstone("raw", hour)) is None  # raw data is another policy


def test_retention_refuses_an_hour_the_watermark_does_not_cover(bucket: str) -> None:
    w = make_world(bucket)
    r = w.accept(ident(1))
    hour = UtcHour.of_unix_ns(OLD_NS)
    report = drive(w.reaper(), {"mode": "retention", "dry_run": False, "hour": str(hour)}, w.clock)
    assert report["hours_skipped"] == {str(hour): "skipped: watermark does not cover the hour"}
    assert w.blob_exists(r.blob_key) and w.ctx.store.head(w.ctx.codec.retention_tombstone("raw", hour)) is None


def test_retention_without_hour_finds_expired_hours(bucket: str) -> None:
    w, results, _ = retention_world(bucket)
    report = drive(w.reaper(), {"mode": "retention", "dry_run": True}, w.clock)
    assert report["hours"] == [str(UtcHour.of_unix_ns(OLD_NS))] and report["deletable"] == 3
    assert all(w.blob_exists(r.blob_key) for r in results)


def test_second_reap_is_refused_while_the_lease_is_held(bucket: str) -> None:
    from lightmetrics.reaps import LeaseHeld

    w = make_world(bucket)
    first = w.reaper().begin({"input": gc_input(), "execution_arn": "a"})
    try:
        w.reaper().begin({"input": gc_input(), "execution_arn": "b"})
    except LeaseHeld as exc:
        assert "reap lease" in str(exc)
    else:
        raise AssertionError("a second reap took the lease")
    assert first["reap"]["epoch"] == 1
    _ = time


def _commit_audit(w: World, run_id: str, at_s: int, blob_keys: list[str]) -> None:
    """What a committed audit run leaves (pipeline/audit/job.py): its orphan candidates, its summary,
    then its commit marker."""
    run = w.ctx.codec.audit_run(run_id)
    w.ctx.store.put_if_absent(f"{run}orphan-blob-candidates/part-00000.jsonl",
                              b"\n".join(json.dumps({"blob_key": k}).encode() for k in blob_keys))
    w.ctx.store.put_if_absent(f"{run}summary.json", b"{}")
    w.ctx.store.put_if_absent(w.ctx.codec.audit_committed(at_s, run_id), b"{}")


def test_the_scheduled_gc_proves_the_newest_committed_audit_once(bucket: str) -> None:
    """Rule G-B3: ``audit_run: latest`` takes the newest committed audit run (by commit time, not
    by when its marker was written), proves its candidates once, and a day without a new audit
    costs one listing and no proof."""
    w = make_world(bucket)
    latest = gc_input(source="audit", audit_run="latest")
    report = drive(w.reaper(), latest, w.clock)
    assert report["status"] == "finished" and report["examined"] == 0 and report["audit_run"] is None
    assert "no committed audit run" in report["note"]

    kept = w.accept(ident(21))
    first, second = w.orphan(ident(22)), w.orphan(ident(23))
    _commit_audit(w, "week-1", 1_764_000_000, [first, kept.blob_key])
    report = drive(w.reaper(), latest, w.clock)
    assert report["audit_run"] == "week-1" and report["source"] == "audit"
    assert (report["examined"], report["purged"], report["kept"]) == (2, 1, {"referenced": 1})
    assert not w.blob_exists(first)

    counter = RequestCounter()
    counter.attach(w.ctx.store.client)  # type: ignore[attr-defined]
    again = drive(w.reaper(), latest, w.clock)
    assert again["examined"] == 0 and "already proven" in again["note"] and again["audit_run"] == "week-1"
    assert {k: v for k, v in counter.totals.items() if k.startswith("s3.")} == {"s3.ListObjectsV2": 1}

    # An older run committed late is not the newest; the next week's run is.
    _commit_audit(w, "week-0", 1_763_000_000, [second])
    assert drive(w.reaper(), latest, w.clock)["examined"] == 0
    _commit_audit(w, "week-2", 1_764_600_000, [second, kept.blob_key])
    report = drive(w.reaper(), latest, w.clock)
    assert report["audit_run"] == "week-2" and (report["examined"], report["purged"]) == (2, 1)
    assert not w.blob_exists(second) and w.blob_exists(kept.blob_key)
    # A stray object under the markers' prefix (it sorts after every marker) names no run.
    from lightmetrics.reaps import latest_audit_run
    w.ctx.store.put_if_absent(w.ctx.codec.audit_committed_root() + "zz-not-a-marker.json", b"{}")
    assert latest_audit_run(w.ctx.store, w.ctx.codec) == "week-2"


def test_an_audit_run_id_is_validated() -> None:
    from lightmetrics.reaps import InvalidReapInput, ReapParams

    for bad in ("../other", "", 7, "x" * 129):
        inp = gc_input(source="audit", audit_run=bad)
        try:
            ReapParams.parse(inp)
        except InvalidReapInput:
            continue
        raise AssertionError(f"audit_run {bad!r} was accepted")
    assert ReapParams.parse(gc_input(source="audit", audit_run="latest")).audit_run == "latest"


def test_a_latest_run_with_nothing_new_still_settles_marks_a_failed_reap_left(bucket: str) -> None:
    """A reap that failed after marking leaves delete markers on blobs; the next scheduled run
    settles them (G-I3) even when its audit was proven already, instead of a week later."""
    from lightmetrics.work import crashpoints

    w = make_world(bucket)
    orphan = w.orphan(ident(31))
    _commit_audit(w, "week-1", 1_764_000_000, [orphan])
    latest = gc_input(source="audit", audit_run="latest")
    hook, _ = crashpoints.crash_once_at("reap.page-recorded")  # the page's marks recorded, then it dies
    with crashpoints.hooked(hook):
        try:
            drive(w.reaper(), latest, w.clock, attempts=1)
        except crashpoints.InjectedCrash:
            pass
        else:
            raise AssertionError("the injected crash did not fire")
    w.reaper().end({"reap": {**w.reaper().table.get("checkpoint#reap", "current")}, "outcome": "failed",
                    "error": {"Error": "InjectedCrash"}})  # the ASL's Abort: the lease is released
    assert not w.blob_exists(orphan) and w.reaper().marks_items()  # hidden, its mark pending
    # The marks were recorded with the page, so the run's pass over week-1 has ended already.
    report = drive(w.reaper(), latest, w.clock)
    assert report["purged"] == 1 and not w.reaper().marks_items()
    assert w.versions(orphan) == ([], [])
