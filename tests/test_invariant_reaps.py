"""Issue 13, reaps: the invariants of lease fencing, item sizes, blocked keys and resumed retention.

Every test runs the reap's real task methods against the moto server (``reap_support.drive``,
the state machine's loop in Python) and interleaves with crash-point hooks
(:mod:`lightmetrics.work.crashpoints`) and a FrozenClock, as tests/test_reap_crash.py does.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from conftest import ident
from reap_support import OLD_NS, RETENTION_S, World, drive, make_world, request_recorder
from test_retention_ranges import plan

from lightmetrics.admin.blocker_actions import resume, skip
from lightmetrics.derived.walk import InvalidWalkInput, WalkParams
from lightmetrics.protocol.control_store import plain
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.reaps import CHECKPOINT_PK, RANGE_PK, InvalidReapInput, LeaseLost, Reaper, ReapParams
from lightmetrics.reaps.gc import BlobCollector
from lightmetrics.reaps.gc_marks import Mark, decode_mark, stored_marks_items
from lightmetrics.reaps.gc_proof import Proof
from lightmetrics.reaps.mark_settle import CandidatePage
from lightmetrics.work import crashpoints

_NS = 1_000_000_000
HOUR = UtcHour.of_unix_ns(OLD_NS)
GC = {"mode": "gc", "dry_run": False}
RETENTION = {"mode": "retention", "dry_run": False, "hour": str(HOUR), "tombstone_wait_s": 0}
ROLLUP = {"mode": "retention", "scope": "rollup", "dry_run": False, "hour": str(HOUR), "tombstone_wait_s": 0}
#: DynamoDB's item size limit (attribute names plus values).
ITEM_LIMIT = 400 * 1024


@contextmanager
def deletes_counted(w: World) -> Iterator[dict[str, int]]:
    """Counts the S3 DeleteObject and DeleteObjects requests sent while ``counts["on"]`` is set
    (botocore before-send)."""
    counts = {"on": 0, "deletes": 0}

    def on_send(**_kw: Any) -> None:
        if counts["on"]:
            counts["deletes"] += 1

    for op in ("DeleteObject", "DeleteObjects"):
        w.s3.meta.events.register(f"before-send.s3.{op}", on_send)
    try:
        yield counts
    finally:
        for op in ("DeleteObject", "DeleteObjects"):
            w.s3.meta.events.unregister(f"before-send.s3.{op}", on_send)


def real_s3_listing(w: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """ListObjectsV2 as real S3 answers it: no common prefix whose keys are all deleted (moto lists
    a prefix that only delete markers are left under)."""
    store = w.ctx.store
    list_page = store.list_page  # type: ignore[attr-defined]

    def listing(prefix: str, **kw: Any) -> Any:
        page = list_page(prefix, **kw)
        if kw.get("delimiter"):
            page = dataclasses.replace(page, prefixes=[p for p in page.prefixes if list_page(p, max_keys=1).keys])
        return page

    monkeypatch.setattr(store, "list_page", listing)


def takeover(w: World, lease_seconds: int = 900) -> dict[str, Any]:
    """Another reap takes the lease once this one's expired (a new epoch)."""
    w.clock.advance(lease_seconds + 1)
    return w.reaper().begin({"input": {"mode": "gc", "dry_run": True}, "execution_arn": "epoch-b"})


# --------------------------------------------------------------------------------- property 2
SERIAL_GC = {**GC, "concurrency": 1}  # one request at a time: the takeover lands between two of them
LOST_AT = {
    "reap.intent-recorded": SERIAL_GC,  # the page's intent recorded: the markers come next
    "gc.rechecked": SERIAL_GC,  # the settle proved the mark again: the purge comes next
    # one request at a time here too: a retention page's deletes otherwise run concurrently
    "retention.derived-one": {**RETENTION, "concurrency": 1},
    "retention.by-time-one": {**RETENTION, "concurrency": 1},
    "retention.rollup-object-one": ROLLUP,
}


