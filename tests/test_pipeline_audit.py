"""The inventory audit (issue 7): the report format, exactly the planted defects, and a million keys
under a 1 MB driver result limit."""

from __future__ import annotations

import gzip
import hashlib
import json
import time

from click.testing import CliRunner
from conftest import FAST, T0_NS, ident, make_frame
from pipeline_support import access_for, job_access_for, job_table, make_system

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_accepted, index_quarantine, index_raw_blob
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.derived_entries import AcceptedByTimeEntry
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import UtcHour
from lightmetrics_pipeline.audit.job import read_findings, run_audit
from lightmetrics_pipeline.inventory import report as inv
from lightmetrics_pipeline.synthetic import generate_inventory

HORIZON_S = 7 * 86400


def _audit(spark, access, location, *, run_id, now_s):  # type: ignore[no-untyped-def]
    report = inv.open_report(location, access)
    df = inv.inventory_dataframe(spark, report, access)
    return run_audit(spark, df, access, run_id=run_id, now_s=now_s, retry_horizon_s=HORIZON_S,
                     inventory_info=report.to_json())


def test_snapshot_writes_the_documented_report_format(runtime, clock, spark, tmp_path):  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock)
    actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
    for n in range(3):
        accept_batch(actx, ident(n), make_frame(ident(n)))
    s3 = runtime.boto3_client("s3")
    s3.delete_object(Bucket=system.bucket, Key=accept_batch(actx, ident(0), make_frame(ident(0))).blob_key)
    access = access_for(system, runtime)
    parquet = inv.snapshot(access, inv.Destination.parse(f"s3://{system.bucket}/inventory"))
    csv_report = inv.snapshot(access, inv.Destination.parse(str(tmp_path)), file_format="CSV", now_ms=1_764_000_060_000)

    # The layout and manifest fields AWS documents.
    bucket, key = parquet.manifest_location[5:].split("/", 1)
    assert key.startswith(f"inventory/{system.bucket}/weekly-parquet/") and key.endswith("Z/manifest.json")
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    manifest = json.loads(body)
    assert {"sourceBucket", "destinationBucket", "version", "creationTimestamp", "fileFormat", "fileSchema",
            "files"} <= set(manifest)
    assert (manifest["version"], manifest["fileFormat"]) == ("2016-11-30", "Parquet")
    assert manifest["fileSchema"].startswith("message s3.inventory {") and "last_modified_date" in manifest["fileSchema"]
    checksum = s3.get_object(Bucket=bucket, Key=key.replace("manifest.json", "manifest.checksum"))["Body"].read()
    assert checksum.decode() == hashlib.md5(body).hexdigest()
    (f,) = manifest["files"]
    data = s3.get_object(Bucket=bucket, Key=f["key"])["Body"].read()
    assert "/data/" in f["key"] and hashlib.md5(data).hexdigest() == f["MD5checksum"] and f["size"] == len(data)
    csv_manifest = json.loads(open(csv_report.manifest_location).read())
    assert csv_manifest["fileFormat"] == "CSV" and csv_manifest["fileSchema"].startswith("Bucket, Key, VersionId")
    csv_file = tmp_path / system.bucket / "weekly-parquet" / "data" / csv_manifest["files"][0]["key"].rsplit("/", 1)[1]
    first = gzip.decompress(csv_file.read_bytes()).decode().splitlines()[0]
    assert first.startswith(f'"{system.bucket}","') and first.count('","') == 10  # quoted, no header

    # Both formats read back to the same rows (versions and the delete marker included).
    a = inv.inventory_dataframe(spark, inv.open_report(f"s3://{system.bucket}/inventory/", access), access)
    b = inv.inventory_dataframe(spark, inv.open_report(str(tmp_path), access), access)
    rows = sorted((r["key"], r["version_id"], r["is_latest"], r["is_delete_marker"], r["size"]) for r in a.collect())
    assert rows == sorted((r["key"], r["version_id"], r["is_latest"], r["is_delete_marker"], r["size"]) for r in b.collect())
    assert sum(1 for r in rows if r[3]) == 1 and len(rows) == parquet.rows == csv_report.rows


