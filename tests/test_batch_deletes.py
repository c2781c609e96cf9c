"""Batch deletes (issue 14, "keeps up"): GC's collector and retention's derived deletes send
``DeleteObjects`` (up to 1,000 keys a request) instead of one ``DeleteObject`` per key.

What stays per key (docs/protocol.md §15, §16): the same keys, the same order (a page's markers
after its intent; versions, then markers, then hints; a page's ``accepted-by-blob`` entries before
its ``accepted-by-time`` entries, and an entry only if its by-blob delete succeeded), one fence
right before every request, a per-key error handled as a failed ``DeleteObject`` was, markers a
crashed batch placed found by recovery. What changes: the requests per batch (asserted at two page
sizes).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import ALL_BACKENDS, ident
from reap_support import OLD_NS, World, drive, make_world

from lightmetrics.aws import s3_deletes as store_module
from lightmetrics.aws.errors import is_transient
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.aws.s3_deletes import delete_objects
from lightmetrics.aws.s3_store import bucket_refusal
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest
from lightmetrics.protocol.object_store import StoreAccessError
from lightmetrics.reaps import gc as gc_module
from lightmetrics.reaps import retention as retention_module
from lightmetrics.reaps.gc import BlobCollector
from lightmetrics.reaps.retention import HourRetention
from lightmetrics.work import crashpoints

BACKENDS = ALL_BACKENDS  # storage semantics: every test runs on moto and on MiniStack

HOUR = UtcHour.of_unix_ns(OLD_NS)
RETENTION = {"mode": "retention", "dry_run": False, "hour": str(HOUR), "tombstone_wait_s": 0}
GC = {"mode": "gc", "dry_run": False}


def refuse(w: World, monkeypatch: pytest.MonkeyPatch, refused: dict[tuple[str, str | None], str]) -> list[list[Any]]:
    """S3 answers DeleteObjects with a per-key error for each ``(key, version or None)`` in
    ``refused`` (its code), as S3 does: the request succeeds, those keys are in ``Errors`` and were
    not deleted, the others were. Returns the objects of each request sent."""
    send = w.s3.delete_objects
    sent: list[list[Any]] = []

    def delete_objects(**kw: Any) -> Any:
        objects = kw["Delete"]["Objects"]
        sent.append(objects)
        out = [o for o in objects if (o["Key"], o.get("VersionId")) in refused]
        rest = [o for o in objects if o not in out]
        r = dict(send(**{**kw, "Delete": {**kw["Delete"], "Objects": rest}})) if rest else {"Deleted": []}
        r["Errors"] = [{"Key": o["Key"], **({"VersionId": o["VersionId"]} if "VersionId" in o else {}),
                        "Code": refused[(o["Key"], o.get("VersionId"))], "Message": "refused by the test"}
                       for o in out]
        return r

    monkeypatch.setattr(w.s3, "delete_objects", delete_objects)
    return sent


def counted(w: World) -> RequestCounter:
    counter = RequestCounter()
    counter.attach(w.s3)
    return counter


# ------------------------------------------------------------------------ the helper, on moto
def test_delete_objects_on_a_versioned_bucket_reports_markers_and_deletes_versions(bucket: str,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a version id: a delete marker each, its id reported (``DeleteMarkerVersionId``); with
    one: that version gone, the others kept; a version that is already gone is reported deleted (as
    S3 does). More than ``DELETE_BATCH_MAX`` keys: one request each, the fence right before each."""
    w = make_world(bucket)
    keys = [f"{w.ctx.codec.prefix}test/k{i}" for i in range(5)]
    for k in keys:
        w.ctx.store.put_if_absent(k, b"{}")
    v0 = w.versions(keys[0])[0][0]
    monkeypatch.setattr(store_module, "DELETE_BATCH_MAX", 2)
    events: list[str] = []
    counter = counted(w)
    with counter.operation("d") as op:
        out = delete_objects(w.s3, bucket, [(k, None) for k in keys] + [(keys[0], None)],
                             fence=lambda: events.append("fence"), after_request=lambda: events.append("answered"))
    assert dict(op.by_api) == {"s3.DeleteObjects": 3}  # 5 distinct pairs, 2 a request
    assert events == ["fence", "answered"] * 3
    assert not out.errors
    for k in keys:
        versions, markers = w.versions(k)
        assert len(versions) == 1 and markers == [out.deleted[(k, None)]], (k, versions, markers)
    out = delete_objects(w.s3, bucket, [(keys[0], v0), (keys[0], out.deleted[(keys[0], None)]),
                                        (keys[1], "no-such-version")])
    assert not out.errors and w.versions(keys[0]) == ([], [])
    assert len(w.versions(keys[1])[0]) == 1  # a version id that is not there deletes nothing


