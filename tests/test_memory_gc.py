"""GC's decisions on the in-memory adapters (fast; tests/test_reap*.py run the same on moto).

A blob is deleted only when authoritative reads prove it unreferenced; a referenced, young,
conflict-evidence or unreadable-record blob is kept; the handshake restores a blob an accept
referenced after it was marked; and a task that lost its lease deletes nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from botocore.exceptions import ClientError
from conftest import ident, make_frame
from memory_support import HORIZON_S, memory_world
from reap_support import drive

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.derived.indexing import index_quarantine
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps import Reaper
from lightmetrics.reaps import gc_proof as gcm
from lightmetrics.reaps.gc import CP_PURGED_MARKERS, BlobCollector
from lightmetrics.reaps.params import LEASE_PK
from lightmetrics.work import crashpoints
from lightmetrics.work.leases import LeaseLost, take

_NS = 1_000_000_000


def gc_input(**kw):  # type: ignore[no-untyped-def]
    return {"mode": "gc", "dry_run": False, **kw}


def test_each_proof_reads_the_authorities_and_says_why() -> None:
    w = memory_world()
    kept = w.accept(ident(1))
    orphan = w.orphan(ident(2))
    w.accept(ident(3))
    conflict = accept_batch(w.system.accept, ident(3), make_frame(ident(3), variant=9.0))
    assert conflict.status.value == "identity_conflict"
    gc = BlobCollector(w.ctx, w.settings)
    proofs = {p.key: p for p in gc.prove_all([kept.blob_key, orphan, conflict.blob_key, w.ctx.codec.raw_blob("ab" * 32)])}
    assert (proofs[orphan].deletable, proofs[orphan].reason) == (True, gcm.DELETE_UNREFERENCED)
    assert (proofs[kept.blob_key].deletable, proofs[kept.blob_key].reason) == (False, gcm.KEEP_REFERENCED)
    # the conflict's blob was written "now" (the accept context's clock): young, and evidence
    assert proofs[conflict.blob_key].reason == gcm.KEEP_YOUNG
    assert gc.prove(conflict.blob_key, now_ns=w.clock.now_ns() + (HORIZON_S + 1) * _NS).reason == gcm.KEEP_CONFLICT
    assert proofs[w.ctx.codec.raw_blob("ab" * 32)].reason == gcm.KEEP_GONE
    # the proofs read S3 only: nothing was written or deleted
    assert w.store.requests["DeleteObjects"] == w.store.requests["DeleteObject"] == 0


def test_a_blob_whose_record_cannot_be_read_is_kept_and_the_record_blocked() -> None:
    w = memory_world()
    orphan = w.orphan(ident(4))
    record = w.ctx.codec.accepted(ident(4))
    w.store.put_if_absent(record, b'{"schema": "not a manifest"}')  # a record this reader cannot trust
    proof = BlobCollector(w.ctx, w.settings).prove(orphan)
    assert (proof.deletable, proof.reason) == (False, gcm.KEEP_RECORD_UNREADABLE)
    [blocker] = w.ctx.blockers.list(status="open")
    assert blocker.object_key == record


def test_a_gc_reap_purges_only_the_proven_orphan() -> None:
    w = memory_world()
    kept = w.accept(ident(5))
    orphan = w.orphan(ident(6))
    young = w.orphan(ident(7))
    w.store.set_last_modified(young, w.clock.now_ns())  # written just now: inside the horizon
    report = drive(Reaper(w.ctx, w.settings), gc_input(), w.clock)
    assert report["status"] == "finished"
    assert (report["examined"], report["marked"], report["purged"], report["restored"]) == (3, 1, 1, 0)
    assert report["kept"] == {"referenced": 1, "younger-than-horizon": 1}
    assert w.versions(orphan) == ([], []) and w.store.head(orphan) is None
    assert w.store.get(kept.blob_key) is not None and w.store.get(young) is not None
    hint = w.ctx.codec.raw_blobs_by_time(UtcHour.of_unix_ns(w.accept_clock.now_ns()), orphan.rsplit("/", 1)[-1].split(".")[0])
    assert w.store.head(hint) is None  # the purged blob's discovery hint went with it


def test_a_dry_run_deletes_nothing() -> None:
    w = memory_world()
    orphan = w.orphan(ident(8))
    report = drive(Reaper(w.ctx, w.settings), gc_input(dry_run=True), w.clock)
    assert (report["deletable"], report["marked"], report["purged"]) == (1, 0, 0)
    assert w.versions(orphan)[1] == [] and w.store.requests["DeleteObjects"] == 0


def test_an_accept_that_lands_after_the_mark_gets_its_blob_back() -> None:
    w = memory_world()
    orphan = w.orphan(ident(9))
    gc = BlobCollector(w.ctx, w.settings)
    [mark] = gc.mark([gc.intent(gc.prove(orphan), w.clock.now_ns())])
    assert w.store.get(orphan) is None  # hidden by its marker
    retried = w.accept(ident(9), variant=0.5)  # the agent's retry: same content, the record lands
    assert retried.status.value == "accepted" and retried.blob_key == orphan
    assert gc.settle([mark]) == ["restored"]
    assert w.store.get(orphan) == make_frame(ident(9), 0.5) and w.versions(orphan)[1] == []


def test_settle_before_the_grace_is_refused() -> None:
    w = memory_world(grace_s=900)
    orphan = w.orphan(ident(10))
    gc = BlobCollector(w.ctx, w.settings)
    [mark] = gc.mark([gc.intent(gc.prove(orphan), w.clock.now_ns())])
    with pytest.raises(ValueError, match="inside the grace period"):
        gc.settle([mark])
    w.clock.advance(900)
    assert gc.settle([mark]) == ["purged"] and w.versions(orphan) == ([], [])


def test_a_settle_rerun_after_its_purge_died_deletes_the_purged_blobs_hint() -> None:
    """G-I9: a mark without its marker id (the marking DeleteObjects' answer was lost) whose settle
    died after the purge's versions went: the re-run finds the captured version gone and still
    deletes the blob's raw-blobs-by-time hint (found by the simulation, seed 111)."""
    w = memory_world()
    orphan = w.orphan(ident(16))
    hint = w.ctx.codec.raw_blobs_by_time(UtcHour.of_unix_ns(w.accept_clock.now_ns()), orphan.rsplit("/", 1)[-1].split(".")[0])
    gc = BlobCollector(w.ctx, w.settings)
    [mark] = gc.mark([gc.intent(gc.prove(orphan), w.clock.now_ns())])
    mark = replace(mark, marker_version_id=None)  # its answer was lost
    hook, _ = crashpoints.crash_once_at(CP_PURGED_MARKERS)
    with crashpoints.hooked(hook), pytest.raises(crashpoints.InjectedCrash):
        gc.settle([mark])
    assert w.versions(orphan) == ([], []) and w.store.head(hint) is not None  # died before the hint
    assert gc.settle([mark]) == ["purged"]
    assert w.store.head(hint) is None


def test_a_collector_whose_fence_fails_deletes_nothing() -> None:
    w = memory_world()
    orphan = w.orphan(ident(11))

    def lost() -> None:
        raise LeaseLost("another reap took the lease")

    gc = BlobCollector(w.ctx, w.settings, fence=lost)
    with pytest.raises(LeaseLost):
        gc.mark([gc.intent(gc.prove(orphan), w.clock.now_ns())])
    assert w.store.requests["DeleteObjects"] == 0 and w.versions(orphan)[1] == []


def test_a_reap_task_that_lost_its_lease_deletes_nothing() -> None:
    w = memory_world()
    orphan = w.orphan(ident(12))
    old = Reaper(w.ctx, w.settings)
    out = old.begin({"input": gc_input(lease_seconds=900), "execution_arn": "old"})
    w.clock.advance(901)  # the old run stalls past its lease; another run takes it
    take(w.table, LEASE_PK, old.lease(), owner="thief", lease_seconds=900, now_ns=w.clock.now_ns(), what="reap")
    with pytest.raises(LeaseLost):
        old.gc({"reap": out["reap"]})
    assert w.store.requests["DeleteObjects"] == 0 and w.store.get(orphan) is not None


def test_a_delete_s3_refuses_stops_only_its_mark() -> None:
    w = memory_world()
    first, second = w.orphan(ident(13)), w.orphan(ident(14))
    gc = BlobCollector(w.ctx, w.settings)
    marks = gc.mark([gc.intent(p, w.clock.now_ns()) for p in gc.prove_all([first, second])])
    w.store.fail("DeleteObjects", "SlowDown", key_contains=first)
    with pytest.raises(ClientError, match="SlowDown"):
        gc.settle(marks)
    assert w.versions(second) == ([], [])  # settled
    assert w.versions(first)[0] != []  # its captured version stays; the next settle finishes it
    assert gc.settle([m for m in marks if m.key == first]) == ["purged"] and w.versions(first) == ([], [])


def test_quarantine_evidence_is_indexed_and_kept_until_resolved() -> None:
    w = memory_world()
    w.accept(ident(15))
    conflict = accept_batch(w.system.accept, ident(15), make_frame(ident(15), variant=3.0))
    index_quarantine(w.ctx, conflict.quarantine_key or "")
    w.clock.advance(HORIZON_S + 120)
    report = drive(Reaper(w.ctx, w.settings), gc_input(), w.clock)
    assert report["kept"] == {"referenced": 1, "conflict-unresolved": 1} and report["purged"] == 0
    assert w.store.get(conflict.blob_key or "") is not None
