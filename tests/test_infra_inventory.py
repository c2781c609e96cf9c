"""Issue 26: the walk is the bootstrap and the fallback. One setting (infra/config.py ``inventory``)
decides the S3 Inventory configuration, the audit's schedule and the walk's: with an inventory the
weekly audit moves every watermark and no walk is scheduled; without one the audit has nothing to
read and the walk runs weekly. Both synths are checked against ``schedules.scheduled`` and the
keep-up model's rule count (one source for the schedules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import INFRA_TEST_CONTEXT

from lightmetrics.deployment.resources import PIPELINE_SCHEDULES, SPEC
from lightmetrics.operator_tools.keepup import eventbridge_rules
from lightmetrics.operator_tools.schedules import schedule_input
from lightmetrics.reaps.params import ReapParams


def _templates(stack: Any) -> list[dict[str, Any]]:
    from aws_cdk.assertions import Template

    return [Template.from_stack(s).to_json() for s in (stack, stack.pipeline)]  # the pipeline is a nested stack


def _of(templates: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r["Properties"] for t in templates for r in t["Resources"].values() if r["Type"] == kind]


def _schedules(stack: Any) -> dict[str, str]:
    """What each enabled schedule starts -> its expression: a state machine's name or a pipeline job."""
    templates = _templates(stack)
    walk = stack.state_machines.built["bootstrap-walk"]
    walk_id = stack.get_logical_id(walk.machine.node.default_child)
    out: dict[str, str] = {}
    for rule in _of(templates, "AWS::Events::Rule"):
        if "ScheduleExpression" not in rule or rule.get("State") != "ENABLED":
            continue
        (target,) = rule["Targets"]
        given = json.loads(target.get("Input", "{}"))
        name = given.get("job") or given.get("mode") or ("bootstrap-walk" if walk_id in json.dumps(target["Arn"])
                                                        else json.dumps(target["Arn"]))
        out[name] = rule["ScheduleExpression"]
    return out


def test_with_an_inventory_the_audit_runs_weekly_and_the_walk_is_not_scheduled(cdk_synth: Any) -> None:
    stack = cdk_synth.stack
    assert stack.config.inventory is True  # the default
    (bucket,) = [b for b in _of(_templates(stack), "AWS::S3::Bucket") if b.get("VersioningConfiguration")]
    (inventory,) = bucket["InventoryConfigurations"]
    assert inventory["ScheduleFrequency"] == "Weekly"
    found = _schedules(stack)
    assert "bootstrap-walk" not in found and stack.state_machines.built["bootstrap-walk"].rule is None
    assert found["audit"] == PIPELINE_SCHEDULES["audit"][0] and found["rollup"] == PIPELINE_SCHEDULES["rollup"][0]
    rules = [r for r in _of(_templates(stack), "AWS::Events::Rule") if "ScheduleExpression" in r]
    assert len(rules) == eventbridge_rules(inventory=True)


def test_without_an_inventory_the_walk_runs_weekly_and_the_audit_is_not_scheduled(cdk_synth: Any, tmp_path: Path) -> None:
    from infra.app import build_app  # importable once cdk_synth put the repo root on sys.path

    _, stack = build_app({**INFRA_TEST_CONTEXT, "inventory": False}, outdir=str(tmp_path))
    templates = _templates(stack)
    assert stack.config.inventory is False
    assert [b for b in _of(templates, "AWS::S3::Bucket") if b.get("InventoryConfigurations")] == []
    found = _schedules(stack)
    walk = SPEC.state_machine("bootstrap-walk")
    assert found["bootstrap-walk"] == walk.schedule == "cron(0 3 ? * SUN *)"  # weekly, Sunday 03:00 UTC
    (rule,) = [r for r in _of(templates, "AWS::Events::Rule") if r.get("ScheduleExpression") == walk.schedule]
    assert json.loads(rule["Targets"][0]["Input"]) == json.loads(walk.schedule_input or "")
    assert "audit" not in found and found["rollup"] == PIPELINE_SCHEDULES["rollup"][0]
    rules = [r for r in _of(templates, "AWS::Events::Rule") if "ScheduleExpression" in r]
    assert len(rules) == eventbridge_rules(inventory=False)
    # No audit runs, so the daily GC takes its candidates from raw-blobs-by-time (rule G-B1), not
    # from "the latest audit" (which would never exist there: orphans never collected).
    gc_inputs = [json.loads(r["Targets"][0]["Input"]) for r in rules if r.get("State") == "ENABLED"
                 and json.loads(r["Targets"][0].get("Input", "{}")).get("mode") == "gc"]
    assert [(i["source"], "audit_run" in i) for i in gc_inputs] == [("by-time", False)]
    assert ReapParams.parse(gc_inputs[0]).source == "by-time"


def test_the_scheduled_gc_reads_the_audit_only_where_one_runs() -> None:
    reap = SPEC.state_machine("reap")
    with_inventory = json.loads(schedule_input(reap, inventory=True) or "")
    without = json.loads(schedule_input(reap, inventory=False) or "")
    assert (with_inventory["source"], with_inventory["audit_run"]) == ("audit", "latest")
    assert without["source"] == "by-time" and "audit_run" not in without
    # Everything else the same: a deletion is a deletion in both (dry_run stated, page budget)
    assert {k: v for k, v in without.items() if k != "source"} == \
        {k: v for k, v in with_inventory.items() if k not in ("source", "audit_run")}
    for walk_inventory in (True, False):
        walk = SPEC.state_machine("bootstrap-walk")
        assert schedule_input(walk, inventory=walk_inventory) == walk.schedule_input
