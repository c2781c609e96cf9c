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
    assert len(by_function) == len(queue_fns)
    for fn in queue_fns:
        props = next(p for name, p in by_function.items() if ids[fn.name] in str(name))
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"], fn.name
        assert props["BatchSize"] == fn.batch_size


def test_scheduled_functions_have_rules(cdk_synth: Any) -> None:
    ids = _function_ids(cdk_synth)
    rules = list(resources(cdk_synth, "AWS::Events::Rule").values())
    scheduled = {f.name: f.trigger_arg for f in SPEC.functions if f.trigger_kind == "schedule"}
    assert set(scheduled) >= {"reconcile", "sweep-dlq"}
    shards = cdk_synth.stack.config.settings.reconcile_shards
    for name, expression in scheduled.items():
        targets = [r for r in rules if ids[name] in str(r["Properties"].get("Targets"))]
        # one rule per reconciler shard, each with its input {"shard": i} (protocol §12 R8)
        inputs = [json.loads(t["Properties"]["Targets"][0]["Input"]) if "Input" in t["Properties"]["Targets"][0]
                  else None for t in targets]
        assert sorted(inputs, key=str) == SPEC.function(name).schedule_inputs(shards), name
        for target in targets:
            assert target["Properties"]["ScheduleExpression"] == expression
            assert target["Properties"].get("State", "ENABLED") == "ENABLED"


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
