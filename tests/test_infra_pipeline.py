"""The pipeline's CDK resources (issue 7), from the session's one synth (``cdk_synth``)."""

from __future__ import annotations

import json
import re
from typing import Any

NS = "lm-test/"  # conftest.INFRA_TEST_CONTEXT["prefix"]


def _template(cdk_synth: Any) -> dict[str, Any]:
    from aws_cdk.assertions import Template

    return Template.from_stack(cdk_synth.stack.pipeline).to_json()


def _of(template: dict[str, Any], kind: str) -> dict[str, Any]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


def _flat(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def test_pipeline_is_a_nested_stack_with_an_emr_serverless_application(cdk_synth: Any) -> None:
    main = cdk_synth.json
    assert len(_of(main, "AWS::CloudFormation::Stack")) == 1
    t = _template(cdk_synth)
    (app,) = _of(t, "AWS::EMRServerless::Application").values()
    p = app["Properties"]
    assert (p["Type"], p["ReleaseLabel"]) == ("SPARK", "emr-spark-8.0.0")  # Apache Spark 4.0
    assert p["AutoStopConfiguration"]["Enabled"] and p["MaximumCapacity"]["Cpu"]


def test_job_role_has_exactly_the_jobs_permissions(cdk_synth: Any) -> None:
    t = _template(cdk_synth)
    role_id = cdk_synth.stack.pipeline.get_logical_id(cdk_synth.stack.pipeline.job_role.node.default_child)
    role = t["Resources"][role_id]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "emr-serverless.amazonaws.com"} and "ManagedPolicyArns" not in role
    # Only this application's job runs assume it (the confused-deputy guard), in this account.
    app_id = cdk_synth.stack.pipeline.get_logical_id(cdk_synth.stack.pipeline.application)
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    arns = trust["Condition"]["ArnLike"]["aws:SourceArn"]
    app_ref = _flat({"Fn::GetAtt": [app_id, "ApplicationId"]})
    for arn in map(_flat, arns):  # this application, or one of its job runs: nothing else
        assert ":emr-serverless:" in arn and ":/applications/" in arn and app_ref in arn
        assert arn.endswith(app_ref + "]]}") or arn.endswith(app_ref + ', "/jobruns/*"]]}')
    policies = [r["Properties"] for r in _of(t, "AWS::IAM::Policy").values()
                if any(x.get("Ref") == role_id for x in r["Properties"]["Roles"])]
    statements = [s for p in policies for s in p["PolicyDocument"]["Statement"]]
    actions = sorted({a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])})
    assert actions == ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem", "s3:GetObject",
                       "s3:ListBucket", "s3:PutObject"]
    assert not any("Delete" in a or a.endswith("*") for a in actions)
    by_sid = {s["Sid"]: s for s in statements}
    put = _flat(by_sid["CreateRollupsAndAudits"]["Resource"])
    for prefix in ("rollup/v1/", "index/v1/", "manifests/v1/", "audit/v1/"):
        assert f"/{NS}{prefix}*" in put
    for forbidden in ("accepted/v1/", "raw-blobs/v1/", "quarantine/v1/", "retention/v1/", "accepted-by-time/v1/"):
        assert f"/{NS}{forbidden}" not in put  # the jobs never create there
    listing = by_sid["ListLayout"]["Condition"]["StringLike"]["s3:prefix"]
    assert all(p.startswith(NS) and p.endswith("/*") for p in listing) and f"{NS}accepted-by-time/v1/*" in listing
    def listed(value: Any) -> list[str]:
        return sorted([value] if isinstance(value, str) else value)

    def leading_keys(sid: str) -> list[str]:
        return listed(by_sid[sid]["Condition"]["ForAllValues:StringEquals"]["dynamodb:LeadingKeys"])

    assert leading_keys("RollupLease") == ["lease#rollup"]  # the only items the jobs write, but ...
    assert leading_keys("AuditWatermarks") == sorted(f"watermark#{i}" for i in (  # ... the watermarks the audit proves
        "accepted-by-time", "accepted-by-blob", "raw-blobs-by-time", "quarantine-by-blob"))
    assert listed(by_sid["AuditWatermarks"]["Action"]) == ["dynamodb:GetItem", "dynamodb:UpdateItem"]  # + read-back (CW1)
    # the reconciler's checkpoints, and every partition a reap's marks item may be under: the 32 marks
    # shards and the previous version's checkpoint#reap (docs/protocol.md §15 G-I10, §17 E8)
    assert leading_keys("ReadCheckpointsAndGcMarks") == sorted(
        ["checkpoint#reap", "checkpoint#reconcile", *(f"checkpoint#reap#marks#{s:02d}" for s in range(32))])
    assert listed(by_sid["ReadCheckpointsAndGcMarks"]["Action"]) == ["dynamodb:GetItem", "dynamodb:Query"]


