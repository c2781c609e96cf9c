"""Security of the synthesized stack (docs/deploy.md), read from the template — moto
does not evaluate policies. tests/test_infra.py asserts the bucket policy and each role's exact
grants; this file adds template-wide properties that hold whatever the spec says: the protocol.s
literal prefix list is covered, no role anywhere can delete a permanent record or reconfigure
the bucket, nothing is granted by wildcard, and no function's environment carries key material.
"""

from __future__ import annotations

import json
import re
from typing import Any

from test_infra import BUCKET, NS, as_list, logical_id, render, resources

#: Every prefix of docs/protocol.md §3, typed by hand (not from the codec).
LAYOUT_PREFIXES = [
    "raw-blobs/v1/", "raw-blobs-by-time/v1/", "accepted/v1/", "accepted-by-time/v1/", "accepted-by-blob/v1/",
    "quarantine/v1/", "quarantine-by-blob/v1/", "manifests/v1/", "rollup/v1/", "index/v1/", "retention/v1/",
    "conflict-resolutions/v1/", "audit/v1/",
]
PERMANENT = ["accepted/v1/", "quarantine/v1/", "conflict-resolutions/v1/", "retention/v1/"]
#: Allowed with Resource "*" because AWS offers no narrower resource for them (X-Ray, CloudWatch
#: metric reads, and the vended log delivery a state machine's logging needs).
STAR_RESOURCE_ACTIONS = {"xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules",
                         "xray:GetSamplingTargets", "cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics",
                         "cloudwatch:PutMetricData", "logs:CreateLogDelivery", "logs:DeleteLogDelivery",
                         "logs:DescribeLogGroups", "logs:DescribeResourcePolicies", "logs:GetLogDelivery",
                         "logs:ListLogDeliveries", "logs:PutResourcePolicy", "logs:UpdateLogDelivery"}
BUCKET_CONFIG_ACTIONS = {"s3:PutBucketPolicy", "s3:DeleteBucketPolicy", "s3:PutLifecycleConfiguration",
                         "s3:PutBucketVersioning", "s3:PutBucketObjectLockConfiguration", "s3:PutBucketAcl",
                         "s3:PutObjectAcl", "s3:PutBucketPublicAccessBlock", "s3:PutEncryptionConfiguration",
                         "s3:DeleteBucket", "s3:PutInventoryConfiguration"}


def _statements(synth: Any) -> list[tuple[str, list[str], dict[str, Any]]]:
    """Every IAM statement in the template: (policy logical id, attached role ids, rendered statement)."""
    out = []
    for pid, pol in resources(synth, "AWS::IAM::Policy").items():
        roles = [render(r) for r in pol["Properties"].get("Roles", [])]
        for st in pol["Properties"]["PolicyDocument"]["Statement"]:
            out.append((pid, roles, render(st)))
    for rid, role in resources(synth, "AWS::IAM::Role").items():
        for inline in role["Properties"].get("Policies", []):
            for st in inline["PolicyDocument"]["Statement"]:
                out.append((rid, [f"<{rid}>"], render(st)))
    return out


def test_put_without_if_none_match_is_denied_under_every_prefix_of_the_layout(cdk_synth: Any) -> None:
    (policy,) = [v for v in resources(cdk_synth, "AWS::S3::BucketPolicy").values()
                 if v["Properties"]["Bucket"] == {"Ref": "AuthorityBucket"}]
    statements = [render(s) for s in policy["Properties"]["PolicyDocument"]["Statement"]]
    covered = set()
    for st in statements:
        cond = st.get("Condition", {})
        if st["Effect"] == "Deny" and "s3:PutObject" in as_list(st["Action"]) and \
                cond.get("Null", {}).get("s3:if-none-match") == "true":
            covered |= {r for r in as_list(st["Resource"])}
    for prefix in LAYOUT_PREFIXES:
        assert f"{BUCKET}/{NS}{prefix}*" in covered, prefix
    copy_denied = {r for st in statements for r in as_list(st["Resource"])
                   if st.get("Condition", {}).get("Null", {}).get("s3:x-amz-copy-source") == "false"}
    assert {f"{BUCKET}/{NS}{p}*" for p in LAYOUT_PREFIXES} <= copy_denied


def test_no_role_may_delete_a_permanent_record_and_only_gc_deletes_blobs(cdk_synth: Any) -> None:
    gc_role = f"<{logical_id(cdk_synth, cdk_synth.stack.storage.gc_role)}>"
    deleters = []
    for pid, roles, st in _statements(cdk_synth):
        if st["Effect"] != "Allow":
            continue
        actions = as_list(st["Action"])
        if not any(a in ("s3:DeleteObject", "s3:DeleteObjectVersion", "s3:*", "*") for a in actions):
            continue
        for res in as_list(st["Resource"]):
            res = str(res)
            if not res.startswith(BUCKET):
                continue
            assert not any(res.startswith(f"{BUCKET}/{NS}{p}") for p in PERMANENT), (pid, res)
            assert res not in (f"{BUCKET}/*", f"{BUCKET}/{NS}*"), (pid, res)  # a whole-bucket delete
            if res.startswith(f"{BUCKET}/{NS}raw-blobs/v1/"):
                deleters.append((pid, roles))
    # (Empty until the GC function lands: then its role, and only its role, appears here.)
    assert all(roles == [gc_role] for _, roles in deleters), deleters


def test_no_wildcard_grants_and_no_bucket_reconfiguration(cdk_synth: Any) -> None:
    checked = 0
    for pid, _roles, st in _statements(cdk_synth):
        if st["Effect"] != "Allow":
            continue
        actions = as_list(st["Action"])
        for action in actions:
            checked += 1
            assert action != "*" and not action.endswith(":*"), (pid, action)
            assert action not in BUCKET_CONFIG_ACTIONS, (pid, action)
            if "*" in as_list(st["Resource"]):
                assert action in STAR_RESOURCE_ACTIONS, (pid, action)
    assert checked > 50


def test_no_function_environment_carries_key_material(cdk_synth: Any) -> None:
    fns = resources(cdk_synth, "AWS::Lambda::Function")
    assert fns
    secret_like = re.compile(r"[0-9a-f]{32,}|\"keys\"\s*:|BEGIN [A-Z ]*PRIVATE KEY")
    for fid, fn in fns.items():
        env = (fn["Properties"].get("Environment") or {}).get("Variables") or {}
        for name, value in env.items():
            text = json.dumps(render(value))
            assert not secret_like.search(text), (fid, name)
            assert not re.search(r"(SECRET|PASSWORD|TOKEN)(?!_ID)", name) or name.endswith("_S"), (fid, name)
