"""Audit output split within a category (issue 15): a category's findings go to ceil(rows /
rows_per_part) part files, each written by its own task, each line in the part its hash names (the
same findings make the same files), and the summary lists every file it commits."""

from __future__ import annotations

import json

from conftest import T0_NS
from pipeline_support import access_for, make_system

from lightmetrics_pipeline.audit.job import read_findings, run_audit
from lightmetrics_pipeline.inventory import report as inv
from lightmetrics_pipeline.synthetic import generate_inventory


def test_a_big_category_is_written_as_many_parts_by_as_many_tasks(runtime, clock, spark, tmp_path):  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock)
    now_s = T0_NS // 10**9
    gen = generate_inventory(tmp_path, bucket=system.bucket, identities=20, now_s=now_s, orphan_derived=25)
    s3 = runtime.boto3_client("s3")
    for key in gen.planted["derived-without-source"]:  # the entries exist live; their records do not
        s3.put_object(Bucket=system.bucket, Key=key, Body=b"{}", IfNoneMatch="*")
    access = access_for(system, runtime, "pipeline-audit")
    report = run_audit(spark, inv.inventory_dataframe(spark, inv.open_report(str(tmp_path))), access, run_id="parts",
                       now_s=now_s, retry_horizon_s=7 * 86400, rows_per_part=10)

    assert report.confirmed["derived-without-source"] == 25
    prefix = "audit/v1/run=parts/derived-without-source/"
    assert report.files["derived-without-source"] == [f"{prefix}part-{p:05d}.jsonl" for p in range(3)]  # ceil(25/10)
    assert report.write_tasks == 3  # one task per file: none idle, none writing two
    summary = json.loads(s3.get_object(Bucket=system.bucket, Key=report.summary_key)["Body"].read())
    assert summary["files"] == report.files and summary["confirmed"]["derived-without-source"] == 25
    assert summary["write_tasks"] == 3

    lines = {}
    for part, key in enumerate(report.files["derived-without-source"]):
        body = s3.get_object(Bucket=system.bucket, Key=key)["Body"].read().decode()
        got = body.splitlines()
        assert got == sorted(got) and 0 < len(got) <= 10
        lines.update({line: part for line in got})
    assert sorted(json.loads(line)["entry_key"] for line in lines) == sorted(gen.planted["derived-without-source"])
    assert len(read_findings(access, "parts", "derived-without-source")) == 25
    # Each line sits in the part its rank among the category's sorted lines names (balanced: 9, 8, 8,
    # where a hash of the line put 14 in one part): another run over the same findings writes the same files.
    assert lines == {line: rank % 3 for rank, line in enumerate(sorted(lines))}
