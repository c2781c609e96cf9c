"""Every function's trigger is wired as its spec says (queue mappings, schedules, the URL)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_infra import render, resources

from lightmetrics.deployment.resources import SPEC


def _function_ids(cdk_synth: Any) -> dict[str, str]:
    """FunctionSpec name -> logical id of its Lambda (matched by the handler string)."""
    out = {}
    for lid, res in resources(cdk_synth, "AWS::Lambda::Function").items():
        handler = res["Properties"].get("Handler")
        for fn in SPEC.functions:
            if handler == fn.handler_string:
                out[fn.name] = lid
    return out


def test_queue_functions_have_partial_batch_event_source_mappings(cdk_synth: Any) -> None:
    ids = _function_ids(cdk_synth)
    mappings = resources(cdk_synth, "AWS::Lambda::EventSourceMapping").values()
    by_function = {render(m["Properties"]["FunctionName"]): m["Properties"] for m in mappings}
    queue_fns = [f for f in SPEC.functions if f.trigger_kind == "queue"]
    assert {f.name for f in queue_fns} == {"index-accepted", "index-raw-blobs", "index-quarantine"}
    assert len(by_function) == len(queue_fns) + 1  # and the reconciler's shards queue
    for fn in queue_fns:
        props = next(p for name, p in by_function.items() if ids[fn.name] in str(name))
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"], fn.name
        assert props["BatchSize"] == fn.batch_size


def test_the_reconciler_runs_each_shard_from_its_shards_queue_with_a_dlq(cdk_synth: Any) -> None:
    """One message a run, partial-batch responses, a DLQ with its DlqNotEmpty alarm; the queue
    outlasts a run; the function is told the queue's URL and may send to it (the fan-out), and only
    it may send (the admin function is told it too: status reads its depth)."""
    ids = _function_ids(cdk_synth)
    (props,) = [m["Properties"] for m in resources(cdk_synth, "AWS::Lambda::EventSourceMapping").values()
                if ids["reconcile"] in str(render(m["Properties"]["FunctionName"]))]
    assert (props["BatchSize"], props["FunctionResponseTypes"]) == (1, ["ReportBatchItemFailures"])
    spec = SPEC.shard_queue("reconcile-shards")
    queues = resources(cdk_synth, "AWS::SQS::Queue")
    (queue_id,) = [lid for lid in queues if lid in str(props["EventSourceArn"])]
    attrs = queues[queue_id]["Properties"]
    assert attrs["VisibilityTimeout"] == spec.visibility_timeout_s >= SPEC.function("reconcile").timeout_s
    policy = attrs["RedrivePolicy"]
    assert policy["maxReceiveCount"] == spec.max_receive_count
    dlq_id = policy["deadLetterTargetArn"]["Fn::GetAtt"][0]
    assert queues[dlq_id]["Properties"]["MessageRetentionPeriod"] == spec.dlq_retention_s
    # its dead letters page like an index queue's: the alarm reads this DLQ's visible messages
    (alarm,) = [a["Properties"] for a in resources(cdk_synth, "AWS::CloudWatch::Alarm").values()
                if dlq_id in json.dumps(a["Properties"].get("Dimensions"))]
    assert render(alarm["AlarmName"]) == "Lightmetrics-ReconcileShardsDlqNotEmpty"
    assert (alarm["MetricName"], alarm["Statistic"], alarm["Threshold"]) == (
        "ApproximateNumberOfMessagesVisible", "Maximum", 1)
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert "docs/runbook.md#dlqnotempty" in alarm["AlarmDescription"] and spec.dlq_name in alarm["AlarmDescription"]
    functions = resources(cdk_synth, "AWS::Lambda::Function")
    told = {name for name, lid in ids.items()
            if "LM_RECONCILE_SHARDS_QUEUE_URL" in functions[lid]["Properties"]["Environment"]["Variables"]}
    assert told == {"reconcile", "admin"}  # the fan-out, and the admin API's status (its depth)
    senders = {lid for lid, p in resources(cdk_synth, "AWS::IAM::Policy").items()
               if "sqs:SendMessage" in json.dumps(p) and queue_id in json.dumps(p)}
    assert len(senders) == 1 and "ReconcileRole" in next(iter(senders)), senders


def test_scheduled_functions_have_rules(cdk_synth: Any) -> None:
    ids = _function_ids(cdk_synth)
    rules = list(resources(cdk_synth, "AWS::Events::Rule").values())
    scheduled = {f.name: f.trigger_arg for f in SPEC.functions if f.trigger_kind == "schedule"}
    assert set(scheduled) >= {"reconcile", "sweep-dlq"}
    for name, expression in scheduled.items():
        targets = [r for r in rules if ids[name] in str(r["Properties"].get("Targets"))]
        # exactly one rule each, EventBridge's own event: the reconciler's fans out (protocol §12 R8)
        assert len(targets) == 1, name
        assert "Input" not in targets[0]["Properties"]["Targets"][0], name
        assert targets[0]["Properties"]["ScheduleExpression"] == expression
        assert targets[0]["Properties"].get("State", "ENABLED") == "ENABLED"


def test_the_rules_do_not_grow_with_the_reconciler_shards(cdk_synth: Any, tmp_path: Any) -> None:
    """At the most shards the rules are the default stack's (one bus holds 300 by default)."""
    from conftest import INFRA_TEST_CONTEXT

    from infra.app import build_app
    from lightmetrics.deployment.settings import MAX_RECONCILE_SHARDS

    assert cdk_synth.stack.config.settings.reconcile_shards == 1
    _, stack = build_app({**INFRA_TEST_CONTEXT, "reconcile_shards": MAX_RECONCILE_SHARDS}, outdir=str(tmp_path))
    assert stack.config.settings.reconcile_shards == MAX_RECONCILE_SHARDS
    from aws_cdk.assertions import Template

    many = Template.from_stack(stack).find_resources("AWS::Events::Rule")
    assert len(many) == len(resources(cdk_synth, "AWS::Events::Rule")) < 300


