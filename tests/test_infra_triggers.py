"""Every function's trigger is wired as its spec says (queue mappings, schedules, the URL)."""

from __future__ import annotations

import json
from typing import Any

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