def test_audit_finds_exactly_the_planted_defects(runtime, clock, spark, tmp_path):  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock)
    s3 = runtime.boto3_client("s3")
    B = system.bucket
    ctx = system.work_context(policy=FAST)
    actx = accept_context(system.settings, client=s3, clock=clock, policy=FAST)
    codec = ctx.codec
    H = UtcHour.of_unix_ns(T0_NS)
    ok = {}
    for n in range(8):
        r = accept_batch(actx, ident(n), make_frame(ident(n)))
        index_accepted(ctx, r.manifest_key)
        index_raw_blob(ctx, r.blob_key)
        ok[n] = r
    shas = {n: r.frame_sha256 for n, r in ok.items()}

    def delete(key: str) -> None:
        s3.delete_object(Bucket=B, Key=key)  # versioned: a delete marker, as GC or a crash would leave

    def rbt_key(n: int) -> str:  # the raw-blobs-by-time entry of batch n (hour of the blob's LastModified)
        (k,) = [k for k in (o["Key"] for o in s3.list_objects_v2(Bucket=B, Prefix="raw-blobs-by-time/")["Contents"])
                if k.endswith(f"sha256={shas[n]}.json")]
        return k

    # -- expected states that are NOT findings ----------------------------------------------------------
    old_clock = FrozenClock(T0_NS - 3 * 3600 * 10**9)  # a batch of an hour retention has tombstoned and reaped
    old = accept_batch(accept_context(system.settings, client=s3, clock=old_clock, policy=FAST), ident(50), make_frame(ident(50)))
    index_accepted(ctx, old.manifest_key)
    index_raw_blob(ctx, old.blob_key)
    s3.put_object(Bucket=B, Key=codec.retention_tombstone("raw", UtcHour.of_unix_ns(old_clock.now_ns())), Body=b"{}",
                  IfNoneMatch="*")
    delete(old.blob_key)
    conflict = accept_batch(actx, ident(5), make_frame(ident(5), variant=0.5))  # evidence blob: kept
    assert conflict.status.value == "identity_conflict"
    index_quarantine(ctx, conflict.quarantine_key)
    index_raw_blob(ctx, conflict.blob_key)
    delete(codec.accepted_by_time(H, ident(6)))  # missing when inventoried, repaired before the audit reads it
    # Conflict evidence whose conflict was resolved (longer ago than the evidence window): GC's to
    # collect (G3), so an orphan candidate.
    resolved = accept_batch(actx, ident(7), make_frame(ident(7), variant=0.5))
    assert resolved.status.value == "identity_conflict"
    index_quarantine(ctx, resolved.quarantine_key)
    index_raw_blob(ctx, resolved.blob_key)
    s3.put_object(Bucket=B, Key=codec.conflict_resolution(ident(7), resolved.frame_sha256), Body=b"{}",
                  IfNoneMatch="*", Metadata={"lm-resolution": "accept_existing"})

    # -- planted defects -----------------------------------------------------------------------------------
    delete(codec.accepted_by_time(H, ident(1)))  # repair: accepted-by-time
    delete(codec.accepted_by_blob(shas[2], ident(2)))  # repair: accepted-by-blob
    delete(rbt_key(3))  # repair: raw-blobs-by-time
    delete(ok[4].blob_key)  # integrity: the blob of an accepted batch is gone, hour not tombstoned
    delete(rbt_key(4))
    ghost = BatchIdentity.create("ghost", "boot-0", 0, 9)
    ghost_entry = codec.accepted_by_time(H, ghost)  # derived entries without a source
    s3.put_object(Bucket=B, Key=ghost_entry, IfNoneMatch="*", Body=AcceptedByTimeEntry(
        manifest_key=codec.accepted(ghost), frame_sha256="a" * 64, raw_blob_key=codec.raw_blob("a" * 64), frame_bytes=1,
        accepted_at_unix_ns=T0_NS).to_bytes())
    ghost_qb = codec.quarantine_by_blob("b" * 64, ghost)
    s3.put_object(Bucket=B, Key=ghost_qb, Body=b"{}", IfNoneMatch="*")
    orphan_ident = ident(60)
    orphan_frame = make_frame(orphan_ident)
    orphan_sha = hashlib.sha256(orphan_frame).hexdigest()
    orphan_key = codec.raw_blob(orphan_sha)  # a collector died between blob and manifest
    s3.put_object(Bucket=B, Key=orphan_key, Body=orphan_frame, IfNoneMatch="*",
                  Metadata={"lm-agent-hex": orphan_ident.agent_hex, "lm-boot-hex": orphan_ident.boot_hex,
                            "lm-seq-start": "600", "lm-seq-end": "609"})
    index_raw_blob(ctx, orphan_key)
    overlap = BatchIdentity.create("agent-a", "boot-1", 5, 8)  # overlaps ident(0) = 0-9 (only)
    r = accept_batch(actx, overlap, make_frame(overlap))
    index_accepted(ctx, r.manifest_key)
    index_raw_blob(ctx, r.blob_key)

    access = access_for(system, runtime, "pipeline-audit")
    inv.snapshot(access, inv.Destination.parse(f"s3://{B}/inventory"))
    index_accepted(ctx, ok[6].manifest_key)  # ... the repair of 6 lands after the inventory was taken

    now_s = int(time.time()) + HORIZON_S + 3600  # every blob is past the retry horizon
    # the job as the pipeline job role (the inventory above is S3 Inventory's, written as the deployer)
    report = _audit(spark, job_access_for(system, runtime, "pipeline-audit"), f"s3://{B}/inventory/",
                    run_id="planted", now_s=now_s)
    print("PHASES", report.phases)
    assert report.candidates["repair"] == 4  # 1, 2, 3 and 6 (6 is not confirmed: inventory lag)

    def findings(category: str) -> list[dict]:  # type: ignore[type-arg]
        return read_findings(access, "planted", category)

    repair = {f["manifest_key"]: f["missing"] for f in findings("repair")}
    assert repair == {ok[1].manifest_key: "accepted-by-time", ok[2].manifest_key: "accepted-by-blob",
                      ok[3].manifest_key: "raw-blobs-by-time"}
    assert [(f["manifest_key"], f["blob_key"]) for f in findings("integrity")] == [(ok[4].manifest_key, ok[4].blob_key)]
    assert {(f["entry_key"], f["source_key"]) for f in findings("derived-without-source")} == {
        (ghost_entry, codec.accepted(ghost)), (ghost_qb, codec.quarantine(ghost, "b" * 64))}
    orphan, evidence = sorted(findings("orphan-blob-candidates"), key=lambda f: f["blob_key"] != orphan_key)
    assert (orphan["blob_key"], orphan["agent_hex"], orphan["seq_start"]) == (orphan_key, orphan_ident.agent_hex, "600")
    assert evidence["blob_key"] == resolved.blob_key and "resolved" in evidence["reason"]
    (ov,) = findings("overlapping-ranges")
    assert (ov["first_key"], ov["second_key"]) == (ok[0].manifest_key, r.manifest_key)
    assert report.confirmed == {"repair": 3, "integrity": 1, "derived-without-source": 2, "orphan-blob-candidates": 2,
                                "overlapping-ranges": 1}
    summary = json.loads(s3.get_object(Bucket=B, Key=report.summary_key)["Body"].read())
    assert summary["confirmed"] == report.confirmed and summary["run_id"] == "planted"
    assert summary["s3_requests"]["PutObject 200"] == 5  # five finding files ...
    assert report.requests.counts["PutObject 200"] == 5 + 2  # ... then the summary and the commit marker
    # The commit marker the scheduled GC finds (docs/protocol.md §15 G-B3): the newest is this run.
    from lightmetrics.reaps import latest_audit_run
    assert latest_audit_run(ctx.store, codec) == "planted"
    _query_engine_reads_the_output_tables(s3, B, codec.audit_run("planted"), tmp_path, findings, report.confirmed)


