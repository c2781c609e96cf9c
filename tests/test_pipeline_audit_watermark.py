"""Issue 23, property 7: a derived entry lost behind the system's back is found within one schedule
period. The weekly inventory audit — exactly what its schedule runs: the schedule's input routed
through the pipeline state machine's ASL to the job's arguments — proves every derived index complete
up to its inventory's time and moves their watermarks (docs/protocol.md §13 W6); an entry lost
after that is ``missing-derived`` in ``lmctl verify`` (exit 1) and in the next audit, which then
withholds the watermarks of the indexes it found incomplete."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from conftest import ident
from pipeline_support import accept_indexed, make_system, varied_samples

from lightmetrics.deployment.resources import PIPELINE_SCHEDULES
from lightmetrics.derived.walk import INDEXES, read_watermarks
from lightmetrics_pipeline.audit.job import read_findings
from lightmetrics_pipeline.jobs import main as job_main
from lightmetrics_pipeline.s3io import S3Access

ASL = Path(__file__).resolve().parents[1] / "infra" / "statemachines" / "pipeline.asl.json"
_NS = 10**9


def scheduled_job_arguments(job: str, inventory_location: str, execution_name: str) -> list[str]:
    """The EMR job's ``entryPointArguments`` when ``job``'s schedule fires: its input through the
    state machine's Choice to its task, ``${InventoryLocation}`` and ``$$.Execution.Name`` filled in."""
    _expression, input_json = PIPELINE_SCHEDULES[job]
    given = json.loads(input_json)
    asl = json.loads(ASL.read_text())
    choice = asl["States"][asl["StartAt"]]
    (state,) = [c["Next"] for c in choice["Choices"] if given.get(c["Variable"][2:]) == c["StringEquals"]]
    submit = asl["States"][state]["Parameters"]["JobDriver"]["SparkSubmit"]
    expr = submit["EntryPointArguments.$"]
    args = [a.strip() for a in re.fullmatch(r"States\.Array\((.*)\)", expr).group(1).split(",")]  # type: ignore[union-attr]
    filled = {"$$.Execution.Name": execution_name}
    return [filled.get(a, a.strip("'").replace("${InventoryLocation}", inventory_location)) for a in args]