def reap_state(w: World) -> tuple[list[Any], list[Any]]:
    """Everything a reap task may change: every version and delete marker in the bucket, and every
    item of the reap's control-table partitions (summary, marks, source cursors, range items)."""
    r = w.s3.list_object_versions(Bucket=w.settings.bucket)
    assert not r.get("IsTruncated"), "a world this small lists in one page"
    objects = sorted((v["Key"], v["VersionId"], "Size" not in v) for v in [*r.get("Versions", []),
                                                                           *r.get("DeleteMarkers", [])])
    items = [plain(i) for pk in (CHECKPOINT_PK, RANGE_PK) for i in w.ctx.table.query(pk)]
    return objects, sorted(items, key=lambda i: (i["pk"], i["sk"]))


@pytest.mark.parametrize("point", sorted(LOST_AT))
def test_property_2_a_task_that_outlived_its_lease_changes_nothing_afterwards(bucket: str, point: str) -> None:
    """Rule L2: once another reap took the lease, the task deletes nothing and writes nothing —
    the bucket (every version and marker) and the reap's control-table items stay as the takeover
    left them."""
    w = make_world(bucket)
    for n in range(3):
        w.accept(ident(n))
    for n in (7, 8):
        w.orphan(ident(n))
    w.rollups(HOUR)
    w.cover_watermark()
    taken: list[dict[str, Any]] = []
    at_takeover: list[Any] = []

    lock = threading.Lock()
    with deletes_counted(w) as counts:
        def lose_the_lease(name: str) -> None:
            with lock:
                if name == point and not taken:
                    taken.append(takeover(w))  # task A is in the middle of its step; epoch B begins
                    at_takeover.append(reap_state(w))
                    counts["on"] = 1  # from here on, A must not delete anything

        with crashpoints.hooked(lose_the_lease), pytest.raises(LeaseLost):
            drive(w.reaper(), LOST_AT[point], w.clock, attempts=1)
    assert taken, f"{point} was never reached"
    assert counts["deletes"] == 0, f"task A sent {counts['deletes']} DeleteObject after losing its lease at {point}"
    assert reap_state(w) == at_takeover[0], f"task A changed the bucket or the control table after {point}"
    lease = w.reaper().lease()
    assert lease.epoch == taken[0]["reap"]["epoch"] and lease.owner == taken[0]["reap"]["owner"]