def _query_engine_reads_the_output_tables(s3, bucket, run, root, findings, confirmed):  # type: ignore[no-untyped-def]
    """Issue 27 item 10: a real query engine (DuckDB, its JSON reader with its defaults) reads each
    output table of the run (``<run>/<category>/part-*.jsonl``, a copy of the objects) and returns
    exactly the rows ``lmctl`` / ``read_findings`` reads, with every column typed as written, and the
    run's folder as the partition column ``run``."""
    import duckdb

    for o in s3.list_objects_v2(Bucket=bucket, Prefix=run)["Contents"]:
        (root / o["Key"]).parent.mkdir(parents=True, exist_ok=True)
        (root / o["Key"]).write_bytes(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
    for category, n in confirmed.items():
        table = duckdb.sql(f"SELECT * FROM read_json('{root}/{run}{category}/part-*.jsonl', format = 'newline_delimited')")
        rows = [dict(zip(table.columns, r)) for r in table.fetchall()]
        assert len(rows) == n and n > 0
        # the run's folder (run=<id>) reads as a Hive partition column, as engines read it by default
        assert sorted(rows, key=repr) == sorted(({**f, "run": "planted"} for f in findings(category)), key=repr), category
        [(count,)] = duckdb.sql(f"SELECT count(*) FROM read_json('{root}/{run}{category}/part-*.jsonl', "
                                f"format = 'newline_delimited') WHERE rule IS NOT NULL").fetchall()
        assert count == n


def test_a_blob_gc_has_marked_is_not_a_violation(runtime, clock, spark):  # type: ignore[no-untyped-def]
    """Issue 15: GC between its mark and its settle (docs/protocol.md §15: intent recorded in the reap's
    marks items, then the delete marker) is not a missing blob — neither for the record that names it
    (the settle restores a referenced blob) nor for its raw-blobs-by-time entry (the purge removes it).
    The same deletions without GC's recorded marks are violations."""
    from lightmetrics.reaps.gc_marks import Mark, MarksItem, page_ops
    from lightmetrics.reaps.marks_keys import MARKS_PREFIX, marks_pks
    from lightmetrics.reaps.state import MarkState
    from lightmetrics_pipeline.jobs import audit_job

    system = make_system(runtime, clock)
    s3 = runtime.boto3_client("s3")
    B = system.bucket
    ctx = system.work_context(policy=FAST)
    table = ctx.table
    actx = accept_context(system.settings, client=s3, clock=clock, policy=FAST)
    r = accept_batch(actx, ident(1), make_frame(ident(1)))
    index_accepted(ctx, r.manifest_key)
    index_raw_blob(ctx, r.blob_key)
    access = access_for(system, runtime, "pipeline-audit")
    version = s3.head_object(Bucket=B, Key=r.blob_key)["VersionId"]
    mark = Mark(r.blob_key, r.frame_sha256, version, None, T0_NS, T0_NS // 10**9, "unreferenced",
                agent_hex=ident(1).agent_hex, boot_hex=ident(1).boot_hex, seq_start=ident(1).seq_start,
                seq_end=ident(1).seq_end)
    table.transact(page_ops(1, 0, [mark], MarksItem(MarkState.MARKED, marked_at_ns=T0_NS), []))  # 1. intent
    s3.delete_object(Bucket=B, Key=r.blob_key)  # 2. the delete marker; GC now waits out its grace
    inv.snapshot(access, inv.Destination.parse(f"s3://{B}/inventory"))

    def audit(run_id: str) -> dict[str, int]:
        report = audit_job(system.settings, f"s3://{B}/inventory/", run_id=run_id, spark=spark, now_ns=T0_NS,
                           access=job_access_for(system, runtime, "pipeline-audit"), table=job_table(system))
        return {k: report.confirmed[k] for k in ("integrity", "derived-without-source")}

    assert audit("during-grace") == {"integrity": 0, "derived-without-source": 0}
    for pk in marks_pks():  # the marks gone (every marks partition), the marker stays: nobody's mark
        for item in table.query(pk, sk_prefix=MARKS_PREFIX):
            table.delete(item["pk"], item["sk"])
    assert audit("no-mark") == {"integrity": 1, "derived-without-source": 1}


def test_a_million_keys_without_collecting_key_sets(runtime, clock, spark, tmp_path):  # type: ignore[no-untyped-def]
    assert spark.sparkContext.getConf().get("spark.driver.maxResultSize") == "1m"
    system = make_system(runtime, clock)
    now_s = T0_NS // 10**9
    gen = generate_inventory(tmp_path, bucket=system.bucket, identities=200_000, now_s=now_s, orphan_derived=3)
    assert gen.rows >= 1_000_000
    s3 = runtime.boto3_client("s3")
    for key in gen.planted["derived-without-source"]:  # only the planted objects exist live
        s3.put_object(Bucket=system.bucket, Key=key, Body=b"{}", IfNoneMatch="*")
    access = access_for(system, runtime, "pipeline-audit")
    report = _audit(spark, access, str(tmp_path), run_id="million", now_s=now_s)
    assert report.rows_scanned == gen.rows
    assert report.candidates == {"repair": 0, "integrity": 0, "derived-without-source": 3, "orphan-blob-candidates": 0,
                                 "overlapping-ranges": 0}
    assert report.confirmed["derived-without-source"] == 3
    assert sorted(f["entry_key"] for f in read_findings(access, "million", "derived-without-source")) == sorted(
        gen.planted["derived-without-source"])


def test_cli_snapshot_and_audit(runtime, clock, spark, monkeypatch):  # type: ignore[no-untyped-def]
    from lightmetrics.cli.main import cli

    system = make_system(runtime, clock)
    actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
    ctx = system.work_context(policy=FAST)
    r = accept_batch(actx, ident(1), make_frame(ident(1)))
    index_accepted(ctx, r.manifest_key)  # its raw-blobs-by-time entry is missing: one repair finding
    for name, value in system.environment().items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()
    snap = runner.invoke(cli, ["inventory", "snapshot", "--json"])
    assert snap.exit_code == 0, snap.output
    out = runner.invoke(cli, ["pipeline", "audit", "--run-id", "cli-run", "--json"])
    assert out.exit_code == 0, out.output  # a repair item is work, not a violation
    doc = json.loads(out.stdout)  # stdout is the one JSON document; progress goes to stderr
    assert doc["confirmed"]["repair"] == 1 and doc["summary_key"] == "audit/v1/run=cli-run/summary.json"
    assert "audit: classify done" in out.stderr and "inventory snapshot: listed" in snap.stderr
    runtime.boto3_client("s3").delete_object(Bucket=system.bucket, Key=r.blob_key)
    # a second report where S3 Inventory writes (the job role reads inventory/ only: issue 28)
    second = f"s3://{system.bucket}/inventory/second"
    assert runner.invoke(cli, ["inventory", "snapshot", "--destination", second]).exit_code == 0
    bad = runner.invoke(cli, ["pipeline", "audit", "--inventory", second + "/"])
    assert bad.exit_code == 1 and "integrity" in bad.output  # an integrity violation was confirmed


def test_audit_key_patterns_agree_with_the_key_codec() -> None:
    """The audit's key regexes (Spark evaluates them in the JVM) are a second spelling of the
    codec's layout: every key the codec builds matches its kind's pattern, no other kind's, and
    the groups give back the codec's fields."""
    import re

    from lightmetrics.protocol.identity import BatchIdentity, id_to_hex
    from lightmetrics.protocol.keys import KeyCodec, UtcHour
    from lightmetrics_pipeline.audit.job import KINDS

    codec = KeyCodec()
    ident = BatchIdentity.create("agent-é", "boot/ish".replace("/", "-"), 7, 10**19)
    sha, hour = "ab" + "cd" * 31, UtcHour.parse("2026-11-25T13")
    built = {
        "accepted": codec.accepted(ident),
        "by_time": codec.accepted_by_time(hour, ident),
        "by_blob": codec.accepted_by_blob(sha, ident),
        "blob": codec.raw_blob(sha),
        "blob_by_time": codec.raw_blobs_by_time(hour, sha),
        "quarantine": codec.quarantine(ident, sha),
        "quarantine_by_blob": codec.quarantine_by_blob(sha, ident),
        "tombstone": codec.retention_tombstone("raw", hour),
    }
    assert set(built) == set(KINDS)
    expect = {"agent": id_to_hex(ident.agent_id), "boot": id_to_hex(ident.boot_id), "s": f"{7:020d}",
              "e": f"{10**19:020d}", "sha": sha, "date": "2026-11-25", "hh": "13"}
    for kind, key in built.items():
        prefix, pattern, groups = KINDS[kind]
        assert key.startswith(prefix)
        m = re.fullmatch(pattern, key)
        assert m, (kind, key)
        assert {f: m.group(g) for f, g in groups.items()} == {f: expect[f] for f in groups}
        assert not [k for k, (_, other, _) in KINDS.items() if k != kind and re.fullmatch(other, key)]