def test_a_per_key_error_is_the_client_error_its_delete_object_would_have_been(bucket: str,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_world(bucket)
    keys = [f"{w.ctx.codec.prefix}test/e{i}" for i in range(3)]
    for k in keys:
        w.ctx.store.put_if_absent(k, b"{}")
    refuse(w, monkeypatch, {(keys[0], None): "SlowDown", (keys[1], None): "AccessDenied"})
    out = delete_objects(w.s3, bucket, [(k, None) for k in keys])
    assert set(out.deleted) == {(keys[2], None)}
    slow, denied = out.error_for(keys[0], None), out.error_for(keys[1], None)
    assert isinstance(slow, ClientError) and slow.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert is_transient(slow)  # retried as a transient failure, as a SlowDown DeleteObject
    assert isinstance(bucket_refusal(denied, bucket), StoreAccessError)  # access denied surfaces as one
    assert out.error_for(keys[2], None) is None and out.error_for(keys[0], None, tolerate=("SlowDown",)) is None


# ------------------------------------------------------------------------ GC: per-key semantics
def test_gc_settle_refused_version_stops_only_its_mark(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One mark's captured-version delete is refused (transient): its marker and hint stay, the other
    marks are purged whole, then the error surfaces; settling again finishes it."""
    w = make_world(bucket)
    orphans = [w.orphan(ident(n)) for n in (1, 2, 3)]
    gc = BlobCollector(w.ctx, w.settings)
    marks = gc.mark([gc.intent(p, w.clock.now_ns()) for p in gc.prove_all(orphans)])
    bad = marks[1]
    refuse(w, monkeypatch, {(bad.key, bad.version_id): "InternalError"})
    with pytest.raises(ClientError) as err:
        gc.settle(marks)
    assert err.value.response["Error"]["Code"] == "InternalError"
    hint = w.ctx.codec.raw_blobs_by_time(UtcHour((int(bad.lm_unix_s) // 3600) * 3600), bad.sha)
    assert w.versions(bad.key) == ([bad.version_id], [bad.marker_version_id])  # untouched
    assert w.ctx.store.head(hint) is not None
    for m in (marks[0], marks[2]):
        assert w.versions(m.key) == ([], [])
    monkeypatch.undo()
    assert gc.settle(marks) == ["purged"] * 3
    assert all(w.versions(k) == ([], []) for k in orphans) and w.ctx.store.head(hint) is None


def test_gc_mark_refused_marker_raises_and_recovery_places_it(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_world(bucket)
    orphans = [w.orphan(ident(n)) for n in (4, 5)]
    gc = BlobCollector(w.ctx, w.settings)
    intents = [gc.intent(p, w.clock.now_ns()) for p in gc.prove_all(orphans)]
    refuse(w, monkeypatch, {(orphans[0], None): "AccessDenied"})
    with pytest.raises(ClientError) as err:
        gc.mark(intents)
    assert isinstance(bucket_refusal(err.value, bucket), StoreAccessError)
    assert w.versions(orphans[0])[1] == [] and len(w.versions(orphans[1])[1]) == 1
    monkeypatch.undo()
    marks = gc.recover(intents)
    assert [m.marker_version_id for m in marks] == [w.versions(k)[1][0] for k in orphans]
    assert gc.settle(marks) == ["purged", "purged"]


# ---------------------------------------------- recovery after a crash between a batch and its record
def test_recovery_finds_the_markers_of_a_batch_that_answered_before_the_crash(bucket: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Three intents in batches of 2: the process dies after the first DeleteObjects answered (two
    markers placed, nothing recorded). Recovery finds those two (no second marker on them) and
    places the third in one request."""
    w = make_world(bucket)
    orphans = [w.orphan(ident(n)) for n in (6, 7, 8)]
    gc = BlobCollector(w.ctx, w.settings)
    intents = [gc.intent(p, w.clock.now_ns()) for p in gc.prove_all(orphans)]
    monkeypatch.setattr(store_module, "DELETE_BATCH_MAX", 2)
    hook, seen = crashpoints.crash_once_at(gc_module.CP_MARKED_ONE)
    with crashpoints.hooked(hook), pytest.raises(crashpoints.InjectedCrash):
        gc.mark(intents)
    assert seen and [len(w.versions(k)[1]) for k in orphans] == [1, 1, 0]
    placed = {k: w.versions(k)[1][0] for k in orphans[:2]}
    counter = counted(w)
    with counter.operation("recover") as op:
        marks = gc.recover(intents)
    assert op.by_api["s3.DeleteObjects"] == 1 and op.by_api["s3.ListObjectVersions"] == 3
    assert [len(w.versions(k)[1]) for k in orphans] == [1, 1, 1]
    assert {m.key: m.marker_version_id for m in marks[:2]} == placed
    assert gc.settle(marks) == ["purged"] * 3 and all(w.versions(k) == ([], []) for k in orphans)


def test_a_reap_killed_after_its_marker_batch_settles_every_marker_once(bucket: str) -> None:
    """Through the reap's tasks: killed right after the page's DeleteObjects answered, before the
    page's marks were recorded; the retried task recovers the intent (rule L3), finds every marker
    (none placed twice) and the reap purges every orphan."""
    w = make_world(bucket)
    kept = w.accept(ident(10))
    orphans = [w.orphan(ident(n)) for n in (11, 12, 13)]
    markers_sent: Counter[str] = Counter()

    def on_delete(params: dict[str, Any], **_: Any) -> None:
        for o in params["Delete"]["Objects"]:
            if "VersionId" not in o and o["Key"] in orphans:
                markers_sent[o["Key"]] += 1

    hook, seen = crashpoints.crash_once_at(gc_module.CP_MARKED_ONE)
    w.s3.meta.events.register("before-parameter-build.s3.DeleteObjects", on_delete)
    try:
        with crashpoints.hooked(hook):
            report = drive(w.reaper(), GC, w.clock)
    finally:
        w.s3.meta.events.unregister("before-parameter-build.s3.DeleteObjects", on_delete)
    assert seen and report["status"] == "finished", report
    assert markers_sent == {k: 1 for k in orphans}, markers_sent  # recovery found them; none placed again
    assert (report["marked"], report["purged"]) == (3, 3), report
    assert all(w.versions(k) == ([], []) for k in orphans) and w.blob_exists(kept.blob_key)
    assert verify(w.ctx, strict=True).ok


# ------------------------------------------------------------------ retention: per-key semantics
def test_retention_entry_stays_whole_when_its_by_blob_delete_is_refused(bucket: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's accepted-by-blob entries go in one request, then its accepted-by-time entries in
    another — only those whose by-blob delete succeeded. A refused by-blob delete keeps its entry
    (R-I8) and fails the page as its DeleteObject did; the next attempt deletes both."""
    w = make_world(bucket)
    results = [w.accept(ident(n)) for n in range(4)]
    w.cover_watermark()
    hr = HourRetention(w.ctx, HOUR)
    codec = w.ctx.codec
    manifests = [AcceptedBatchManifest.from_bytes(w.ctx.store.get(r.manifest_key)) for r in results]
    by_blob = [codec.accepted_by_blob(m.frame_sha256, m.identity) for m in manifests]
    by_time = [codec.accepted_by_time(HOUR, ident(n)) for n in range(4)]
    assert all(w.ctx.store.head(k) for k in by_blob + by_time)
    sent = refuse(w, monkeypatch, {(by_blob[2], None): "SlowDown"})
    keys, _ = hr.page("", 100)
    with pytest.raises(ClientError) as err:
        hr.delete_page(keys)
    assert err.value.response["Error"]["Code"] == "SlowDown"
    assert [{o["Key"] for o in s} for s in sent] == [set(by_blob), set(by_time) - {by_time[2]}]  # in that order
    assert [w.ctx.store.head(k) is not None for k in by_time] == [False, False, True, False]
    assert [w.ctx.store.head(k) is not None for k in by_blob] == [False, False, True, False]
    monkeypatch.undo()
    keys, _ = hr.page("", 100)
    assert keys == [by_time[2]] and hr.delete_page(keys) == 1
    assert not any(w.ctx.store.head(k) for k in by_blob + by_time)


def test_every_delete_request_follows_a_fence(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_world(bucket)
    for n in range(5):
        w.accept(ident(n))
    w.orphan(ident(9))
    w.cover_watermark()
    log: list[str] = []
    send = w.s3.delete_objects

    def delete_objects(**kw: Any) -> Any:
        assert log and log[-1] == "fence", "a DeleteObjects without a fence right before it"
        log.append("delete")
        return send(**kw)

    monkeypatch.setattr(w.s3, "delete_objects", delete_objects)
    hr = HourRetention(w.ctx, HOUR, fence=lambda: log.append("fence"))
    keys, _ = hr.page("", 100)
    hr.delete_page(keys)
    gc = BlobCollector(w.ctx, w.settings, fence=lambda: log.append("fence"))
    marks = gc.mark([gc.intent(p, w.clock.now_ns()) for p in gc.prove_all(w.orphans) if p.deletable])
    gc.settle(marks)
    # retention: by-blob, by-time; GC: markers, then versions, markers, hints
    assert log == ["fence", "delete"] * 6, log


# -------------------------------------------------------------- the request counts at two sizes
@pytest.mark.parametrize("page_size", [4, 8])
def test_retention_deletes_cost_six_requests_a_page(bucket: str, page_size: int) -> None:
    """8 batches of one hour: per page, one DeleteObjects for its markers, three for its settle
    (versions, markers, hints) and two for its derived entries (by-blob, then by-time) — 6/page
    a batch, and not one DeleteObject."""
    w = make_world(bucket)
    for n in range(8):
        w.accept(ident(n))
    w.cover_watermark()
    counter = counted(w)
    with counter.operation("retention") as op:
        report = drive(w.reaper(), {**RETENTION, "page_size": page_size}, w.clock)
    assert report["hours_reaped"] == [str(HOUR)] and report["purged"] == 8, report
    pages = 8 // page_size
    assert op.by_api["s3.DeleteObjects"] == 6 * pages and "s3.DeleteObject" not in op.by_api, dict(op.by_api)
    assert op.by_api["s3.GetObject"] == 2 * 8, dict(op.by_api)  # per batch as before: 2 GETs
    assert verify(w.ctx, strict=True).ok


@pytest.mark.parametrize("page_size", [4, 8])
def test_gc_orphans_cost_four_delete_requests_a_page(bucket: str, page_size: int) -> None:
    w = make_world(bucket)
    orphans = [w.orphan(ident(n)) for n in range(8)]
    counter = counted(w)
    with counter.operation("gc") as op:
        report = drive(w.reaper(), {**GC, "page_size": page_size}, w.clock)
    assert report["purged"] == 8, report
    assert op.by_api["s3.DeleteObjects"] == 4 * (8 // page_size) and "s3.DeleteObject" not in op.by_api
    assert all(w.versions(k) == ([], []) for k in orphans)


def test_the_batch_crash_points_are_registered() -> None:
    assert {gc_module.CP_MARKED_ONE, gc_module.CP_PURGED_VERSION, gc_module.CP_PURGED_MARKERS,
            gc_module.CP_SETTLED_ONE, retention_module.CP_DERIVED_ONE,
            retention_module.CP_BY_TIME_ONE} <= set(crashpoints.REGISTRY)
    assert "batch" in crashpoints.REGISTRY[gc_module.CP_MARKED_ONE]