def test_the_batching_window_is_the_specs_and_the_cost_models(cdk_synth: Any) -> None:
    """One source: the event source mapping's window and batch size are the spec's, and the cost
    model's defaults are the same spec's; a spec with a window synthesizes it."""
    from aws_cdk import App, Stack
    from aws_cdk import aws_lambda as lambda_
    from aws_cdk import aws_sqs as sqs
    from aws_cdk.assertions import Template

    from infra.components.functions import sqs_event_source
    from lightmetrics.deployment.resource_types import FunctionSpec
    from lightmetrics.operator_tools.cost_workload import Assumptions

    ids = _function_ids(cdk_synth)
    mappings = [m["Properties"] for m in resources(cdk_synth, "AWS::Lambda::EventSourceMapping").values()]
    for fn in (f for f in SPEC.functions if f.trigger_kind == "queue"):
        (props,) = [p for p in mappings if ids[fn.name] in str(render(p["FunctionName"]))]
        assert props.get("MaximumBatchingWindowInSeconds", 0) == fn.batching_window_s, fn.name
    indexer = next(f for f in SPEC.functions if f.name == "index-accepted")
    a = Assumptions()
    assert (a.sqs_batching_window_s, a.sqs_max_batch_size) == (indexer.batching_window_s, indexer.batch_size)

    stack = Stack(App(), "Windowed")
    spec = FunctionSpec("w", "functions.w", trigger="queue:q", batch_size=200, batching_window_s=20)
    function = lambda_.Function(stack, "W", runtime=lambda_.Runtime.PYTHON_3_12, handler="w.handler",
                                code=lambda_.Code.from_inline("def handler(e, c): pass"))
    function.add_event_source(sqs_event_source(sqs.Queue(stack, "Q"), spec))
    Template.from_stack(stack).has_resource_properties(
        "AWS::Lambda::EventSourceMapping", {"BatchSize": 200, "MaximumBatchingWindowInSeconds": 20})
    for bad in ({"batching_window_s": 301}, {"batch_size": 11}, {"batch_size": 10_001, "batching_window_s": 1}):
        with pytest.raises(ValueError, match="batching window"):
            FunctionSpec("w", "functions.w", trigger="queue:q", **bad)  # type: ignore[arg-type]
