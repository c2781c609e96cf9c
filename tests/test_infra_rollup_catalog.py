"""The rollups' Athena tables (issue 15, docs/pipeline.md §6.1), from the session's one synth,
checked against a Parquet object the rollup job actually wrote. Athena itself cannot run here."""

from __future__ import annotations

import io
import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pipeline_support import H0, accept_indexed, access_for, make_system, varied_samples

from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics_pipeline.rollup.committed import read_committed
from lightmetrics_pipeline.rollup.job import RollupJob
from lightmetrics_pipeline.s3io import store


def _glue_type(t: pa.DataType) -> str:
    """The Hive/Glue type Athena reads an Arrow (Parquet) type as — written out here, independently
    of the component's own list."""
    if pa.types.is_map(t):
        return f"map<{_glue_type(t.key_type)},{_glue_type(t.item_type)}>"
    if pa.types.is_timestamp(t):
        assert t.unit == "us" and t.tz == "UTC"  # Parquet TIMESTAMP(MICROS, isAdjustedToUTC): Athena's timestamp
        return "timestamp"
    return {pa.string(): "string", pa.int64(): "bigint", pa.int32(): "int", pa.float64(): "double",
            pa.binary(): "binary"}[t]


def _render(value: Any, bucket: str) -> str:
    """A synthesized string that may be an ``Fn::Join`` with the bucket's reference in it."""
    if isinstance(value, str):
        return value
    sep, parts = value["Fn::Join"]
    return sep.join(p if isinstance(p, str) else bucket for p in parts)


def _pipeline_template(cdk_synth: Any) -> dict[str, Any]:
    from aws_cdk.assertions import Template

    return Template.from_stack(cdk_synth.stack.pipeline).to_json()


def test_rollups_table_reads_the_files_the_rollup_writes(cdk_synth, runtime, clock, spark) -> None:  # type: ignore[no-untyped-def]
    resources = _pipeline_template(cdk_synth)["Resources"].values()
    tables = {r["Properties"]["TableInput"]["Name"]: r["Properties"]["TableInput"]
              for r in resources if r["Type"] == "AWS::Glue::Table"}
    assert set(tables) == {"rollups", "rollup_manifests"}
    rollups = tables["rollups"]

    system = make_system(runtime, clock)
    accept_indexed(system, runtime, clock, BatchIdentity.create("agent-g", "boot-1", 0, 9), varied_samples(1))
    access = access_for(system, runtime)
    RollupJob(spark, access, table=None, clock=clock).run([H0], first_open=H0.next())
    obj = read_committed(access, H0)["parquet"]["objects"][0]
    schema = pq.read_schema(io.BytesIO(store(access).get(obj["key"]) or b""))
    assert [(c["Name"], c["Type"]) for c in rollups["StorageDescriptor"]["Columns"]] == \
        [(f.name, _glue_type(f.type)) for f in schema]
    partitions = [c["Name"] for c in rollups["PartitionKeys"]]
    assert partitions == ["window", "date", "hour", "generation"] and not set(partitions) & set(schema.names)

    # Partition projection: the template, filled with the written key's own partition values, is
    # exactly that object's folder (in the synth's namespace) — and never a v1/v2 metric= folder.
    params = rollups["Parameters"]
    assert params["projection.enabled"] == "true" and params["projection.window.values"] == "1m,5m,1h"
    assert (params["projection.hour.range"], params["projection.hour.digits"]) == ("0,23", "2")
    assert params["projection.generation.digits"] == "10" and params["projection.date.format"] == "yyyy-MM-dd"
    template = _render(params["storage.location.template"], "BUCKET")
    rel = obj["key"][len(access.codec.prefix):]
    m = re.fullmatch(r"rollup/v1/window=(?P<window>[^/]+)/date=(?P<date>[^/]+)/hour=(?P<hour>\d\d)/"
                     r"generation=(?P<generation>\d{10})/part-\d{5}\.[0-9a-f]{64}\.parquet", rel)
    assert m is not None
    filled = template
    for name, value in m.groupdict().items():
        filled = filled.replace("${" + name + "}", value)
    assert filled == f"s3://BUCKET/{cdk_synth.context['prefix']}{rel.rsplit('/', 1)[0]}/"
    assert "metric=" not in template and _render(rollups["StorageDescriptor"]["Location"], "BUCKET") == \
        f"s3://BUCKET/{cdk_synth.context['prefix']}rollup/v1/"


