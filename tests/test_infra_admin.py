"""CDK assertions for issue 8: the admin function (IAM-auth URL, exact role), ingest's denylist read,
and the alarm on new identity conflicts. Uses the session's one synth (``cdk_synth``)."""

from __future__ import annotations

from typing import Any

from test_infra import (
    BUCKET,
    NS,
    TABLE,
    _alarm_metrics,
    g,
    logical_id,
    queue_ids,
    render,
    resources,
    role_grants,
)

from lightmetrics.deployment.resources import SPEC
from lightmetrics.derived.indexing import CONFLICTS_REGISTERED_METRIC


def test_admin_function_url_requires_iam(cdk_synth: Any) -> None:
    admin = cdk_synth.stack.functions.built["admin"]
    fn_id = logical_id(cdk_synth, admin.function)
    urls = {render(u["Properties"]["TargetFunctionArn"]): render(u["Properties"])
            for u in resources(cdk_synth, "AWS::Lambda::Url").values()}
    assert urls[f"<{fn_id}.Arn>"] == {"AuthType": "AWS_IAM", "InvokeMode": "BUFFERED", "TargetFunctionArn": f"<{fn_id}.Arn>"}
    # No resource policy lets anyone in: callers need lambda:InvokeFunctionUrl from their own IAM policy.
    perms = [render(p["Properties"]) for p in resources(cdk_synth, "AWS::Lambda::Permission").values()
             if render(p["Properties"]["FunctionName"]) == f"<{fn_id}.Arn>"]
    assert perms == []
    assert "AdminUrl" in cdk_synth.json["Outputs"]
    props = cdk_synth.json["Resources"][fn_id]["Properties"]
    assert props["Handler"] == "functions.admin.app.handler" and "ReservedConcurrentExecutions" not in props
    env = render(props["Environment"]["Variables"])
    assert "LM_INGEST_URL" not in env and env["POWERTOOLS_SERVICE_NAME"] == "admin"


def test_admin_role_is_exactly_least_privilege(cdk_synth: Any) -> None:
    built = cdk_synth.stack.functions.built["admin"]
    log_group = f"<{logical_id(cdk_synth, built.log_group)}.Arn>"
    ids = queue_ids(cdk_synth)
    prefixes = ["quarantine/v1/*", "conflict-resolutions/v1/*"]
    assert role_grants(cdk_synth, logical_id(cdk_synth, built.role)) == {
        g("s3:GetObject", f"{BUCKET}/{NS}quarantine/v1/*"),  # the evidence
        g("s3:GetObject", f"{BUCKET}/{NS}conflict-resolutions/v1/*"),  # resolution records ...
        g("s3:PutObject", f"{BUCKET}/{NS}conflict-resolutions/v1/*"),  # ... created once (bucket policy)
        g("s3:ListBucket", BUCKET, {"StringLike": {"s3:prefix": [NS + p for p in prefixes]}}),
        *(g(f"dynamodb:{a}", TABLE) for a in ("GetItem", "Query", "PutItem", "UpdateItem", "DeleteItem")),
        *(g("sqs:GetQueueAttributes", f"<{qid}.Arn>") for qid in ids.values()),  # status: queue depths
        g("xray:PutTraceSegments", "*"),
        g("xray:PutTelemetryRecords", "*"),
        g("logs:CreateLogStream", log_group),
        g("logs:PutLogEvents", log_group),
    }
    # It can neither accept batches, nor touch acceptance records, nor delete anything.
    spec = SPEC.function("admin")
    assert not spec.s3_delete and "accepted/v1/" not in spec.s3_write + spec.s3_read and not spec.reads_secret


def test_ingest_reads_the_denylist_and_nothing_else_of_the_table(cdk_synth: Any) -> None:
    built = cdk_synth.stack.functions.built["ingest"]
    grants = role_grants(cdk_synth, logical_id(cdk_synth, built.role))
    assert {a for a, _, _ in grants if a.startswith("dynamodb:")} == {"dynamodb:GetItem", "dynamodb:Query"}
    env = render(cdk_synth.json["Resources"][logical_id(cdk_synth, built.function)]["Properties"]["Environment"]
                 ["Variables"])
    assert env["LM_DENYLIST_TTL_S"] == "60"


def test_new_conflicts_alarm_reads_the_metric_the_quarantine_indexer_emits(cdk_synth: Any) -> None:
    alarms = {render(a["Properties"]["AlarmName"]): a for a in resources(cdk_synth, "AWS::CloudWatch::Alarm").values()}
    (topic_id,) = resources(cdk_synth, "AWS::SNS::Topic")
    for fn, service in (("IndexQuarantine", "index-quarantine"), ("WalkPage", "walk-page")):
        alarm = alarms[f"Lightmetrics-{fn}NewConflicts"]
        p = alarm["Properties"]
        (metric,) = _alarm_metrics(alarm)
        assert (metric["Namespace"], metric["MetricName"], metric["Dimensions"]) == (
            "Lightmetrics", CONFLICTS_REGISTERED_METRIC, [{"Name": "service", "Value": service}])
        assert p["Threshold"] == 1 and p["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert p["AlarmActions"] == [{"Ref": topic_id}] and "docs/runbook.md#newconflicts" in p["AlarmDescription"]
    assert [n for n in alarms if n.endswith("NewConflicts")].__len__() == 2
