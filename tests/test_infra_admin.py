"""CDK assertions for issue 8: the admin function (IAM-auth URL, exact role), ingest's denylist read,
and the alarm on new identity conflicts. Uses the session's one synth (``cdk_synth``)."""

from __future__ import annotations

import json
from typing import Any

from test_infra import (
    BUCKET,
    NS,
    TABLE,
    _alarm_metrics,
    g,
    grants_of,
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
    # status reads every queue's depth and DLQ's: the index queues' and the reconciler's shards queue's
    ids = queue_ids(cdk_synth)
    assert {n for q in SPEC.shard_queues for n in (q.name, q.dlq_name)} <= set(ids)
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


def test_the_operators_managed_policy_is_what_lmctl_needs_and_deletes_nothing(cdk_synth: Any) -> None:
    """Issue 28: the operators' policy (``OperatorPolicyArn``) is the local operator role's statements: it
    starts and watches walks and reaps, reads the layout and the table, writes the operator partitions
    of the table and creates derived entries and resolutions only; no delete, no acceptance record."""
    from lightmetrics.operator_tools.policies import OPERATOR_TABLE_KEYS

    policy_id = logical_id(cdk_synth, cdk_synth.stack.operator_policy)
    props = cdk_synth.json["Resources"][policy_id]["Properties"]
    assert cdk_synth.json["Resources"][policy_id]["Type"] == "AWS::IAM::ManagedPolicy"
    grants = grants_of(props["PolicyDocument"])
    actions = {a for a, _, _ in grants}
    assert actions == {"states:StartExecution", "states:ListExecutions", "states:DescribeExecution",
                       "states:GetExecutionHistory", "dynamodb:GetItem", "dynamodb:Query",
                       "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "s3:GetObject",
                       "s3:ListBucket", "s3:PutObject", "sqs:GetQueueAttributes", "sqs:SendMessage",
                       "secretsmanager:GetSecretValue", "cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics",
                       "lambda:InvokeFunctionUrl"}
    puts = {r for a, r, _ in grants if a == "s3:PutObject"}
    assert puts == {f"{BUCKET}/{NS}{p}*" for p in ("accepted-by-time/v1/", "accepted-by-blob/v1/",
                                                   "raw-blobs-by-time/v1/", "quarantine-by-blob/v1/",
                                                   "conflict-resolutions/v1/")}
    writes = {c for a, _, c in grants if a in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")}
    assert [json.loads(c) for c in writes] == [
        {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": sorted(OPERATOR_TABLE_KEYS)}}]
    admin = logical_id(cdk_synth, cdk_synth.stack.functions.built["admin"].function)
    assert {r for a, r, _ in grants if a == "lambda:InvokeFunctionUrl"} == {f"<{admin}.Arn>"}
    assert "OperatorPolicyArn" in cdk_synth.json["Outputs"]
