"""Retention against late writers: no derived entry outlives its hour's retention (docs/protocol.md
§16 R-I8), and a retention page's requests run concurrently without losing the fence or blockers.

A late writer is a real one (:func:`lightmetrics.derived.indexing.write_accepted_entries`, rule D5:
``accepted-by-blob`` first) whose cached "not tombstoned" answer is stale: its tombstone cache was
primed before the reap's tombstone and never expires. It writes the entries of a record of H that
had none yet (accepted, never indexed) at a chosen crash point of a real moto-backed reap
(``reap_support.drive``), as tests/test_invariant_reaps.py interleaves its takeovers.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import ALL_BACKENDS, FAST, ident
from reap_support import OLD_NS, World, drive, make_world, session

from lightmetrics.composition.services import work_context
from lightmetrics.derived.indexing import write_accepted_entries
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest
from lightmetrics.protocol.tombstones import TombstoneCache
from lightmetrics.reaps import CHECKPOINT_PK
from lightmetrics.reaps.gc import BlobCollector
from lightmetrics.reaps.gc_marks import stored_marks_items
from lightmetrics.reaps.gc_proof import DELETE_HOUR_TOMBSTONED, Proof
from lightmetrics.reaps.retention import HourRetention, PageRecords
from lightmetrics.work import crashpoints
from lightmetrics.work.units import WorkContext

BACKENDS = ALL_BACKENDS  # storage semantics: every test runs on moto and on MiniStack

_NS = 1_000_000_000
HOUR = UtcHour.of_unix_ns(OLD_NS)
RETENTION = {"mode": "retention", "dry_run": False, "hour": str(HOUR), "tombstone_wait_s": 0}
#: DynamoDB's item size limit (attribute names plus values) and a transaction's total size limit.
ITEM_LIMIT = 400 * 1024
TRANSACTION_LIMIT = 4 * 1024 * 1024


def stale_writer(w: World) -> WorkContext:
    """An indexer whose "not tombstoned" answer for HOUR, read before the reap, never expires."""
    ctx = work_context(w.settings, session=session(), clock=w.clock, policy=FAST, component="late-writer")
    cache = TombstoneCache(ctx.store, ctx.codec, now=lambda: 0.0)
    assert not cache.is_tombstoned("raw", HOUR)
    ctx.tombstones = cache
    return ctx


def record(w: World, manifest_key: str) -> AcceptedBatchManifest:
    return AcceptedBatchManifest.from_bytes(w.ctx.store.get(manifest_key))


def derived_entries_left(w: World, records: list[AcceptedBatchManifest]) -> list[str]:
    codec = w.ctx.codec
    keys = [codec.accepted_by_blob(m.frame_sha256, m.identity) for m in records]
    keys += w.ctx.store.list_keys(codec.accepted_by_time_hour(HOUR))
    return [k for k in keys if w.ctx.store.head(k) is not None]


def late_write_at(w: World, point: str, occurrence: int = 1) -> tuple[Any, list[AcceptedBatchManifest], list[str]]:
    """A world of three indexed records of HOUR and one accepted but never indexed; a hook that
    has the stale writer index that one at the ``occurrence``-th time ``point`` is reached."""
    results = [w.accept(ident(n)) for n in range(3)]
    late = w.accept(ident(9), index=False)
    w.cover_watermark()
    writer = stale_writer(w)
    records = [record(w, r.manifest_key) for r in [*results, late]]
    seen: list[str] = []
    lock = threading.Lock()

    def hook(name: str) -> None:
        with lock:
            if name != point:
                return
            seen.append(name)
            if len(seen) != occurrence:
                return
        write_accepted_entries(writer, late.manifest_key, records[-1])

    return hook, records, seen


def test_a_late_entry_landing_between_derived_and_by_time_deletes_leaves_no_derived_entry(bucket: str) -> None:
    """The adversarial review's case: the late writer's entries land after the page's
    ``accepted-by-blob`` deletes passed and before its ``accepted-by-time`` deletes."""
    w = make_world(bucket)
    hook, records, seen = late_write_at(w, "retention.derived-one")
    with crashpoints.hooked(hook):
        report = drive(w.reaper(), RETENTION, w.clock)
    assert seen, "retention.derived-one was never reached"
    assert report["hours_reaped"] == [str(HOUR)], report
    left = derived_entries_left(w, records)
    assert left == [], f"derived entries outlived the retention of {HOUR}: {left}"
    # The late entry was left for verify, which sent H through a second pass: its blob went too.
    marker = w.ctx.store.get(w.ctx.codec.retention_reaped("raw", HOUR))
    assert b'"verify_passes":2' in marker, marker
    assert not any(w.blob_exists(m.raw_blob_key) for m in records)


# Every point of a raw retention between its tombstone and its verify step, at which a late writer
# can land (its first occurrence; "reap.retention-step" first follows the commit step).
LATE_AT = ["retention.committed", "reap.retention-step", "gc.proved", "gc.marked-one", "reap.intent-recorded",
           "reap.page-recorded", "gc.rechecked", "gc.purged-version", "gc.settled-one", "reap.settle-recorded",
           "retention.derived-one", "retention.by-time-one"]


@pytest.mark.parametrize("point", LATE_AT)
def test_no_derived_entry_outlives_its_hours_retention_wherever_a_late_write_lands(bucket: str, point: str) -> None:
    w = make_world(bucket)
    hook, records, seen = late_write_at(w, point)
    with crashpoints.hooked(hook):
        report = drive(w.reaper(), RETENTION, w.clock)
    assert seen, f"{point} was never reached"
    assert report["hours_reaped"] == [str(HOUR)], report
    assert derived_entries_left(w, records) == []


def test_a_crash_between_a_records_two_deletes_resumes_without_leaving_an_entry(bucket: str) -> None:
    """Crash-safety of the combined step: killed after each record's ``accepted-by-blob`` delete
    and after each ``accepted-by-time`` delete (Step Functions retries the task), H still ends
    reaped with nothing derived left."""
    w = make_world(bucket)
    results = [w.accept(ident(n)) for n in range(4)]
    w.cover_watermark()
    records = [record(w, r.manifest_key) for r in results]
    fired: dict[str, int] = {}
    lock = threading.Lock()

    def crash_each_time(name: str) -> None:
        if name in ("retention.derived-one", "retention.by-time-one"):
            with lock:
                fired[name] = fired.get(name, 0) + 1
                if fired[name] in (1, 3):
                    raise crashpoints.InjectedCrash(name)

    with crashpoints.hooked(crash_each_time):
        report = drive(w.reaper(), {**RETENTION, "page_size": 2}, w.clock, attempts=6)
    assert set(fired) == {"retention.derived-one", "retention.by-time-one"}, fired
    assert report["hours_reaped"] == [str(HOUR)], report
    assert derived_entries_left(w, records) == []


def test_a_retention_page_reads_concurrently_and_deletes_in_batches_each_after_a_fence(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's record reads run on the pool; its deletes are two DeleteObjects (its
    accepted-by-blob entries, then its accepted-by-time entries), each right after a fence."""
    w = make_world(bucket)
    results = [w.accept(ident(n)) for n in range(6)]
    w.cover_watermark()
    w.clock.advance(600)
    reaper = w.reaper()
    reaper.begin({"input": {**RETENTION, "concurrency": 4}, "execution_arn": "conc"})
    hr = HourRetention(w.ctx, HOUR, concurrency=4)
    at_once, peak, fenced, lock = [0], [0], [], threading.Lock()
    get = w.ctx.store.get

    def slow_get(key: str) -> Any:
        with lock:
            at_once[0] += 1
            peak[0] = max(peak[0], at_once[0])
        try:
            threading.Event().wait(0.05)
            return get(key)
        finally:
            with lock:
                at_once[0] -= 1

    monkeypatch.setattr(w.ctx.store, "get", slow_get)
    keys, _ = hr.page("", 100)
    page = hr.records(keys)
    assert len(page.records) == 6 and peak[0] > 1, (len(page.records), peak)

    hr.fence = lambda: fenced.append(threading.current_thread().name)  # type: ignore[method-assign]
    deleted: list[list[str]] = []
    send = hr.ctx.store.client.delete_objects

    def delete_objects(**kw: Any) -> Any:
        with lock:
            assert len(fenced) > len(deleted), "a DeleteObjects without a fence before it"
            deleted.append([o["Key"] for o in kw["Delete"]["Objects"]])
        return send(**kw)

    monkeypatch.setattr(hr.ctx.store.client, "delete_objects", delete_objects)
    assert hr.delete_page(keys) == 6
    assert [len(d) for d in deleted] == [6, 6] and len(fenced) == 2
    codec = w.ctx.codec
    assert all(codec.parse(k).kind.name == "ACCEPTED_BY_BLOB" for k in deleted[0]) and deleted[1] == keys
    assert all(w.ctx.store.head(w.ctx.codec.accepted_by_time(HOUR, ident(n))) is None for n in range(6))
    assert results