def _snapshot(runner: CliRunner, cli: Any, destination: str) -> dict[str, Any]:
    out = runner.invoke(cli, ["inventory", "snapshot", "--destination", destination, "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_an_entry_lost_behind_the_systems_back_is_missing_derived_after_the_scheduled_audit(  # type: ignore[no-untyped-def]
        runtime, clock, spark, monkeypatch, capsys):
    from lightmetrics.cli.main import cli

    system = make_system(runtime, clock)
    results = [accept_indexed(system, runtime, clock, ident(n), varied_samples(n, 5)) for n in range(3)]
    for name, value in system.environment().items():
        monkeypatch.setenv(name, value)
    runner, table, settle_ns = CliRunner(), system.work_context().table, system.settings.settle_s * _NS
    bucket = system.bucket

    # The week's inventory, then what the audit schedule runs over it.
    first = _snapshot(runner, cli, f"s3://{bucket}/inventory")
    assert job_main(scheduled_job_arguments("audit", f"s3://{bucket}/inventory/", "week-1")) == 0
    capsys.readouterr()

    # Lost behind the system's back after that audit: one accepted-by-blob and one raw-blobs-by-time entry.
    s3 = runtime.boto3_client("s3")
    codec = system.work_context().codec
    by_blob = codec.accepted_by_blob(results[0].frame_sha256, ident(0))
    (by_time,) = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="raw-blobs-by-time/")["Contents"]
                  if o["Key"].endswith(f"sha256={results[1].frame_sha256}.json")]
    s3.delete_object(Bucket=bucket, Key=by_blob)
    s3.delete_object(Bucket=bucket, Key=by_time)

    out = runner.invoke(cli, ["verify", "--json"])
    doc = json.loads(out.stdout)
    assert out.exit_code == 1, (doc["watermarks"], doc["pending"])
    missing = sorted(tuple(v["keys"]) for v in doc["violations"] if v["rule"] == "missing-derived")
    assert missing == sorted([(results[0].manifest_key,), (results[1].manifest_key,)]), doc["violations"]
    w1 = first["creation_timestamp_ms"] * 1_000_000 - settle_ns
    assert read_watermarks(table) == {index: w1 for index in INDEXES}

    # A newer writer's record (a rolling deploy: collectors upgraded before the EMR image), no entries:
    # this audit cannot read it, so it cannot say which entries it lacks (rule W6).
    newer = json.loads(s3.get_object(Bucket=bucket, Key=results[2].manifest_key)["Body"].read())
    newer["schema"] = re.sub(r"\.v\d+$", ".v999", newer["schema"])
    s3.put_object(Bucket=bucket, Key=codec.accepted(ident(7)), Body=json.dumps(newer).encode())

    # Next week's audit reports both lost entries as missing-derived, and withholds every index's
    # watermark: two for those findings, all four for the record it could not read.
    second = _snapshot(runner, cli, f"s3://{bucket}/inventory-2")
    assert job_main(scheduled_job_arguments("audit", f"s3://{bucket}/inventory-2/", "week-2")) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["confirmed_by_rule"] == {"missing-derived": 2}
    access = S3Access.from_settings(system.settings, endpoint_url=runtime.endpoint_url)
    found = sorted(row["missing"] for row in read_findings(access, "week-2", "repair"))
    assert found == ["accepted-by-blob", "raw-blobs-by-time"]
    assert second["creation_timestamp_ms"] * 1_000_000 - settle_ns > w1
    withheld = summary["watermarks"]["withheld"]
    assert summary["watermarks"]["proved"] == {}, withheld
    assert sorted(withheld) == sorted(INDEXES)
    assert all("1 record(s) this audit cannot read (unsupported-version)" in why for why in withheld.values()), withheld
    assert "1 confirmed missing-derived finding(s)" in withheld["accepted-by-blob"]
    assert read_watermarks(table) == {index: w1 for index in INDEXES}


def test_an_audits_watermarks_cost_at_most_four_conditional_updates_and_never_move_back() -> None:
    """The cost of W6, counted (no Spark): one ``UpdateItem`` per proven index, nothing per record;
    an older inventory's plan moves nothing; a withheld index is not written."""
    from lightmetrics.harness.testing.memory.control_table import InMemoryControlTable
    from lightmetrics.operator_tools.audit_watermarks import apply_watermarks, plan_watermarks

    table = InMemoryControlTable()
    week = plan_watermarks({"creation_timestamp_ms": 1_764_000_000_000}, 900, {})
    assert apply_watermarks(table, week, now_ns=1, run_id="w1") == sorted(INDEXES)
    assert table.requests == {"UpdateItem": 4}
    older = plan_watermarks({"creation_timestamp_ms": 1_763_000_000_000}, 900, {"raw-blobs-by-time": 3})
    assert older["withheld"] == {"raw-blobs-by-time": "3 confirmed missing-derived finding(s)"}
    assert apply_watermarks(table, older, now_ns=2, run_id="w0") == []  # monotonic: never lowered
    # the three proven indexes tried (each failed condition read back once: update_own), the withheld one not
    assert table.requests == {"UpdateItem": 7, "GetItem": 3}
    w = read_watermarks(table)
    assert w == {i: 1_764_000_000 * _NS - 900 * _NS for i in INDEXES}
    newer = plan_watermarks({"creation_timestamp_ms": 1_765_000_000_000}, 900, {}, {"invalid-manifest": 2})
    assert newer["proved"] == {} and sorted(newer["withheld"]) == sorted(INDEXES)  # unreadable: no index proven
    before = dict(table.requests)
    assert apply_watermarks(table, newer, now_ns=3, run_id="w2") == [] and table.requests == before  # none sent
    assert table.get("watermark#accepted-by-blob", "current")["set_by"] == "audit run w1"
