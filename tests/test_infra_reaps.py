"""CDK assertions for issue 6 (reaps), read from the session's one synth (``cdk_synth``).

* No role in the template can delete under ``accepted/v1/``, ``quarantine/v1/``,
  ``conflict-resolutions/v1/`` or ``retention/v1/``: checked against every IAM policy (any Allow
  whose action and resource pattern would cover a key there) and against the bucket policy (an
  unconditional Deny for everyone).
* The GC role is the only role allowed to delete under ``raw-blobs/v1/`` (versions included); the
  retention role deletes derived prefixes only.
* The reap state machine's schedules: daily GC with an explicit ``dry_run``; retention disabled.
* The GcRestored alarm reads the metric lightmetrics.reaps.gc emits.
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

from test_infra import BUCKET, NS, as_list, logical_id, render, resources

from lightmetrics.deployment.resources import SPEC

PROTECTED = ("accepted/v1/", "quarantine/v1/", "conflict-resolutions/v1/", "retention/v1/")
DERIVED = ("accepted-by-time/v1/", "accepted-by-blob/v1/", "raw-blobs-by-time/v1/", "quarantine-by-blob/v1/",
           "rollup/v1/", "index/v1/", "manifests/v1/")
DELETE_ACTIONS = ("s3:DeleteObject", "s3:DeleteObjectVersion")


def _covers(pattern: str, action: str) -> bool:
    return fnmatch.fnmatchcase(action, pattern) or fnmatch.fnmatchcase(action.lower(), pattern.lower())


def delete_grants(synth: Any) -> list[tuple[str, str, str]]:
    """(role logical id, action, resource pattern) of every Allow that can delete objects."""
    out = []
    for p in resources(synth, "AWS::IAM::Policy").values():
        roles = [r["Ref"] for r in p["Properties"]["Roles"]]
        for st in p["Properties"]["PolicyDocument"]["Statement"]:
            if st["Effect"] != "Allow":
                continue
            for action in as_list(st["Action"]):
                if any(_covers(action, d) for d in DELETE_ACTIONS):
                    for res in as_list(render(st["Resource"])):
                        out += [(role, action, str(res)) for role in roles]
    return out


def can_delete_under(resource: str, prefix: str) -> bool:
    sample = f"{BUCKET}/{NS}{prefix}some/key.json"
    return fnmatch.fnmatchcase(sample, resource)


def test_no_role_can_delete_acceptance_records_evidence_resolutions_or_retention_markers(cdk_synth: Any) -> None:
    grants = delete_grants(cdk_synth)
    assert grants, "the reap roles delete something: the check must see them"
    offending = [(role, action, res, prefix) for role, action, res in grants for prefix in PROTECTED
                 if can_delete_under(res, prefix)]
    assert offending == []
    # ... and the bucket policy denies it to everyone, unconditionally (versions included).
    (policy,) = [v for v in resources(cdk_synth, "AWS::S3::BucketPolicy").values()
                 if v["Properties"]["Bucket"] == {"Ref": "AuthorityBucket"}]
    denies = [render(st) for st in policy["Properties"]["PolicyDocument"]["Statement"]
              if st["Effect"] == "Deny" and "Condition" not in st]
    for prefix in PROTECTED:
        assert any(set(DELETE_ACTIONS) <= set(as_list(st["Action"])) and st["Principal"] == {"AWS": "*"}
                   and any(can_delete_under(r, prefix) for r in as_list(st["Resource"])) for st in denies), prefix


def test_only_the_gc_role_deletes_raw_blobs_and_retention_deletes_derived_only(cdk_synth: Any) -> None:
    gc_role = logical_id(cdk_synth, cdk_synth.stack.storage.gc_role)
    grants = delete_grants(cdk_synth)
    raw = {(role, action) for role, action, res in grants if can_delete_under(res, "raw-blobs/v1/")}
    assert raw == {(gc_role, "s3:DeleteObject"), (gc_role, "s3:DeleteObjectVersion")}
    gc_fn = cdk_synth.stack.functions.built["reap-gc"]
    assert logical_id(cdk_synth, gc_fn.role) == gc_role and gc_fn.spec.gc_role
    retention = logical_id(cdk_synth, cdk_synth.stack.functions.built["reap-retention"].role)
    retention_resources = {res for role, _, res in grants if role == retention}
    assert retention_resources == {f"{BUCKET}/{NS}{p}*" for p in ("accepted-by-time/v1/", "accepted-by-blob/v1/",
                                                                  "rollup/v1/", "index/v1/", "manifests/v1/")}
    assert all(any(can_delete_under(res, p) for p in DERIVED) for res in retention_resources)
    # ... by a delete marker each: retention never deletes a version (issue 28: the grant went unused)
    assert {action for role, action, _ in grants if role == retention} == {"s3:DeleteObject"}
    # Nobody else deletes anything.
    assert {role for role, _, _ in grants} == {gc_role, retention}


def test_reap_schedules_state_dry_run_and_retention_is_off(cdk_synth: Any) -> None:
    reap = cdk_synth.stack.state_machines.built["reap"]
    sm_id = logical_id(cdk_synth, reap.machine)
    rules = [r["Properties"] for r in resources(cdk_synth, "AWS::Events::Rule").values()
             if any(render(t["Arn"]) == f"<{sm_id}>" for t in r["Properties"]["Targets"])]
    by_state = {r["State"]: r for r in rules}
    assert set(by_state) == {"ENABLED", "DISABLED"} and len(rules) == 2
    gc_input = json.loads(by_state["ENABLED"]["Targets"][0]["Input"])
    assert gc_input["mode"] == "gc" and gc_input["dry_run"] is False
    assert by_state["ENABLED"]["ScheduleExpression"] == "cron(0 4 * * ? *)"  # daily
    retention_input = json.loads(by_state["DISABLED"]["Targets"][0]["Input"])
    assert retention_input["mode"] == "retention" and "dry_run" in retention_input


def test_gc_restored_alarm_reads_the_metric_gc_emits(cdk_synth: Any) -> None:
    from pathlib import Path

    alarms = {render(a["Properties"]["AlarmName"]): a["Properties"]
              for a in resources(cdk_synth, "AWS::CloudWatch::Alarm").values()}
    restored = alarms["Lightmetrics-ReapGcGcRestored"]
    assert (restored["MetricName"], restored["Namespace"]) == ("GcRestored", "Lightmetrics")
    assert restored["Dimensions"] == [{"Name": "service", "Value": SPEC.function("reap-gc").service}]
    assert "Lightmetrics-ReapExecutionsFailed" in alarms
    gc_source = (Path(__file__).parents[1] / "shared" / "lightmetrics" / "reaps" / "gc.py").read_text()
    assert 'name="GcRestored"' in gc_source