def test_jobs_get_the_region_and_the_reconcilers_shard_count(cdk_synth: Any) -> None:
    """The jobs' AWS clients get the stack's region, and the rollup reads every reconciler shard's
    checkpoint (protocol §12 R8): both are Spark confs of every job."""
    t = _template(cdk_synth)
    (sm,) = _of(t, "AWS::StepFunctions::StateMachine").values()
    confs = _flat(sm["Properties"]["DefinitionSubstitutions"]["SparkSubmitParameters"])
    shards = cdk_synth.stack.config.settings.reconcile_shards
    for env in ("spark.emr-serverless.driverEnv", "spark.executorEnv"):
        assert f"{env}.LM_RECONCILE_SHARDS={shards}" in confs
        assert f"{env}.LM_SETTLE_S={cdk_synth.stack.config.settings.settle_s}" in confs  # the audit's W (§13 W6)
        assert f"{env}.AWS_REGION=" in confs
    assert '"Ref": "AWS::Region"' in confs  # the deploying region, not a constant


def test_state_machine_starts_the_jobs_from_its_asl_file(cdk_synth: Any) -> None:
    from infra.components.pipeline import ASL_FILE, PLACEHOLDERS

    t = _template(cdk_synth)
    (sm,) = _of(t, "AWS::StepFunctions::StateMachine").values()
    p = sm["Properties"]
    assert p["DefinitionString"] == ASL_FILE.read_text()  # the file, substituted by CloudFormation
    assert set(re.findall(r"\$\{([A-Za-z0-9_]+)\}", p["DefinitionString"])) == set(PLACEHOLDERS) == set(
        p["DefinitionSubstitutions"])
    asl = json.loads(ASL_FILE.read_text())
    tasks = [s for s in asl["States"].values() if s["Type"] == "Task"]
    assert {s["Resource"] for s in tasks} == {"arn:aws:states:::emr-serverless:startJobRun.sync"}
    assert p["TracingConfiguration"] == {"Enabled": True} and p["LoggingConfiguration"]["Level"] == "ALL"
    submit = _flat(p["DefinitionSubstitutions"]["SparkSubmitParameters"])
    from infra.pipeline_bundle import JOB_PYTHON_PATH

    assert "spark.archives=" in submit and f"spark.executorEnv.PYSPARK_PYTHON={JOB_PYTHON_PATH}" in submit
    assert "spark.executorEnv.PYTHONPATH=./deps" in submit and "spark.emr-serverless.driverEnv.PYTHONPATH=./deps" in submit
    assert "spark.executorEnv.LM_BUCKET=" in submit and f"LM_PREFIX={NS}" in submit
    # Its role: start runs of this application, watch them, pass exactly the job role.
    role_id = cdk_synth.stack.pipeline.get_logical_id(cdk_synth.stack.pipeline.machine_role.node.default_child)
    statements = [s for r in _of(t, "AWS::IAM::Policy").values() if any(x.get("Ref") == role_id for x in r["Properties"]["Roles"])
                  for s in r["Properties"]["PolicyDocument"]["Statement"]]
    by_sid = {s.get("Sid"): s for s in statements}
    assert by_sid["StartJobRuns"]["Action"] == "emr-serverless:StartJobRun"
    assert by_sid["PassJobRole"]["Condition"] == {"StringEquals": {"iam:PassedToService": "emr-serverless.amazonaws.com"}}
    rules = [r["Properties"] for r in _of(t, "AWS::Events::Rule").values() if "ScheduleExpression" in r["Properties"]]
    inputs = sorted(json.loads(r["Targets"][0]["Input"])["job"] for r in rules)
    assert inputs == ["audit", "rollup"]
    # The schedules are exactly PIPELINE_SCHEDULES: what tests/test_pipeline_audit_watermark.py runs.
    from lightmetrics.deployment.resources import PIPELINE_SCHEDULES

    assert sorted((r["ScheduleExpression"], json.loads(r["Targets"][0]["Input"])) for r in rules) == sorted(
        (expression, json.loads(given)) for expression, given in PIPELINE_SCHEDULES.values())