def test_the_largest_retention_page_with_128_byte_ids_fits_dynamodbs_limits(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A blobs page of 1000 records (the schedule's page_size) with 128-byte agent and boot ids:
    every marks item under 400 KB, the page's transaction under 4 MB."""
    from test_invariant_reaps import dynamodb_item_size

    from lightmetrics.protocol.identity import BatchIdentity

    w = make_world(bucket)
    w.cover_watermark()
    page_size = 1000
    codec = w.ctx.codec
    hour_keys, records, proofs = [], {}, []
    for n in range(page_size):
        identity = BatchIdentity.create("a" * 120 + f"{n:08d}", "b" * 120 + f"{n:08d}", 2**64 - 2, 2**64 - 1)
        sha = f"{n:064x}"
        key = codec.accepted_by_time(HOUR, identity)
        hour_keys.append(key)
        records[key] = SimpleNamespace(identity=identity, frame_sha256=sha, raw_blob_key=codec.raw_blob(sha),
                                       accepted_at_unix_ns=OLD_NS)  # what the blobs page reads of a record
        proofs.append(Proof(codec.raw_blob(sha), sha, True, DELETE_HOUR_TOMBSTONED, version_id="v" * 32,
                            last_modified_unix_s=OLD_NS // _NS, identity=identity, record_hour=str(HOUR)))
    monkeypatch.setattr(HourRetention, "page", lambda self, after, limit: (hour_keys[:limit], False))
    monkeypatch.setattr(HourRetention, "records", lambda self, keys: PageRecords(records=dict(records)))
    monkeypatch.setattr(BlobCollector, "prove_all", lambda self, keys, now_ns=None: proofs)
    monkeypatch.setattr(BlobCollector, "mark", lambda self, intents: [m.placed("m" * 32) for m in intents])
    sent: list[int] = []
    table = w.ctx.table
    transact = table.transact

    def measured(ops: list[Any]) -> Any:
        sent.append(sum(dynamodb_item_size({"pk": o.pk, "sk": o.sk, **(o.item or {})}) for o in ops))
        return transact(ops)

    monkeypatch.setattr(table, "transact", measured)
    reaper = w.reaper()
    out = reaper.begin({"input": {**RETENTION, "page_size": page_size}, "execution_arn": "big"})
    out = reaper.retention({"reap": out["reap"]})  # commit: tombstone, record
    assert out["next"] == "gc", out
    out = reaper.gc({"reap": out["reap"]})  # the blobs page: intent, markers, marks
    items = stored_marks_items(table)
    assert sum(len(i["marks"]) for i in items) == page_size
    sizes = [dynamodb_item_size(i) for i in items]
    assert max(sizes) < ITEM_LIMIT, f"a marks item of {max(sizes)} bytes (limit {ITEM_LIMIT})"
    assert max(sent) < TRANSACTION_LIMIT, f"a transaction of {max(sent)} bytes (limit {TRANSACTION_LIMIT})"


def test_the_retention_schedule_runs_pages_of_1000() -> None:
    import json

    from lightmetrics.deployment.resources import SPEC
    from lightmetrics.reaps import ReapParams

    reap = next(s for s in SPEC.state_machines if s.name == "reap")
    params = ReapParams.parse(json.loads(reap.disabled_schedule_input))
    assert (params.mode, params.page_size) == ("retention", 1000)


def test_a_checkpoint_left_in_the_by_time_phase_by_an_older_version_is_finished(bucket: str) -> None:
    """An older version ran step 4 as its own ``by-time`` phase; a checkpoint it left there (a
    deployment mid-reap) runs as the combined step and finishes the hour."""
    from lightmetrics.reaps import CHECKPOINT_SK

    w = make_world(bucket)
    results = [w.accept(ident(n)) for n in range(3)]
    w.cover_watermark()
    records = [record(w, r.manifest_key) for r in results]
    table, rewritten = w.ctx.table, []

    def older_checkpoint(task: str, event: dict[str, Any]) -> None:
        cp = table.get(CHECKPOINT_PK, CHECKPOINT_SK)
        if task == "retention" and cp and cp.get("phase") == "derived" and not rewritten:
            table.update(CHECKPOINT_PK, CHECKPOINT_SK, "SET #p = :p", names={"#p": "phase"}, values={":p": "by-time"})
            rewritten.append(True)

    report = drive(w.reaper(), RETENTION, w.clock, before_task=older_checkpoint)
    assert rewritten and report["hours_reaped"] == [str(HOUR)], report
    assert derived_entries_left(w, records) == []
