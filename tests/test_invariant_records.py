"""Issue 13, properties 1 and 11: records this version cannot read, and records of a newer writer.

A rolling deploy runs two versions side by side: the newer one may add fields to a record (same
schema version) or write a new schema version. The older reader must ignore added fields, and
must refuse a newer version loudly (error + blocker), never read it as "absent". GC, verify and
the Spark audit's orphan check must agree that a record nobody can read still keeps its blob.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import ident, make_frame
from reap_support import OLD_NS, World, drive, make_world

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.admin.blocker_actions import skip
from lightmetrics.derived.indexing import KIND_REPAIR, index_accepted, index_raw_blob, repair_accepted
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.derived_entries import AcceptedByTimeEntry
from lightmetrics.protocol.errors import ManifestError, UnsupportedVersionError
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest, IdentityConflictManifest
from lightmetrics.reaps.retention import ReapedMarker, RetentionTombstone
from lightmetrics.work.outcome import Outcome
from lightmetrics.work.units import run_unit, work_key

_NS = 1_000_000_000


# -- what a newer writer puts in a record ----------------------------------------------------------------
def newer_writer_field(doc: dict[str, Any]) -> bytes:
    """Same schema version, one field this version does not know (an additive change)."""
    return json.dumps({**doc, "ingest_region": "eu-west-1"}, sort_keys=True).encode()


def newer_schema_version(doc: dict[str, Any]) -> bytes:
    """A schema version this reader does not know (a breaking change)."""
    return json.dumps({**doc, "schema": doc["schema"][:-1] + "2"}, sort_keys=True).encode()


def truncated(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True).encode()[:40]


def inconsistent(doc: dict[str, Any]) -> bytes:
    """Parses, but its hash is not the blob it names (corrupted): it does not validate."""
    return json.dumps({**doc, "frame_sha256": "f" * 64}, sort_keys=True).encode()


def manifest_doc(w: World, identity: BatchIdentity, blob_key: str, frame: bytes) -> dict[str, Any]:
    import hashlib

    m = AcceptedBatchManifest(agent_id=identity.agent_id, boot_id=identity.boot_id, seq_start=identity.seq_start,
                              seq_end=identity.seq_end, frame_sha256=hashlib.sha256(frame).hexdigest(),
                              frame_bytes=len(frame), raw_blob_key=blob_key, accepted_at_unix_ns=OLD_NS,
                              collector_id="collector-next", wire_version=1, frame_version=1)
    return json.loads(m.to_bytes())


def plant(w: World, identity: BatchIdentity, variant: Any) -> tuple[str, str]:
    """A blob the accept wrote (step 4) and a record a newer or broken writer wrote for it."""
    blob = w.orphan(identity)  # the real accept, stopped after the blob
    frame = make_frame(identity, 0.5)
    record_key = w.ctx.codec.accepted(identity)
    assert w.ctx.store.put_if_absent(record_key, variant(manifest_doc(w, identity, blob, frame)))
    return blob, record_key


# -- property 1 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant, kept_as, blocker_kind", [
    (newer_writer_field, "referenced", None),
    (newer_schema_version, "record-unreadable", "unsupported-version"),
    (truncated, "record-unreadable", "invalid-manifest"),
    (inconsistent, "record-unreadable", "invalid-manifest"),
], ids=["newer-writer-field", "newer-schema-version", "truncated", "inconsistent"])
def test_property_1_gc_never_deletes_or_hides_a_blob_that_an_acceptance_record_names(
        bucket: str, variant: Any, kept_as: str, blocker_kind: str | None) -> None:
    w = make_world(bucket)
    blob, record_key = plant(w, ident(1), variant)
    orphan = w.orphan(ident(2))  # a real orphan beside it: GC does run and purge

    report = drive(w.reaper(), {"mode": "gc", "dry_run": False}, w.clock)

    assert report["status"] == "finished" and report["purged"] == 1
    assert report["kept"] == {kept_as: 1}
    assert w.blob_exists(blob) and w.versions(blob)[1] == [], "the named blob is neither deleted nor hidden"
    assert not w.blob_exists(orphan)
    blockers = {b.work_key: b for b in w.ctx.blockers.list()}
    if blocker_kind is None:
        assert not blockers
    else:
        b = blockers[work_key(KIND_REPAIR, record_key)]
        assert b.reason.startswith(blocker_kind) and "GC keeps" in b.reason
        # verify agrees: the record is a violation of its own kind, and its blob is not "missing"
        found = verify(w.ctx, strict=False).violation_counts()
        assert found.get(blocker_kind) == 1 and "blob-missing" not in found
        # a second GC run keeps it again and does not re-open a blocker the operator decided on
        skip(w.ctx, b.work_key, who="test", reason="kept as evidence")
        again = drive(w.reaper(), {"mode": "gc", "dry_run": False}, w.clock)
        assert again["kept"].get(kept_as) == 1 and w.blob_exists(blob)
        assert w.ctx.blockers.get(b.work_key).status == "skipped"


def test_property_1_the_audit_never_lists_a_blob_of_an_unreadable_record_as_an_orphan(bucket: str, runtime) -> None:  # type: ignore[no-untyped-def]
    from lightmetrics_pipeline.audit.confirm import check_orphan
    from lightmetrics_pipeline.s3io import S3Access

    w = make_world(bucket)
    rows = []
    for n, variant in enumerate((newer_writer_field, newer_schema_version, truncated, inconsistent)):
        blob, _ = plant(w, ident(n), variant)
        rows.append({"key": blob, "sha": w.ctx.codec.parse(blob).sha256})
    orphan = w.orphan(ident(9))
    rows.append({"key": orphan, "sha": w.ctx.codec.parse(orphan).sha256})
    access = S3Access(bucket=bucket, endpoint_url=runtime.endpoint_url, region="us-east-1",
                      access_key="testing", secret_key="testing")
    check = check_orphan(access, horizon_before_s=w.clock.now_ns() // _NS)
    candidates = [r["blob_key"] for row in rows for r in check(row)]
    assert candidates == [orphan]


# -- property 11 -----------------------------------------------------------------------------------------
def test_property_11_readers_ignore_unknown_fields_within_a_schema_version() -> None:
    m = AcceptedBatchManifest(agent_id="a", boot_id="b", seq_start=1, seq_end=2, frame_sha256="0" * 64,
                              frame_bytes=10, raw_blob_key="raw-blobs/v1/x", accepted_at_unix_ns=1,
                              collector_id="c1", wire_version=1, frame_version=1)
    assert AcceptedBatchManifest.from_bytes(newer_writer_field(json.loads(m.to_bytes()))) == m
    entry = AcceptedByTimeEntry(manifest_key="k", frame_sha256="0" * 64, raw_blob_key="b", frame_bytes=1,
                                accepted_at_unix_ns=1)
    assert AcceptedByTimeEntry.from_bytes(newer_writer_field(json.loads(entry.to_bytes()))) == entry
    tomb = RetentionTombstone(scope="raw", hour="2026-01-01T00", created_at_unix_ns=1, retention_s=1, reap_epoch=1)
    assert RetentionTombstone.from_bytes(newer_writer_field(json.loads(tomb.to_bytes()))) == tomb
    # writers stay strict: a model never writes a field it does not define
    with pytest.raises(Exception):
        AcceptedBatchManifest(**{**json.loads(m.to_bytes()), "ingest_region": "x"})


@pytest.mark.parametrize("model, doc", [
    (AcceptedBatchManifest, {"schema": "lightmetrics.accepted_batch.v2"}),
    (IdentityConflictManifest, {"schema": "lightmetrics.identity_conflict.v7"}),
    (AcceptedByTimeEntry, {"schema": "lightmetrics.accepted_by_time.v2"}),
    (RetentionTombstone, {"schema": "lightmetrics.retention_tombstone.v1", "version": 2}),
    (ReapedMarker, {"schema": "lightmetrics.retention_reaped.v1", "version": 3}),
])
def test_property_11_a_newer_version_is_refused_with_a_clear_error(model: Any, doc: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedVersionError, match="newer version of lightmetrics.*upgrade the reader"):
        model.from_bytes(json.dumps(doc).encode())
    # an older or foreign schema is invalid, not "newer"
    with pytest.raises(ManifestError) as exc:
        model.from_bytes(json.dumps({**doc, "schema": "lightmetrics.other.v9", "version": 1}).encode())
    assert not isinstance(exc.value, UnsupportedVersionError)


def test_property_11_rolling_deploy_an_older_reader_serves_a_newer_writers_records(bucket: str) -> None:
    """Collector N+1 wrote records (an added field; then a new schema version); collector N and
    the background work of version N read them."""
    w = make_world(bucket)
    hour = UtcHour.of_unix_ns(OLD_NS)
    # 1. additive change: everything works as for its own records
    added_blob, added_key = plant(w, ident(1), newer_writer_field)
    assert index_accepted(w.ctx, added_key) is Outcome.DONE
    index_raw_blob(w.ctx, added_blob)
    assert w.ctx.store.head(w.ctx.codec.accepted_by_time(hour, ident(1))) is not None
    same = accept_batch(w.old, ident(1), make_frame(ident(1), 0.5))
    assert same.status.value == "duplicate" and same.duplicate
    other = accept_batch(w.old, ident(1), make_frame(ident(1), 7.0))
    assert other.status.value == "identity_conflict" and other.quarantine_key
    assert repair_accepted(w.ctx, added_key) is Outcome.NOOP_RESOLVED

    # 2. breaking change: refused loudly everywhere, never "absent"
    _, newer_key = plant(w, ident(2), newer_schema_version)
    result = run_unit(w.ctx, kind="index-accepted", object_key=newer_key, source="event",
                      fn=lambda: index_accepted(w.ctx, newer_key))
    assert result.outcome is Outcome.BLOCKED and "newer version" in result.detail
    blocker = w.ctx.blockers.get(work_key("index-accepted", newer_key))
    assert blocker.reason.startswith("unsupported-version")
    answer = accept_batch(w.old, ident(2), make_frame(ident(2), 0.5))
    assert answer.status.value == "unavailable" and "newer version" in (answer.reason or "")
    assert not answer.duplicate
    found = verify(w.ctx).violation_counts()
    assert found.get("unsupported-version") == 1