def test_alarms_on_failed_job_runs(cdk_synth: Any) -> None:
    t = _template(cdk_synth)
    alarms = {a["Properties"]["AlarmName"]: a["Properties"] for a in _of(t, "AWS::CloudWatch::Alarm").values()}
    names = {n.split("-", 1)[1] for n in alarms}
    assert names == {"PipelineExecutionsFailed", "PipelineJobRunsFailed"}
    for a in alarms.values():
        assert a["AlarmActions"] and a["Threshold"] == 1 and a["TreatMissingData"] == "notBreaching"
    (failed,) = [r["Properties"] for r in _of(t, "AWS::Events::Rule").values() if "EventPattern" in r["Properties"]]
    assert failed["EventPattern"]["detail"]["state"] == ["FAILED"]
    assert failed["EventPattern"]["detail-type"] == ["EMR Serverless Job Run State Change"]


def test_inventory_configuration_feeds_the_audit(cdk_synth: Any) -> None:
    from lightmetrics_pipeline.inventory.report import CONFIG_ID, DEST_PREFIX, FIELDS

    (bucket,) = [r["Properties"] for r in _of(cdk_synth.json, "AWS::S3::Bucket").values()
                 if r["Properties"].get("InventoryConfigurations")]
    (inv,) = bucket["InventoryConfigurations"]
    assert (inv["Id"], inv["Destination"]["Format"], inv["ScheduleFrequency"]) == (CONFIG_ID, "Parquet", "Weekly")
    assert inv["Destination"]["Prefix"] == DEST_PREFIX and inv["IncludedObjectVersions"] == "All"
    # the optional fields the stack asks for are the reader's columns (CSV names)
    assert set(inv["OptionalFields"]) <= {csv for _, csv, _ in FIELDS}


def test_nag_findings_of_the_pipeline_are_all_suppressed_with_reasons(cdk_synth: Any) -> None:
    from aws_cdk.assertions import Match

    # A nested stack's findings are reported with the parent's messages, under its path.
    for finder in (cdk_synth.annotations.find_error, cdk_synth.annotations.find_warning):
        found = [m for m in finder("*", Match.string_like_regexp("AwsSolutions-.*")) if "/Pipeline/" in m.id]
        assert found == [], [f"{m.id}: {str(m.entry.data)[:160]}" for m in found]
    paths = {"/" + c.node.path for c in cdk_synth.stack.pipeline.node.find_all()}
    assert any(p.endswith("/Pipeline/JobRole") for p in paths)
    t = _template(cdk_synth)
    reasons = [s for r in t["Resources"].values() for s in r.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])]
    assert reasons and all(len(s["reason"]) >= 40 for s in reasons)