def test_manifests_table_and_the_current_view(cdk_synth) -> None:  # type: ignore[no-untyped-def]
    resources = list(_pipeline_template(cdk_synth)["Resources"].values())
    manifests = next(r["Properties"]["TableInput"] for r in resources
                     if r["Type"] == "AWS::Glue::Table" and r["Properties"]["TableInput"]["Name"] == "rollup_manifests")
    assert manifests["StorageDescriptor"]["SerdeInfo"]["SerializationLibrary"] == "org.openx.data.jsonserde.JsonSerDe"
    template = _render(manifests["Parameters"]["storage.location.template"], "BUCKET")
    assert template == f"s3://BUCKET/{cdk_synth.context['prefix']}manifests/v1/date=${{date}}/hour=${{hour_part}}/"
    (db,) = [r["Properties"]["DatabaseInput"]["Name"] for r in resources if r["Type"] == "AWS::Glue::Database"]
    (query,) = [r["Properties"] for r in resources if r["Type"] == "AWS::Athena::NamedQuery"]
    sql = query["QueryString"]
    assert query["Database"] == db and f"CREATE OR REPLACE VIEW {db}.rollups_current" in sql
    # the view keeps the rows of the highest generation's manifest, and only when it is v3
    for needle in ("max(generation)", "'lightmetrics.rollup_manifest.v3'", "r.acceptance_hour = c.hour",
                   "r.rollup_generation = c.generation", "r.inputs_sha256 = c.inputs_sha256"):
        assert needle in sql, needle
    # Issue 27 item 9: ... joined on the rollups table's partition columns too (the generation as
    # the key's 10-digit text), so Athena prunes the hour's other generation folders.
    for needle in ('r."date" = c.manifest_date', "r.hour = c.hour_part", "r.generation = c.generation_folder",
                   "lpad(CAST(m.generation AS varchar), 10, '0') AS generation_folder"):
        assert needle in sql, needle


def test_the_job_builds_no_generation_the_catalog_does_not_project() -> None:
    # Issue 27 item 9: an hour rebuilt past the projected range dropped out of rollups_current.
    from infra.components.rollup_catalog import MAX_PROJECTED_GENERATION
    from lightmetrics_pipeline.rollup.parquet import MAX_GENERATION
    from lightmetrics_pipeline.rollup.plan import decide

    assert MAX_PROJECTED_GENERATION == MAX_GENERATION
    committed = {"generation": MAX_GENERATION - 1, "supersedes": MAX_GENERATION - 2, "inputs": {"sha256": "a"}}
    assert decide(committed, 3, "b", False, MAX_GENERATION) == ("build", MAX_GENERATION, MAX_GENERATION - 1)
    at_limit = {**committed, "generation": MAX_GENERATION, "supersedes": MAX_GENERATION - 1}
    assert decide(at_limit, 3, "b", False, MAX_GENERATION) == ("generation-limit", MAX_GENERATION, MAX_GENERATION - 1)
    assert decide(at_limit, 3, "a", True, MAX_GENERATION)[0] == "recompute"  # its own generation: still recomputable
    assert decide(None, 0, "x", False, MAX_GENERATION) == ("empty", None, None)


def test_pipeline_doc_states_the_projected_generation_range_the_code_sets() -> None:
    # Issue 27 item 7: docs/pipeline.md §6.1 said `1-9999999999` while the table projects 1 to 999.
    from pathlib import Path

    from infra.components.rollup_catalog import MAX_PROJECTED_GENERATION

    doc = (Path(__file__).resolve().parents[1] / "docs" / "pipeline.md").read_text()
    section = doc.split("### 6.1 ", 1)[1].split("\n### ", 1)[0]
    assert f"`generation`\n  integer `1-{MAX_PROJECTED_GENERATION}` (`MAX_PROJECTED_GENERATION`)" in section
    assert f"more than {MAX_PROJECTED_GENERATION} times" in section and "9999999999" not in section
