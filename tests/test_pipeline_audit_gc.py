"""The audit and a GC run that overlap (issue 15): a blob GC marks *after* the audit read GC's marks
is not a violation — whether GC still holds it under its delete-marker grace when the audit looks
again, or has settled it meanwhile (restored a referenced blob, purged an unreferenced one with its
raw-blobs-by-time entry). docs/protocol.md §15: the intent is recorded before the marker and the
marks item is deleted only after the settle."""

from __future__ import annotations

import hashlib

from conftest import FAST, T0_NS, ident, make_frame
from pipeline_support import access_for, make_system

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.reaps.gc_marks import Mark, MarksItem, page_ops, stored_marks_items
from lightmetrics.reaps.state import MarkState
from lightmetrics_pipeline.audit.job import MarkedBlobs, gc_marked_blobs, run_audit
from lightmetrics_pipeline.inventory import report as inv

VIOLATIONS = ("integrity", "derived-without-source")


def test_a_blob_gc_marks_while_the_audit_runs_is_not_a_violation(runtime, clock, spark):  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock)
    s3 = runtime.boto3_client("s3")
    B = system.bucket
    ctx = system.work_context(policy=FAST)
    table, codec = ctx.table, ctx.codec
    actx = accept_context(system.settings, client=s3, clock=clock, policy=FAST)
    # A referenced blob (GC marked it racing an accept: its settle restores it) ...
    ref = accept_batch(actx, ident(1), make_frame(ident(1)))
    index_accepted(ctx, ref.manifest_key)
    index_raw_blob(ctx, ref.blob_key)
    # ... and an orphan (its settle purges it and then its raw-blobs-by-time entry).
    orphan_frame = make_frame(ident(2))
    orphan_sha = hashlib.sha256(orphan_frame).hexdigest()
    orphan_key = codec.raw_blob(orphan_sha)
    s3.put_object(Bucket=B, Key=orphan_key, Body=orphan_frame, IfNoneMatch="*")
    index_raw_blob(ctx, orphan_key)
    (orphan_hint,) = [o["Key"] for o in s3.list_objects_v2(Bucket=B, Prefix="raw-blobs-by-time/")["Contents"]
                      if orphan_sha in o["Key"]]
    access = access_for(system, runtime, "pipeline-audit")

    # The audit reads GC's marks first: none yet.
    marked_at_start = gc_marked_blobs(table, codec)
    assert marked_at_start == frozenset()

    # Then a GC run records its intents and places its delete markers (§15 steps 1-2) ...
    versions = {k: s3.head_object(Bucket=B, Key=k)["VersionId"] for k in (ref.blob_key, orphan_key)}
    marks = [Mark(key, sha, versions[key], None, T0_NS, T0_NS // 10**9, "unreferenced", agent_hex=i.agent_hex,
                  boot_hex=i.boot_hex, seq_start=i.seq_start, seq_end=i.seq_end)
             for key, sha, i in ((ref.blob_key, ref.frame_sha256, ident(1)), (orphan_key, orphan_sha, ident(2)))]
    table.transact(page_ops(1, 0, marks, MarksItem(MarkState.MARKED, marked_at_ns=T0_NS), []))
    markers = {k: s3.delete_object(Bucket=B, Key=k)["VersionId"] for k in (ref.blob_key, orphan_key)}
    # ... and the inventory the audit reads lists both markers as current (the blobs absent).
    report = inv.open_report(inv.snapshot(access, inv.Destination.parse(f"s3://{B}/inventory")).manifest_location,
                             access)

    def settle() -> None:  # §15 step 5: restore the referenced blob; purge the orphan, then its entry
        s3.delete_object(Bucket=B, Key=ref.blob_key, VersionId=markers[ref.blob_key])
        s3.delete_object(Bucket=B, Key=orphan_key, VersionId=versions[orphan_key])
        s3.delete_object(Bucket=B, Key=orphan_key, VersionId=markers[orphan_key])
        s3.delete_object(Bucket=B, Key=orphan_hint)
        for item in stored_marks_items(table):  # the marks item goes last
            table.delete(item["pk"], item["sk"])

    def settled_then_read() -> MarkedBlobs:
        settle()  # GC finished between the audit's HEADs and its second read of the marks
        return gc_marked_blobs(table, codec)

    def audit(run_id: str, gc_marked: frozenset[str]) -> dict[str, int]:
        got = run_audit(spark, inv.inventory_dataframe(spark, report, access), access, run_id=run_id,
                        now_s=T0_NS // 10**9, retry_horizon_s=7 * 86400, gc_marked=gc_marked)
        return {c: got.confirmed[c] for c in VIOLATIONS}

    # Judged by the first read alone (a plain set: no second read), both blobs look missing: the
    # overlap is real, and was reported as violations before the audit read the marks again.
    assert audit("first-read-only", frozenset(marked_at_start)) == {"integrity": 1, "derived-without-source": 2}
    # GC still holds both under its grace when the audit reads the marks again.
    assert audit("holding", marked_at_start) == {"integrity": 0, "derived-without-source": 0}
    # GC settled both (marks item gone) before that second read: restored, and purged with the entry.
    marked_at_start.reader = settled_then_read
    assert audit("settled", marked_at_start) == {"integrity": 0, "derived-without-source": 0}
    assert gc_marked_blobs(table, codec) == frozenset() and s3.list_object_versions(Bucket=B, Prefix=orphan_key).get(
        "Versions") is None