def test_property_2_an_earlier_epochs_intent_is_settled_only_once_its_writer_cannot_be_running(bucket: str) -> None:
    w = make_world(bucket)
    frame_variant = 0.5
    orphan = w.orphan(ident(1), variant=frame_variant)

    # Epoch A records the intent for the orphan, then its task stalls before the marker answers.
    def stall(name: str) -> None:
        if name == "reap.intent-recorded":
            raise crashpoints.InjectedCrash(name)

    a = w.reaper()
    out = a.begin({"input": GC, "execution_arn": "epoch-a"})
    with crashpoints.hooked(stall), pytest.raises(crashpoints.InjectedCrash):
        a.gc({"reap": out["reap"]})
    # Meanwhile the batch is accepted (its blob PUT answers 412: the blob exists): now referenced.
    accepted = w.accept(ident(1), variant=frame_variant)
    assert accepted.status.value == "accepted" and accepted.blob_key == orphan

    # Epoch B takes over once A's lease expired. A's DeleteObject, sent before it lost the lease,
    # lands 300 s later: within the reap-gc task timeout (600 s), so A could still be running.
    w.clock.advance(901)
    landed_at = w.clock.now_ns() + 300 * _NS
    landed: list[str] = []

    def a_marker_lands() -> None:
        if not landed:
            landed.append(w.s3.delete_object(Bucket=w.settings.bucket, Key=orphan).get("VersionId"))

    def before_task(_next: str, _event: dict[str, Any]) -> None:
        if w.clock.now_ns() >= landed_at:
            a_marker_lands()

    report = drive(w.reaper(), GC, w.clock, before_task=before_task)
    assert report["status"] == "finished"
    if not landed:
        w.clock.advance(max(0, (landed_at - w.clock.now_ns()) // _NS))
        a_marker_lands()
    # The accepted batch's blob is readable: A's marker was found and removed by B's settle.
    assert w.blob_exists(orphan), f"the accepted blob is hidden by epoch A's marker; B reported {report}"
    assert report["restored"] == 1, report


def test_property_2_a_lease_shorter_than_the_longest_task_is_refused_at_start(bucket: str) -> None:
    from lightmetrics.deployment.resources import FUNCTIONS

    reap_timeout = max(f.timeout_s for f in FUNCTIONS if f.name.startswith("reap-"))
    walk_timeout = max(f.timeout_s for f in FUNCTIONS if f.name.startswith("walk-"))
    with pytest.raises(InvalidReapInput, match="L1") as reap_exc:
        ReapParams.parse({**GC, "lease_seconds": reap_timeout})
    assert "reap-gc" in str(reap_exc.value) or str(reap_timeout) in str(reap_exc.value)
    with pytest.raises(InvalidWalkInput, match="L1"):
        WalkParams.parse({"lease_seconds": walk_timeout})
    w = make_world(bucket)
    with pytest.raises(InvalidReapInput, match="L1"):
        w.reaper().begin({"input": {**GC, "lease_seconds": reap_timeout}, "execution_arn": "x"})
    assert w.reaper().lease() is None  # refused before taking anything
    assert ReapParams.parse(GC).lease_seconds == 900 and WalkParams.parse({}).lease_s == 900
    # The rollup's lease fences its commit, whose longest run comes from the S3 access it uses.
    from lightmetrics_pipeline.rollup.job import RollupJob, commit_step_s
    from lightmetrics_pipeline.s3io import S3Access

    access = S3Access(bucket)
    with pytest.raises(ValueError, match="L1"):
        RollupJob(None, access, table=w.ctx.table, lease_s=commit_step_s(access))


# --------------------------------------------------------------------------------- property 3
def dynamodb_item_size(item: dict[str, Any]) -> int:
    """An item's size as DynamoDB counts it (names + values; numbers at their 21-byte maximum,
    3 bytes per list/map plus 1 per element)."""

    def value(v: Any) -> int:
        if isinstance(v, str):
            return len(v.encode())
        if isinstance(v, bool) or v is None:
            return 1
        if isinstance(v, (int, float, Decimal)):
            return 21
        if isinstance(v, (bytes, bytearray)):
            return len(v)
        if isinstance(v, list):
            return 3 + sum(1 + value(x) for x in v)
        if isinstance(v, dict):
            return 3 + sum(1 + len(k.encode()) + value(x) for k, x in v.items())
        raise TypeError(type(v))

    return sum(len(k.encode()) + value(v) for k, v in item.items())


def _long_identity(n: int) -> BatchIdentity:
    return BatchIdentity.create("a" * 120 + f"{n:08d}", "b" * 120 + f"{n:08d}", 2**64 - 2, 2**64 - 1)


@pytest.mark.parametrize("version_id_bytes", [32, 1024])  # what S3 returns; the documented maximum
def test_property_3_the_largest_gc_page_with_128_byte_ids_fits_dynamodbs_item_limit(
        bucket: str, monkeypatch: pytest.MonkeyPatch, version_id_bytes: int) -> None:
    w = make_world(bucket)
    page_size = 1000  # the largest page_size the docs allow
    codec = w.ctx.codec
    proofs = []
    for n in range(page_size):
        sha = f"{n:064x}"
        proofs.append(Proof(codec.raw_blob(sha), sha, True, "unreferenced", version_id="v" * version_id_bytes,
                            last_modified_unix_s=OLD_NS // _NS, identity=_long_identity(n)))
    monkeypatch.setattr(Reaper, "candidates", lambda self, cp: CandidatePage([p.key for p in proofs], proofs[-1].key, False))
    monkeypatch.setattr(BlobCollector, "prove_all", lambda self, keys, now_ns=None: proofs)
    marked_seen: list[int] = []

    def mark(self: BlobCollector, intents: list[Mark]) -> list[Mark]:
        marked_seen.append(len(intents))
        return [m.placed("m" * version_id_bytes) for m in intents]

    monkeypatch.setattr(BlobCollector, "mark", mark)
    reaper = w.reaper()
    out = reaper.begin({"input": {**GC, "page_size": page_size}, "execution_arn": "big"})
    out = reaper.gc({"reap": out["reap"]})  # one page: intent recorded, markers, marks recorded
    assert marked_seen == [page_size]
    items = [*w.ctx.table.query(CHECKPOINT_PK), *stored_marks_items(w.ctx.table)]  # as stored (every page)
    marks_items = [i for i in items if str(i["sk"]).startswith("marks#")]
    assert sum(len(i["marks"]) for i in marks_items) == page_size
    # every mark recorded with its marker (stored compactly: gc.encode_mark, rule G-I7)
    assert all(decode_mark(m, codec, 0).marker_version_id for i in marks_items for m in i["marks"])
    sizes = [dynamodb_item_size(i) for i in items]
    assert max(sizes) < ITEM_LIMIT, f"an item of {max(sizes)} bytes (limit {ITEM_LIMIT})"


def test_property_3_an_audit_part_larger_than_a_page_is_consumed_in_several_pages(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_world(bucket)
    kept = w.accept(ident(11))
    orphans = [w.orphan(ident(12)), w.orphan(ident(13))]
    gone = [w.ctx.codec.raw_blob(f"{n:064x}") for n in range(5)]  # listed by the audit, since deleted
    run = w.ctx.codec.audit_run("big-part")
    rows = [{"blob_key": k, "reason": "unreferenced"} for k in [*gone[:2], orphans[0], kept.blob_key, *gone[2:],
                                                                   orphans[1]]]
    body = b"\n".join(json.dumps(r).encode() for r in rows) + b"\n"
    w.ctx.store.put_if_absent(f"{run}orphan-blob-candidates/part-00000.jsonl", body)
    w.ctx.store.put_if_absent(f"{run}orphan-blob-candidates/part-00001.jsonl", b"")
    w.ctx.store.put_if_absent(f"{run}summary.json", b"{}")
    seen: list[int] = []
    prove_all = BlobCollector.prove_all

    def counting(self: BlobCollector, keys: list[str], **kw: Any) -> Any:
        seen.append(len(keys))
        return prove_all(self, keys, **kw)

    monkeypatch.setattr(BlobCollector, "prove_all", counting)
    cursors: list[str] = []

    def before_task(_next: str, _event: dict[str, Any]) -> None:
        cp = w.ctx.table.get(CHECKPOINT_PK, "current")
        cursors.append(str(cp.get("after") or ""))

    report = drive(w.reaper(), {**GC, "source": "audit", "audit_run": "big-part", "page_size": 3}, w.clock,
                   before_task=before_task)
    assert max(seen) <= 3 and sum(seen) == len(rows), seen
    assert report["examined"] == len(rows) and report["purged"] == 2, report
    assert report["kept"] == {"gone": 5, "referenced": 1}, report
    assert any("part-00000.jsonl#" in c for c in cursors), cursors  # a cursor inside the part file
    assert not any(w.blob_exists(o) for o in orphans) and w.blob_exists(kept.blob_key)


def test_property_3_a_page_split_over_several_marks_items_settles_every_mark(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import lightmetrics.reaps.gc_marks as marks_module  # where a page's items are split

    w = make_world(bucket)
    orphans = [w.orphan(ident(n)) for n in range(5)]
    monkeypatch.setattr(marks_module, "MARKS_ITEM_MAX_BYTES", 600)  # about one (compact) mark per item
    parts: list[int] = []

    def before_task(_next: str, _event: dict[str, Any]) -> None:
        items = stored_marks_items(w.ctx.table)
        parts.append(len(items))

    report = drive(w.reaper(), {**GC, "page_size": 10}, w.clock, before_task=before_task)
    assert max(parts) >= 3, parts
    assert (report["marked"], report["purged"]) == (5, 5), report
    assert all(w.versions(o) == ([], []) for o in orphans)


# --------------------------------------------------------------------------------- property 6
def test_property_6_one_unreadable_record_never_stops_a_reap(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_world(bucket)
    real_s3_listing(w, monkeypatch)
    results = [w.accept(ident(n)) for n in range(4)]
    w.cover_watermark()
    codec = w.ctx.codec
    unreadable, vanished = results[1], results[2]
    record_bytes = w.ctx.store.get(unreadable.manifest_key)
    w.s3.put_object(Bucket=w.settings.bucket, Key=unreadable.manifest_key, Body=b"{not json")
    w.s3.delete_object(Bucket=w.settings.bucket, Key=vanished.manifest_key)

    report = drive(w.reaper(), RETENTION, w.clock)
    assert report["status"] == "finished", report
    # Every other key was reaped ...
    for r in (results[0], results[3]):
        assert not w.blob_exists(r.blob_key)
        assert w.ctx.store.head(codec.accepted_by_time(HOUR, ident(results.index(r)))) is None
    # ... the two bad keys are blockers and reported; the hour is tombstoned, not reaped.
    blocked = {b.object_key: b for b in w.ctx.blockers.list() if b.kind == "reap-retention"}
    by_time = {codec.accepted_by_time(HOUR, ident(1)), codec.accepted_by_time(HOUR, ident(2))}
    assert set(blocked) == by_time, blocked
    assert sorted(report["blocked"]) == sorted(f"reap-retention:{k}" for k in by_time), report
    assert report["kept"].get("blocked") == 2, report
    assert str(HOUR) in report["hours_skipped"] and report["hours_reaped"] == []
    assert w.ctx.store.head(codec.retention_tombstone("raw", HOUR)) is not None
    assert w.ctx.store.head(codec.retention_reaped("raw", HOUR)) is None
    assert all(w.ctx.store.head(k) is not None for k in by_time)  # the enumeration of the blocked keys stays

    # While a blocker is open, a later run leaves the hour unfinished.
    again = drive(w.reaper(), {"mode": "retention", "dry_run": False, "tombstone_wait_s": 0}, w.clock)
    assert again["hours"] == [str(HOUR)] and again["hours_reaped"] == [], again
    # The operator repairs one record and resumes its blocker, and skips the other.
    w.s3.put_object(Bucket=w.settings.bucket, Key=unreadable.manifest_key, Body=record_bytes)
    resume(w.ctx, f"reap-retention:{codec.accepted_by_time(HOUR, ident(1))}", who="op")
    skip(w.ctx, f"reap-retention:{codec.accepted_by_time(HOUR, ident(2))}", who="op", reason="record lost")
    final = drive(w.reaper(), {"mode": "retention", "dry_run": False, "tombstone_wait_s": 0}, w.clock)
    assert final["hours_reaped"] == [str(HOUR)], final
    assert w.ctx.store.head(codec.retention_reaped("raw", HOUR)) is not None
    assert w.ctx.store.list_keys(codec.accepted_by_time_hour(HOUR)) == []
    assert not w.blob_exists(unreadable.blob_key)  # its blob went once its record was readable again
    assert not w.ctx.blockers.list()


# --------------------------------------------------------------------------------- property 7
@pytest.mark.parametrize("ranges", [1, 4])
def test_property_7_retention_that_failed_after_its_last_delete_is_finished_by_the_scheduled_run(
        bucket: str, monkeypatch: pytest.MonkeyPatch, ranges: int) -> None:
    """Its hour is in no listing any more (real S3 lists no prefix whose keys are all deleted), in
    one key range or several (docs/protocol.md §16 R-I6, RR1)."""
    w = make_world(bucket)
    real_s3_listing(w, monkeypatch)
    for n in range(8):
        w.accept(ident(n))
    w.cover_watermark()
    if ranges > 1:
        plan(w.ctx, ranges)
    codec = w.ctx.codec
    deleted: list[str] = []

    def crash_after_the_last_entry(name: str) -> None:
        if name == "retention.by-time-one":  # one DeleteObjects for a (range's) page's entries
            deleted.append(name)
            if len(deleted) == ranges:  # the last one: every entry of the hour is deleted
                raise RuntimeError("the retention task dies before the verify step")

    with crashpoints.hooked(crash_after_the_last_entry), pytest.raises(RuntimeError):
        drive(w.reaper(), RETENTION, w.clock, attempts=1)
    assert len(deleted) == ranges
    assert w.ctx.store.list_keys(codec.accepted_by_time_hour(HOUR)) == []
    assert w.ctx.store.list_page(codec.root(KeyKind.ACCEPTED_BY_TIME), delimiter="/").prefixes == [], \
        "S3 lists no prefix of the emptied hour"
    assert w.ctx.store.head(codec.retention_tombstone("raw", HOUR)) is not None
    assert w.ctx.store.head(codec.retention_reaped("raw", HOUR)) is None
    # The next scheduled run names no hour: it must find the unfinished one in the control table.
    report = drive(w.reaper(), {"mode": "retention", "dry_run": False, "hour": None, "page_size": 1000,
                                "tombstone_wait_s": 0}, w.clock)  # the schedule's input (docs/reaps.md)
    assert report["status"] == "finished", report
    assert report["hours"] == [str(HOUR)] and report["hours_reaped"] == [str(HOUR)], report
    assert w.ctx.store.head(codec.retention_reaped("raw", HOUR)) is not None
    record = w.ctx.table.get("retention#raw", str(HOUR))
    assert record["status"] == "reaped"


def test_property_7_rollup_retention_that_failed_part_way_is_finished_by_a_later_run(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_world(bucket)
    real_s3_listing(w, monkeypatch)
    keys = w.rollups(HOUR)
    codec = w.ctx.codec
    deleted: list[str] = []

    def crash_after_the_last_object(name: str) -> None:
        if name == "retention.rollup-object-one":
            deleted.append(name)
            if len(deleted) == len(keys):
                raise RuntimeError("the retention task dies before the verify step")

    with crashpoints.hooked(crash_after_the_last_object), pytest.raises(RuntimeError):
        drive(w.reaper(), ROLLUP, w.clock, attempts=1)
    assert all(w.ctx.store.head(k) is None for k in keys)
    report = drive(w.reaper(), {"mode": "retention", "scope": "rollup", "dry_run": False, "tombstone_wait_s": 0},
                   w.clock)
    assert report["hours"] == [str(HOUR)] and report["hours_reaped"] == [str(HOUR)], report
    assert w.ctx.store.head(codec.retention_reaped("rollup", HOUR)) is not None


def test_every_s3_request_of_a_reap_task_is_allowed_by_its_function_spec(bucket: str) -> None:
    """These tasks run here as the deployer, and moto does not evaluate s3:prefix conditions
    (docs/deploy.md, "IAM enforced locally"): record every S3 request each reap task makes (GC, retention with
    a vanished record, rollup retention) and check it against the task's FunctionSpec, from which
    CDK builds the role. A request outside it would be a 403 on AWS."""
    from lightmetrics.deployment.resources import SPEC

    w = make_world(bucket)
    results = [w.accept(ident(n)) for n in range(3)]
    w.orphan(ident(7))
    w.rollups(HOUR)
    w.cover_watermark()
    w.s3.delete_object(Bucket=w.settings.bucket, Key=results[1].manifest_key)  # a vanished record
    task = {"name": "reap-begin"}
    seen: list[tuple[str, str, str]] = []

    record = request_recorder(task, seen)

    w.s3.meta.events.register("before-parameter-build.s3", record)

    def before(nxt: str, _event: Any) -> None:
        task["name"] = f"reap-{nxt}"

    reaper = w.reaper()
    for inp in ({"mode": "gc", "dry_run": False}, {"mode": "retention", "dry_run": False, "tombstone_wait_s": 0},
                {"mode": "retention", "scope": "rollup", "dry_run": False, "tombstone_wait_s": 0}):
        task["name"] = "reap-begin"
        drive(reaper, inp, w.clock, before_task=before)
    allowed = {"GetObject": "s3_read", "HeadObject": "s3_read", "PutObject": "s3_write",
               "ListObjectsV2": "s3_list", "ListObjectVersions": "s3_list", "DeleteObject": "s3_delete"}
    refused = []
    for name, op, where in seen:
        prefixes = getattr(SPEC.function(name), allowed.get(op, "none"), ())
        if not any(where.startswith(w.ctx.codec.prefix + p) for p in prefixes):
            refused.append((name, op, where))
    assert {name for name, _, _ in seen} >= {"reap-begin", "reap-gc", "reap-retention"}
    assert not refused, f"{len(refused)} requests a deployed role refuses, e.g. {refused[:5]}"


@pytest.mark.parametrize("source", ["scan", "audit", "by-time"])
def test_property_6_one_bad_gc_candidate_never_stops_a_reap(bucket: str, source: str) -> None:
    """A stray key under raw-blobs/v1/ (scan), a malformed audit line (audit) or a stray key under
    raw-blobs-by-time/v1/ (by-time) becomes a ``reap-gc`` blocker; every other candidate is handled."""
    w = make_world(bucket)
    kept = w.accept(ident(21))
    orphans = [w.orphan(ident(22)), w.orphan(ident(23))]
    inp: dict[str, Any] = {**GC}
    if source == "scan":
        bad = "raw-blobs/v1/sha256/zz/stray.txt"
        w.ctx.store.put_if_absent(bad, b"x")
    elif source == "by-time":
        bad = "raw-blobs-by-time/v1/date=2020-01-01/hour=00/not-a-blob.json"
        w.ctx.store.put_if_absent(bad, b"{}")
        inp["source"] = "by-time"
        w.clock.advance(2 * 3600)  # the orphans' raw-blobs-by-time hour is past the retry horizon
    else:
        run = w.ctx.codec.audit_run("bad-line")
        lines = [json.dumps({"blob_key": orphans[0]}).encode(), b"{not json", json.dumps({"blob_key": orphans[1]}).encode()]
        body = b"\n".join(lines) + b"\n"
        part = f"{run}orphan-blob-candidates/part-00000.jsonl"
        w.ctx.store.put_if_absent(part, body)
        w.ctx.store.put_if_absent(f"{run}summary.json", b"{}")
        bad = f"{part}#{len(lines[0]) + 1}"
        inp.update(source="audit", audit_run="bad-line", page_size=2)
    report = drive(w.reaper(), inp, w.clock)
    assert report["status"] == "finished", report
    assert report["purged"] == 2 and report["kept"].get("blocked") == 1, report
    assert all(not w.blob_exists(o) for o in orphans) and w.blob_exists(kept.blob_key)
    [blocker] = [b for b in w.ctx.blockers.list() if b.kind == "reap-gc"]
    assert blocker.object_key == bad and blocker.reason.startswith("layout")
    again = drive(w.reaper(), inp, w.clock)  # the next run is not stopped either, and opens nothing new
    assert again["status"] == "finished" and len(w.ctx.blockers.list()) == 1


def test_property_7_hours_held_by_blockers_never_take_every_slot_of_a_run(bucket: str) -> None:
    """Unfinished hours come first, but a run still takes newly expired hours: 24 hours each held
    by an open blocker must not stop retention of every hour after them."""
    from lightmetrics.reaps.retention import expired_hours

    w = make_world(bucket)
    table = w.ctx.table
    stuck = [UtcHour(HOUR.start_unix_s - 3600 * (10 + n)) for n in range(4)]
    for h in stuck:
        table.put({"pk": "retention#raw", "sk": str(h), "status": "tombstoned"})
    w.accept(ident(31))  # an accepted-by-time entry in HOUR: a newly expired hour
    hours = expired_hours(w.ctx, retention_s=RETENTION_S, now_ns=w.clock.now_ns(), limit=4)
    assert HOUR in hours and len(hours) == 4, hours
    assert set(hours) - {HOUR} <= set(stuck)
    alone = expired_hours(w.ctx, retention_s=RETENTION_S, now_ns=w.clock.now_ns(), limit=8)
    assert set(alone) == {HOUR, *stuck}  # with room, every unfinished hour is taken