def _assets(cdk_synth: Any) -> dict[str, Any]:
    """The assembly's file assets by object key (``<hash>.<ext>``) -> the staged file."""
    (manifest,) = cdk_synth.outdir.glob("*.assets.json")
    files = json.loads(manifest.read_text())["files"].values()
    return {next(iter(f["destinations"].values()))["objectKey"]: cdk_synth.outdir / f["source"]["path"] for f in files}


def _asset_key(url: Any) -> str:
    """``<hash>.<ext>`` of an asset's ``s3://`` URL as the template holds it (an Fn::Sub)."""
    (key,) = re.findall(r"s3://cdk-[a-z0-9]+-assets-\$\{AWS::AccountId\}-\$\{AWS::Region\}/([0-9a-f]{64}\.\w+)", _flat(url))
    return key


def test_the_jobs_bundle_is_synthesized_as_assets(cdk_synth: Any) -> None:
    """Entry point, code zip and dependency zip are CDK assets (content-hashed keys in the bootstrap
    bucket, not the ops bucket whose lifecycle expires objects); the job's parameters reference
    exactly them, and the job role may read exactly them."""
    import zipfile

    from infra.pipeline_bundle import DEPS_ZIP, ENTRY_POINT, JOB_PYTHON, ROOT

    t = _template(cdk_synth)
    (sm,) = _of(t, "AWS::StepFunctions::StateMachine").values()
    subs = sm["Properties"]["DefinitionSubstitutions"]
    assets = _assets(cdk_synth)
    entry = _asset_key(subs["EntryPoint"])
    assert entry.endswith(".py") and assets[entry].read_bytes() == ENTRY_POINT.read_bytes()
    submit = subs["SparkSubmitParameters"]["Fn::Join"][1]
    flat = "".join(p if isinstance(p, str) else "{}" for p in submit)
    assert flat.startswith("--conf spark.submit.pyFiles={} --conf spark.archives={}#deps ")
    py_files, archive = _asset_key(submit[1]), _asset_key(submit[3])
    assert assets[archive].read_bytes() == DEPS_ZIP.read_bytes()

    # The code zip: our packages at the root as in the source tree (synth builds it: bundle.ensure_app_zip),
    # pure Python. Compared by names and one file: other sources may change after the session's synth.
    with zipfile.ZipFile(assets[py_files]) as zf:
        names = zf.namelist()
        assert zf.read("lightmetrics_pipeline/jobs.py") == (ROOT / "pipeline" / "jobs.py").read_bytes()
    assert {"lightmetrics/work/leases.py", "lightmetrics_pipeline/jobs.py"} <= set(names) and "lightmetrics_pipeline/emr_main.py" in names
    assert not any(n.startswith(("pipeline/", "functions/")) for n in names)  # no generic top-level names
    assert not any(n.endswith((".so", ".pyc")) or "__pycache__" in n for n in names)
    with zipfile.ZipFile(assets[archive]) as zf:  # wheels for the job's Python and platform, no Spark
        tops = {n.split("/")[0] for n in zf.namelist()}
        natives = [n for n in zf.namelist() if n.startswith("pydantic_core/") and n.endswith(".so")]
    assert {"pydantic", "pyarrow", "pandas", "zstandard", "ddsketch", "boto3"} <= tops and "pyspark" not in tops
    tag = JOB_PYTHON.replace(".", "")
    assert natives and all(f"cpython-{tag}-x86_64-linux-gnu" in n for n in natives)

    role_id = cdk_synth.stack.pipeline.get_logical_id(cdk_synth.stack.pipeline.job_role.node.default_child)
    statements = [s for r in _of(t, "AWS::IAM::Policy").values() if any(x.get("Ref") == role_id for x in r["Properties"]["Roles"])
                  for s in r["Properties"]["PolicyDocument"]["Statement"]]
    (read,) = [s for s in statements if s.get("Sid") == "ReadJobBundle"]
    assert read["Action"] == "s3:GetObject"
    assert sorted(_flat(r).split("/")[-1].split('"')[0] for r in read["Resource"]) == sorted([entry, py_files, archive])
