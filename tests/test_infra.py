"""The CDK app: synthesized once per session (``cdk_synth`` in conftest.py) and asserted by content.

Expectations are derived independently of the stack code: from the resource spec's declarative
fields, from the key codec's prefixes and from the protocol's literal lists (docs/protocol.md), never by calling the
stack's own derivation. One more test runs the real ``cdk synth`` CLI (Node) with no AWS
account and no Docker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lightmetrics.deployment.resource_types import LAYOUT_PREFIXES, FunctionSpec  # noqa: E402
from lightmetrics.deployment.resources import SPEC  # noqa: E402
from lightmetrics.deployment.settings import Settings  # noqa: E402
from lightmetrics.local import provision  # noqa: E402
from lightmetrics.operator_tools.schedules import scheduled  # noqa: E402
from lightmetrics.protocol.keys import PREFIXES  # noqa: E402

NS = "lm-test/"  # conftest.INFRA_TEST_CONTEXT["prefix"]
BUCKET = f"<{SPEC.bucket.logical_name}.Arn>"
TABLE = f"<{SPEC.table.logical_name}.Arn>"
SECRET_ARN = (
    "arn:<AWS::Partition>:secretsmanager:<AWS::Region>:<AWS::AccountId>:secret:"
    f"{SPEC.secret.default_name}-??????"
)
CDK_CLI = ROOT / ".cdk-cli" / "node_modules" / ".bin" / "cdk"


# --------------------------------------------------------------------------- helpers


def render(value: Any) -> Any:
    """CloudFormation intrinsics -> readable strings: GetAtt -> <Id.Attr>, Ref -> <Id>, Join joined."""
    if isinstance(value, dict) and len(value) == 1:
        (k, v), = value.items()
        if k == "Fn::GetAtt":
            return f"<{v[0]}.{v[1]}>"
        if k == "Ref":
            return f"<{v}>"
        if k == "Fn::Join":
            return v[0].join(str(render(p)) for p in v[1])
    if isinstance(value, dict):
        return {k: render(v) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v) for v in value]
    return value


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def resources(synth: Any, rtype: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in synth.json["Resources"].items() if v["Type"] == rtype}


def logical_id(synth: Any, construct: Any) -> str:
    return str(synth.stack.resolve(construct.node.default_child.logical_id))


def obj(prefix: str) -> str:
    return f"{BUCKET}/{NS}{prefix}*"


def grants_of(policy_doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    """Allow statements flattened to (action, resource, condition-json)."""
    out = set()
    for st in policy_doc["Statement"]:
        assert st["Effect"] == "Allow"
        cond = json.dumps(_sorted_lists(render(st.get("Condition", {}))), sort_keys=True)
        for action in as_list(st["Action"]):
            for res in as_list(render(st["Resource"])):
                out.add((action, res, cond))
    return out


def _sorted_lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted_lists(v) for k, v in value.items()}
    if isinstance(value, list):
        return sorted(_sorted_lists(v) for v in value)
    return value


def g(action: str, resource: str, condition: dict[str, Any] | None = None) -> tuple[str, str, str]:
    return (action, resource, json.dumps(_sorted_lists(condition or {}), sort_keys=True))


def expected_grants(fn: FunctionSpec, log_group: str, queue_ids: dict[str, str]) -> set[tuple[str, str, str]]:
    """The exact grant set a function's declarative fields call for (independent of infra/)."""
    want = {
        g("xray:PutTraceSegments", "*"),
        g("xray:PutTelemetryRecords", "*"),
        g("logs:CreateLogStream", f"<{log_group}.Arn>"),
        g("logs:PutLogEvents", f"<{log_group}.Arn>"),
    }
    want |= {g("s3:GetObject", obj(p)) for p in fn.s3_read}
    want |= {g("s3:PutObject", obj(p)) for p in fn.s3_write}
    want |= {g("s3:DeleteObject", obj(p)) for p in fn.s3_delete}
    want |= {g("s3:DeleteObjectVersion", obj(p)) for p in fn.s3_delete_versions}
    if fn.s3_list:
        want.add(g("s3:ListBucket", BUCKET, {"StringLike": {"s3:prefix": [NS + p + "*" for p in fn.s3_list]}}))
    if fn.gc_role:  # GC's crash recovery, unrecorded markers and restores list one blob key's versions
        want.add(g("s3:ListBucketVersions", BUCKET, {"StringLike": {"s3:prefix": [NS + "raw-blobs/v1/*"]}}))
    table_actions = {
        "none": [],
        "read": ["GetItem", "Query"],
        "write": ["GetItem", "Query", *fn.table_writes],
    }[fn.table]
    want |= {g(f"dynamodb:{a}", TABLE) for a in table_actions}
    if fn.reads_secret:
        want.add(g("secretsmanager:GetSecretValue", SECRET_ARN))
    consume = ("ReceiveMessage", "DeleteMessage", "ChangeMessageVisibility", "GetQueueAttributes")
    want |= {g(f"sqs:{a}", f"<{queue_ids[q]}.Arn>") for q in fn.sqs_consume for a in consume}
    want |= {g("sqs:GetQueueAttributes", f"<{queue_ids[q]}.Arn>") for q in fn.sqs_read_attributes}
    triggers = ([fn.trigger_arg] if fn.trigger_kind == "queue" else []) + ([fn.shard_queue] if fn.shard_queue else [])
    for trigger in triggers:  # granted by the SQS event source
        q = f"<{queue_ids[trigger]}.Arn>"
        want |= {g(f"sqs:{a}", q) for a in (*consume, "GetQueueUrl")}
    if fn.shard_queue:  # the fan-out sends a message per shard
        want.add(g("sqs:SendMessage", f"<{queue_ids[fn.shard_queue]}.Arn>"))
    if fn.cloudwatch_read:
        want |= {g("cloudwatch:GetMetricData", "*"), g("cloudwatch:GetMetricStatistics", "*")}
    want |= {g("states:StartExecution", sm_arn(SPEC.state_machine(n).logical_name)) for n in fn.sfn_start}
    return want


def sm_arn(logical_name: str) -> str:
    """A state machine's ARN as the template spells it (built from its physical name)."""
    return f"arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:stateMachine:Lightmetrics-{logical_name}"


def queue_ids(synth: Any) -> dict[str, str]:
    ids = {}
    for built in synth.stack.queues.built:
        ids[built.spec.name] = logical_id(synth, built.queue)
        ids[built.spec.dlq_name] = logical_id(synth, built.dlq)
    for name, queue in synth.stack.shard_queues.by_name.items():
        ids[name] = logical_id(synth, queue)
    return ids


# --------------------------------------------------------------------------- spec and config (no synth)


def test_layout_prefixes_are_the_codecs() -> None:
    assert set(LAYOUT_PREFIXES) == set(PREFIXES.values())
    assert len(LAYOUT_PREFIXES) == len(set(LAYOUT_PREFIXES))


def test_function_spec_validation() -> None:
    with pytest.raises(ValueError, match="trigger"):
        FunctionSpec("x", "m", trigger="cron")
    with pytest.raises(ValueError, match="needs"):
        FunctionSpec("x", "m", trigger="queue:")
    with pytest.raises(ValueError, match="not layout prefixes"):
        FunctionSpec("x", "m", s3_read=("nope/",))
    with pytest.raises(ValueError, match="nothing may delete"):
        FunctionSpec("x", "m", s3_delete=("accepted/v1/",), gc_role=True)
    with pytest.raises(ValueError, match="only the GC role"):
        FunctionSpec("x", "m", s3_delete=("raw-blobs/v1/",))
    fn = FunctionSpec("x", "m", trigger="schedule:rate(5 minutes)", metrics_service="x-svc")
    assert (fn.trigger_kind, fn.trigger_arg, fn.service) == ("schedule", "rate(5 minutes)", "x-svc")
    assert FunctionSpec("legacy", "functions.legacy").trigger_kind == "task"  # old call shape still works


def test_state_machine_spec_validation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightmetrics.deployment.resource_types import ResourceSpec, StateMachineSpec
    from lightmetrics.operator_tools.statemachines import DEFINITIONS_ENV, DefinitionError, render_definition

    task = FunctionSpec("t", "m")
    with pytest.raises(ValueError, match=".asl.json"):
        StateMachineSpec("x", "X", "x.json")
    with pytest.raises(ValueError, match="unknown function"):
        ResourceSpec(functions=(task,), state_machines=(StateMachineSpec("x", "X", "x.asl.json", (("T", "nope"),)),))
    with pytest.raises(ValueError, match="trigger 'task'"):
        ResourceSpec(functions=(FunctionSpec("h", "m", trigger="http"),),
                     state_machines=(StateMachineSpec("x", "X", "x.asl.json", (("T", "h"),)),))
    with pytest.raises(ValueError, match="unknown state machines"):
        ResourceSpec(functions=(FunctionSpec("t", "m", sfn_start=("nope",)),))
    # The file's placeholders must be exactly the spec's: a typo fails synth and local provisioning.
    (tmp_path / "x.asl.json").write_text('{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "${Typo}", "End": true}}}')
    monkeypatch.setenv(DEFINITIONS_ENV, str(tmp_path))
    with pytest.raises(DefinitionError, match="Typo"):
        render_definition(StateMachineSpec("x", "X", "x.asl.json", (("T", "t"),)), lambda fn: fn)
    text = render_definition(StateMachineSpec("x", "X", "x.asl.json", (("Typo", "t"),)), lambda fn: f"arn:{fn}")
    assert json.loads(text)["States"]["A"]["Resource"] == "arn:t"


def test_makefile_builds_the_layer_for_the_stacks_architecture() -> None:
    from infra.components.layer import ARCH_NAME

    makefile = (ROOT / "Makefile").read_text()
    arch = re.search(r"^LAYER_ARCH\s*:=\s*(\S+)", makefile, re.M)
    platform = re.search(r"^LAYER_PLATFORM\s*:=\s*(\S+)", makefile, re.M)
    assert arch and platform and arch.group(1) == ARCH_NAME
    assert platform.group(1) == {"arm64": "manylinux2014_aarch64", "x86_64": "manylinux2014_x86_64"}[ARCH_NAME]
    assert re.search(r"^test:.*\blayer\b.*\bcdk-cli\b", makefile, re.M)


def test_synth_fails_clearly_without_a_layer(tmp_path: Path) -> None:
    from infra.components.layer import LayerMissingError, check_layer_dir

    with pytest.raises(LayerMissingError, match=r"run `make layer`"):
        check_layer_dir(tmp_path / "nothing")
    (tmp_path / "python" / "lightmetrics").mkdir(parents=True)
    (tmp_path / "ARCH").write_text("x86_64\n")
    with pytest.raises(LayerMissingError, match="built for 'x86_64'"):
        check_layer_dir(tmp_path)
    (tmp_path / "ARCH").write_text("arm64\n")
    with pytest.raises(LayerMissingError, match="stale"):
        check_layer_dir(tmp_path)


def test_context_validation() -> None:
    from infra.config import InfraConfig, InfraConfigError, cdk_json_context

    ctx = cdk_json_context()
    assert InfraConfig.from_context(ctx).settings.max_frame_bytes == 4194304
    with pytest.raises(InfraConfigError, match="max_frame_bytes"):
        InfraConfig.from_context({**ctx, "max_frame_bytes": 6 * 1024 * 1024})
    with pytest.raises(InfraConfigError, match="gc_grace_s"):
        InfraConfig.from_context({**ctx, "gc_grace_s": 60})
    with pytest.raises(InfraConfigError, match="prefix"):
        InfraConfig.from_context({**ctx, "prefix": "no-slash"})
    # inventory: a JSON bool from cdk.json, a string from `-c inventory=false`; default on
    assert InfraConfig.from_context(ctx).inventory is True
    assert [InfraConfig.from_context({**ctx, "inventory": v}).inventory for v in (False, "false", "TRUE")] == [
        False, False, True]
    with pytest.raises(InfraConfigError, match="'inventory' must be true or false"):
        InfraConfig.from_context({**ctx, "inventory": "no"})


# --------------------------------------------------------------------------- template: what exists


def test_template_inventory(cdk_synth: Any) -> None:
    t = cdk_synth.template
    t.resource_count_is("AWS::S3::Bucket", 2)  # authority + ops (inventory, access logs)
    t.resource_count_is("AWS::DynamoDB::Table", 1)
    t.resource_count_is("AWS::Lambda::LayerVersion", 1)
    t.resource_count_is("AWS::SQS::Queue", 2 * (len(SPEC.queues) + len(SPEC.shard_queues)))
    t.resource_count_is("AWS::Lambda::Url", sum(f.trigger_kind == "http" for f in SPEC.functions))
    t.resource_count_is("AWS::CloudWatch::Dashboard", 1)
    t.resource_count_is("AWS::SNS::Topic", 1)
    t.resource_count_is("AWS::S3::MultiRegionAccessPoint", 0)
    handler = 1 if SPEC.queues else 0  # CDK's bucket-notifications custom resource
    t.resource_count_is("AWS::Lambda::Function", len(SPEC.functions) + handler)
    assert "ReplicationConfiguration" not in cdk_synth.json["Resources"]["AuthorityBucket"]["Properties"]
    outputs = set(cdk_synth.json["Outputs"])
    assert {"BucketName", "Prefix", "TableName", "SecretName", "GcRoleArn", "AlarmTopicArn", "IngestUrl"} <= outputs
    # Everything `lmctl env --stack` reads back is an output (issue 17): every queue URL, every state machine.
    from lightmetrics.operator_tools.stack_outputs import settings_from_outputs

    settings = settings_from_outputs({k: "x" for k in outputs})
    assert set(json.loads(settings["LM_QUEUE_URLS"])) == {n for q in SPEC.queues for n in (q.name, q.dlq_name)}


def test_authority_bucket(cdk_synth: Any) -> None:
    b = cdk_synth.json["Resources"]["AuthorityBucket"]
    assert b["DeletionPolicy"] == b["UpdateReplacePolicy"] == "Retain"
    p = b["Properties"]
    assert p["VersioningConfiguration"] == {"Status": "Enabled"}
    assert p["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert p["BucketEncryption"] == {
        "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
    }
    assert p["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    assert render(p["LoggingConfiguration"]) == {
        "DestinationBucketName": "<OpsBucket>",
        "LogFilePrefix": "access-logs/authority/",
    }
    assert render(p["InventoryConfigurations"]) == [
        {
            "Id": "weekly-parquet",
            "Enabled": True,
            "ScheduleFrequency": "Weekly",
            "IncludedObjectVersions": "All",
            "Prefix": NS,
            "OptionalFields": ["Size", "LastModifiedDate", "ETag", "StorageClass", "IsMultipartUploaded", "ChecksumAlgorithm"],
            "Destination": {"BucketArn": "<OpsBucket.Arn>", "Format": "Parquet", "Prefix": "inventory"},
        }
    ]


def test_ops_bucket_only_takes_inventory_and_access_logs_from_the_authority(cdk_synth: Any) -> None:
    ops = cdk_synth.json["Resources"]["OpsBucket"]
    assert ops["DeletionPolicy"] == "Retain"
    assert ops["Properties"]["PublicAccessBlockConfiguration"]["RestrictPublicBuckets"] is True
    (policy,) = [
        v for v in resources(cdk_synth, "AWS::S3::BucketPolicy").values()
        if v["Properties"]["Bucket"] == {"Ref": "OpsBucket"}
    ]  # fmt: skip
    allows = [render(s) for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    assert sorted(s["Principal"]["Service"] for s in allows) == ["logging.s3.amazonaws.com", "s3.amazonaws.com"]
    for s in allows:
        assert s["Action"] == "s3:PutObject"
        assert s["Condition"]["ArnLike"] == {"aws:SourceArn": f"{BUCKET}"}


def test_lifecycle_rules_only_abort_multipart_and_expire_derived_noncurrent(cdk_synth: Any) -> None:
    rules = cdk_synth.json["Resources"]["AuthorityBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    derived = [
        "raw-blobs-by-time/v1/",
        "accepted-by-time/v1/",
        "accepted-by-blob/v1/",
        "quarantine-by-blob/v1/",
        "manifests/v1/",
        "rollup/v1/",
        "index/v1/",
    ]
    expected = [{"Id": "AbortIncompleteMultipartUploads", "Status": "Enabled",
                 "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}]
    expected += [
        {
            "Id": "ExpireNoncurrent-" + p.rstrip("/").replace("/", "-"),
            "Status": "Enabled",
            "Prefix": NS + p,
            "NoncurrentVersionExpiration": {"NoncurrentDays": 30},
            "ExpiredObjectDeleteMarker": True,
        }
        for p in derived
    ]
    assert rules == expected
    for rule in rules:  # never a current-version expiration, never a protected prefix
        assert "ExpirationInDays" not in rule and "Transitions" not in rule
        assert not any(rule.get("Prefix", "").startswith(NS + p) for p in
                       ("accepted/", "quarantine/", "raw-blobs/", "retention/"))


def test_bucket_policy_every_statement_by_content(cdk_synth: Any) -> None:
    (policy,) = [
        v for v in resources(cdk_synth, "AWS::S3::BucketPolicy").values()
        if v["Properties"]["Bucket"] == {"Ref": "AuthorityBucket"}
    ]  # fmt: skip
    gc_role = logical_id(cdk_synth, cdk_synth.stack.storage.gc_role)
    everyone = {"AWS": "*"}
    layout = sorted(set(PREFIXES.values()))  # the codec's layout, docs/protocol.md §3
    objs = lambda prefixes: sorted(obj(p) for p in prefixes)  # noqa: E731
    expected = [
        {"Effect": "Deny", "Principal": everyone, "Action": ["s3:*"], "Resource": sorted([BUCKET, f"{BUCKET}/*"]),
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        {"Effect": "Deny", "Principal": everyone, "Action": ["s3:*"], "Resource": sorted([BUCKET, f"{BUCKET}/*"]),
         "Condition": {"NumericLessThan": {"s3:TlsVersion": 1.2}}},
        {"Sid": "DenyPutWithoutIfNoneMatch", "Effect": "Deny", "Principal": everyone, "Action": ["s3:PutObject"],
         "Resource": objs(p for p in layout if p != "raw-blobs/v1/"),
         "Condition": {"Null": {"s3:if-none-match": "true"}}},
        {"Sid": "DenyPutWithoutIfNoneMatchMultipartExempt", "Effect": "Deny", "Principal": everyone,
         "Action": ["s3:PutObject"], "Resource": objs(["raw-blobs/v1/"]),
         "Condition": {"Null": {"s3:if-none-match": "true"}, "Bool": {"s3:ObjectCreationOperation": "true"}}},
        {"Sid": "DenyMultipartUnderAccepted", "Effect": "Deny", "Principal": everyone, "Action": ["s3:PutObject"],
         "Resource": objs(["accepted/v1/"]), "Condition": {"Bool": {"s3:ObjectCreationOperation": "false"}}},
        {"Sid": "DenyCopyIntoLayout", "Effect": "Deny", "Principal": everyone, "Action": ["s3:PutObject"],
         "Resource": objs(layout), "Condition": {"Null": {"s3:x-amz-copy-source": "false"}}},
        {"Sid": "DenyDeletePermanentRecords", "Effect": "Deny", "Principal": everyone,
         "Action": ["s3:DeleteObject", "s3:DeleteObjectVersion"],
         "Resource": objs(["accepted/v1/", "quarantine/v1/", "conflict-resolutions/v1/", "retention/v1/"])},
        {"Sid": "DenyRawBlobDeleteExceptGcRole", "Effect": "Deny", "Principal": everyone,
         "Action": ["s3:DeleteObject", "s3:DeleteObjectVersion"], "Resource": objs(["raw-blobs/v1/"]),
         "Condition": {"ArnNotEquals": {"aws:PrincipalArn": f"<{gc_role}.Arn>"}}},
    ]  # fmt: skip

    def normal(st: dict[str, Any]) -> dict[str, Any]:
        st = render(st)
        st["Action"] = sorted(as_list(st["Action"]))
        st["Resource"] = sorted(as_list(st["Resource"]))
        return st

    actual = [normal(st) for st in policy["Properties"]["PolicyDocument"]["Statement"]]
    key = lambda st: json.dumps(st, sort_keys=True)  # noqa: E731
    assert sorted(actual, key=key) == sorted(expected, key=key)
    # No Allow in the bucket policy: access comes only from each function's own role.
    assert all(st["Effect"] == "Deny" for st in actual)


def test_gc_role_exists_and_is_the_only_raw_blob_deleter(cdk_synth: Any) -> None:
    role_id = logical_id(cdk_synth, cdk_synth.stack.storage.gc_role)
    role = cdk_synth.json["Resources"][role_id]["Properties"]
    assert role["AssumeRolePolicyDocument"]["Statement"] == [
        {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}}
    ]
    assert "ManagedPolicyArns" not in role and "Policies" not in role
    gc_fns = [f for f in SPEC.functions if f.gc_role]
    attached = [p for p in resources(cdk_synth, "AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]]
    assert len(attached) == (1 if gc_fns else 0)
    for fn in SPEC.functions:  # nobody else may hold a delete on raw blobs
        assert fn.gc_role or "raw-blobs/v1/" not in fn.s3_delete


def test_control_table(cdk_synth: Any) -> None:
    t = cdk_synth.json["Resources"]["ControlTable"]
    assert t["DeletionPolicy"] == t["UpdateReplacePolicy"] == "Retain"
    p = t["Properties"]
    assert p["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]
    assert p["KeySchema"] == SPEC.table.key_schema()
    assert p["AttributeDefinitions"] == SPEC.table.attribute_definitions()
    assert p["BillingMode"] == "PAY_PER_REQUEST"
    assert p["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert p["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert p["DeletionProtectionEnabled"] is True


def test_layer_and_functions(cdk_synth: Any) -> None:
    (layer_id, layer), = resources(cdk_synth, "AWS::Lambda::LayerVersion").items()
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.12"]
    assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]
    settings_vars = {Settings.env_name(f) for f in Settings.model_fields}
    for fn in SPEC.functions:
        built = cdk_synth.stack.functions.built[fn.name]
        p = cdk_synth.json["Resources"][logical_id(cdk_synth, built.function)]["Properties"]
        assert p["Runtime"] == "python3.12" and p["Architectures"] == ["arm64"]
        assert p["Handler"] == fn.handler_string
        assert p["Layers"] == [{"Ref": layer_id}]
        assert p["TracingConfig"] == {"Mode": "Active"}
        assert (p["Timeout"], p["MemorySize"]) == (fn.timeout_s, fn.memory_mb)
        lg = logical_id(cdk_synth, built.log_group)
        assert p["LoggingConfig"] == {"LogGroup": {"Ref": lg}}
        assert cdk_synth.json["Resources"][lg]["Properties"]["RetentionInDays"] == 30
        env = render(p["Environment"]["Variables"])
        wanted = settings_vars - ({"LM_INGEST_URL"} if fn.trigger_kind == "http" or not any(
            f.trigger_kind == "http" for f in SPEC.functions) else set())
        # the fan-out's function, and those that read the shards queue's depth (the admin API's status)
        told = fn.shard_queue or any(q.name in fn.sqs_read_attributes for q in SPEC.shard_queues)
        wanted -= set() if told else {"LM_RECONCILE_SHARDS_QUEUE_URL"}
        assert {k for k in env if k.startswith("LM_")} == wanted
        assert env["LM_BUCKET"] == "<AuthorityBucket>" and env["LM_TABLE"] == "<ControlTable>"
        assert env["LM_PREFIX"] == NS and env["LM_AUTH_SECRET_ID"] == SPEC.secret.default_name
        assert env["LM_INGEST_ACCEPTANCE"] == "s3_manifest" and env["LM_MAX_FRAME_BYTES"] == "4194304"
        assert env["POWERTOOLS_SERVICE_NAME"] == fn.service
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "Lightmetrics"
        urls = json.loads(re.sub(r"<[^>]+>", "url", env["LM_QUEUE_URLS"]))
        assert set(urls) == {q.name for q in SPEC.queues} | {q.dlq_name for q in SPEC.queues}


def test_function_code_asset_is_the_functions_package_and_small(cdk_synth: Any) -> None:
    assets = [d for d in Path(cdk_synth.outdir).glob("asset.*") if (d / "functions").is_dir()]
    assert len(assets) == 1
    files = [f for f in assets[0].rglob("*") if f.is_file()]
    assert all(f.relative_to(assets[0]).parts[0] == "functions" for f in files)
    assert not [f for f in files if "__pycache__" in f.parts or f.suffix == ".pyc"]
    for fn in SPEC.functions:
        assert (assets[0] / (fn.module.replace(".", "/") + ".py")).is_file()
    assert sum(f.stat().st_size for f in files) < 1_000_000


def test_ingest_function_url_and_reserved_concurrency(cdk_synth: Any) -> None:
    ingest = cdk_synth.stack.functions.built["ingest"]
    fn_id = logical_id(cdk_synth, ingest.function)
    (url,) = [u for u in resources(cdk_synth, "AWS::Lambda::Url").values()
              if render(u["Properties"]["TargetFunctionArn"]) == f"<{fn_id}.Arn>"]
    assert render(url["Properties"]) == {"AuthType": "NONE", "InvokeMode": "BUFFERED", "TargetFunctionArn": f"<{fn_id}.Arn>"}
    perms = [render(p["Properties"]) for p in resources(cdk_synth, "AWS::Lambda::Permission").values()
             if render(p["Properties"]["FunctionName"]) == f"<{fn_id}.Arn>"]
    assert {json.dumps(p, sort_keys=True) for p in perms} == {
        json.dumps({"Action": "lambda:InvokeFunctionUrl", "FunctionName": f"<{fn_id}.Arn>",
                    "FunctionUrlAuthType": "NONE", "Principal": "*"}, sort_keys=True),
        json.dumps({"Action": "lambda:InvokeFunction", "FunctionName": f"<{fn_id}.Arn>",
                    "InvokedViaFunctionUrl": True, "Principal": "*"}, sort_keys=True),
    }  # fmt: skip
    param = cdk_synth.json["Parameters"]["IngestReservedConcurrency"]
    assert param["Type"] == "Number" and param["Default"] == 50 and param["MinValue"] == -1
    props = cdk_synth.json["Resources"][fn_id]["Properties"]
    assert props["ReservedConcurrentExecutions"] == {
        "Fn::If": ["IngestReservedConcurrencyUnset", {"Ref": "AWS::NoValue"}, {"Ref": "IngestReservedConcurrency"}]
    }
    assert cdk_synth.json["Conditions"]["IngestReservedConcurrencyUnset"] == {
        "Fn::Equals": [{"Ref": "IngestReservedConcurrency"}, "-1"]
    }


# --------------------------------------------------------------------------- least privilege


def role_grants(synth: Any, role_id: str) -> set[tuple[str, str, str]]:
    role = synth.json["Resources"][role_id]["Properties"]
    assert "ManagedPolicyArns" not in role and "Policies" not in role, f"{role_id}: managed/inline policies"
    out: set[tuple[str, str, str]] = set()
    for p in resources(synth, "AWS::IAM::Policy").values():
        if {"Ref": role_id} in p["Properties"]["Roles"]:
            assert p["Properties"]["Roles"] == [{"Ref": role_id}], "a policy shared between roles"
            out |= grants_of(p["Properties"]["PolicyDocument"])
    return out


def test_iam_exact_sets_from_the_spec(cdk_synth: Any) -> None:
    ids = queue_ids(cdk_synth)
    by_role: dict[str, set[tuple[str, str, str]]] = {}
    for fn in SPEC.functions:
        built = cdk_synth.stack.functions.built[fn.name]
        role_id = logical_id(cdk_synth, built.role)
        by_role.setdefault(role_id, set()).update(expected_grants(fn, logical_id(cdk_synth, built.log_group), ids))
    for role_id, want in by_role.items():
        assert role_grants(cdk_synth, role_id) == want, role_id


def test_ingest_iam_is_exactly_the_documented_list(cdk_synth: Any) -> None:
    built = cdk_synth.stack.functions.built["ingest"]
    log_group = f"<{logical_id(cdk_synth, built.log_group)}.Arn>"
    prefixes = ["accepted/v1/*", "raw-blobs/v1/*", "conflict-resolutions/v1/*"]
    assert role_grants(cdk_synth, logical_id(cdk_synth, built.role)) == {
        g("s3:PutObject", f"{BUCKET}/{NS}raw-blobs/v1/*"),
        g("s3:PutObject", f"{BUCKET}/{NS}accepted/v1/*"),
        g("s3:PutObject", f"{BUCKET}/{NS}quarantine/v1/*"),
        g("s3:GetObject", f"{BUCKET}/{NS}accepted/v1/*"),
        g("s3:GetObject", f"{BUCKET}/{NS}raw-blobs/v1/*"),
        g("s3:GetObject", f"{BUCKET}/{NS}conflict-resolutions/v1/*"),
        g("s3:ListBucket", BUCKET, {"StringLike": {"s3:prefix": [NS + p for p in prefixes]}}),
        g("secretsmanager:GetSecretValue", SECRET_ARN),
        g("dynamodb:GetItem", TABLE),  # the denylist cache (one Query per LM_DENYLIST_TTL_S)
        g("dynamodb:Query", TABLE),
        g("xray:PutTraceSegments", "*"),
        g("xray:PutTelemetryRecords", "*"),
        g("logs:CreateLogStream", log_group),
        g("logs:PutLogEvents", log_group),
    }


def test_every_s3_arn_and_filter_is_inside_the_namespace(cdk_synth: Any) -> None:
    text = json.dumps(render(cdk_synth.json["Resources"]))
    for arn in re.findall(r"<AuthorityBucket\.Arn>/([^\"]*)", text):
        assert arn == "*" or arn.startswith(NS), arn
    for prefix in re.findall(r"\"s3:prefix\": \[([^\]]*)\]", text):
        assert all(p.strip(' "').startswith(NS) for p in prefix.split(",")), prefix
    for value in re.findall(r"\"Name\": \"prefix\", \"Value\": \"([^\"]*)\"", text):
        assert value.startswith(NS)


# --------------------------------------------------------------------------- queues, observability


def test_queues_dlqs_and_notifications_from_the_spec(cdk_synth: Any) -> None:
    ids = queue_ids(cdk_synth)
    res = cdk_synth.json["Resources"]
    for q in SPEC.queues:
        main, dlq = res[ids[q.name]]["Properties"], res[ids[q.dlq_name]]["Properties"]
        assert render(main["RedrivePolicy"]) == {"deadLetterTargetArn": f"<{ids[q.dlq_name]}.Arn>",
                                                 "maxReceiveCount": q.max_receive_count}
        assert main["VisibilityTimeout"] == q.visibility_timeout_s
        assert main["SqsManagedSseEnabled"] is True and dlq["SqsManagedSseEnabled"] is True
        assert "RedrivePolicy" not in dlq
    notifications = resources(cdk_synth, "Custom::S3BucketNotifications")
    if not SPEC.queues:
        assert notifications == {}
        return
    (n,) = notifications.values()
    assert render(n["Properties"]["BucketName"]) == "<AuthorityBucket>"
    got = sorted(json.dumps(render(c), sort_keys=True) for c in n["Properties"]["NotificationConfiguration"]["QueueConfigurations"])
    want = sorted(
        json.dumps({"Events": list(q.events), "QueueArn": f"<{ids[q.name]}.Arn>",
                    "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": NS + q.prefix}]}}}, sort_keys=True)
        for q in SPEC.queues
    )  # fmt: skip
    assert got == want


def _alarm_metrics(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    p = alarm["Properties"]
    if "Metrics" in p:
        return [m["MetricStat"]["Metric"] for m in p["Metrics"] if "MetricStat" in m]
    return [{"Namespace": p["Namespace"], "MetricName": p["MetricName"], "Dimensions": p.get("Dimensions", [])}]


def test_alarms_route_to_the_topic_and_read_the_handlers_metrics(cdk_synth: Any) -> None:
    alarms = {render(a["Properties"]["AlarmName"]): a for a in resources(cdk_synth, "AWS::CloudWatch::Alarm").values()}
    (topic_id,) = resources(cdk_synth, "AWS::SNS::Topic")
    camel = lambda s: "".join(p[:1].upper() + p[1:] for p in s.replace("-", "_").split("_"))  # noqa: E731
    want = set()
    for fn in SPEC.functions:
        c = camel(fn.name)
        want |= {f"Lightmetrics-{c}Throttles", f"Lightmetrics-{c}InvariantViolation"}
        want.add(f"Lightmetrics-{c}5xxRate" if fn.trigger_kind == "http" else f"Lightmetrics-{c}Errors")
        if fn.trigger_kind != "http":
            want.add(f"Lightmetrics-{c}BlockersOpened")
        if fn.name == "reconcile":
            want |= {f"Lightmetrics-{c}ReconcilerLag", f"Lightmetrics-{c}ReconcilerStuck"}
        if fn.name == "reap-retention":
            want.add(f"Lightmetrics-{c}RetentionUnfinished")
        if fn.name in ("reconcile", "walk-page", "index-raw-blobs"):  # repair_accepted; D6 in the blob indexer
            want.add(f"Lightmetrics-{c}IntegrityViolation")
        if fn.name in ("index-quarantine", "walk-page"):  # the functions that run index_quarantine
            want.add(f"Lightmetrics-{c}NewConflicts")
        if fn.gc_role:  # the blob deleter: a restore is a race the GC handshake caught
            want.add(f"Lightmetrics-{c}GcRestored")
    for sm in SPEC.state_machines:
        want.add(f"Lightmetrics-{sm.logical_name}ExecutionsFailed")
    for q in SPEC.queues:
        want |= {f"Lightmetrics-{camel(q.name)}DlqNotEmpty", f"Lightmetrics-{camel(q.name)}OldestMessage"}
    for sq in SPEC.shard_queues:  # dead letters alarmed; the age is not (its messages wait their jitter)
        want.add(f"Lightmetrics-{camel(sq.name)}DlqNotEmpty")
    assert set(alarms) == want
    for name, alarm in alarms.items():
        p = alarm["Properties"]
        assert p["AlarmActions"] == [{"Ref": topic_id}] and p["OKActions"] == [{"Ref": topic_id}], name
        # a reconciler that stopped reporting is stuck too (docs/protocol.md §12 R9)
        assert p["TreatMissingData"] == ("breaching" if name.endswith("ReconcilerStuck") else "notBreaching"), name
        kind = re.sub(r"^Lightmetrics-[A-Za-z0-9]*?(5xxRate|Throttles|InvariantViolation|Errors|DlqNotEmpty|OldestMessage|BlockersOpened|ReconcilerLag|ReconcilerStuck|RetentionUnfinished|IntegrityViolation|ExecutionsFailed|NewConflicts|GcRestored)$", r"\1", name)
        assert f"Runbook: docs/runbook.md#{kind.lower()}" in p["AlarmDescription"]

    rate = alarms["Lightmetrics-Ingest5xxRate"]["Properties"]
    (expr,) = [m for m in rate["Metrics"] if "Expression" in m]
    assert expr["Expression"] == "IF(inv > 0, 100 * (FILL(e5xx, 0) + FILL(errors, 0)) / inv, 0)"
    assert rate["Threshold"] == 1 and rate["ComparisonOperator"] == "GreaterThanThreshold"
    metrics = {m["MetricName"]: m for m in _alarm_metrics(alarms["Lightmetrics-Ingest5xxRate"])}
    assert metrics["Ingest5xx"]["Namespace"] == "Lightmetrics"
    assert metrics["Ingest5xx"]["Dimensions"] == [{"Name": "service", "Value": "ingest"}]
    assert {metrics["Invocations"]["Namespace"], metrics["Errors"]["Namespace"]} == {"AWS/Lambda"}
    (inv,) = _alarm_metrics(alarms["Lightmetrics-IngestInvariantViolation"])
    assert (inv["Namespace"], inv["MetricName"], inv["Dimensions"]) == (
        "Lightmetrics", "InvariantViolation", [{"Name": "service", "Value": "ingest"}])
    (thr,) = _alarm_metrics(alarms["Lightmetrics-IngestThrottles"])
    assert (thr["Namespace"], thr["MetricName"]) == ("AWS/Lambda", "Throttles")


def test_every_cause_status_calls_stuck_has_an_alarm(cdk_synth: Any) -> None:
    """Issue 23 property 5: what ``lmctl status`` calls stuck, an alarm fires for (docs/runbook.md,
    "What lmctl status calls stuck"): the lag at the same threshold; a shard that never ran, failed
    or stopped (ReconcilerStuck); a retention hour left unfinished (RetentionUnfinished)."""
    from lightmetrics.deployment.settings import Settings
    from lightmetrics.derived.reconcile_state import lag_limit_s

    alarms = {render(a["Properties"]["AlarmName"]): a["Properties"]
              for a in resources(cdk_synth, "AWS::CloudWatch::Alarm").values()}
    lag = alarms["Lightmetrics-ReconcileReconcilerLag"]
    assert lag["Threshold"] == lag_limit_s(Settings.from_env({"LM_BUCKET": "b-1"}).settle_s)
    for name, metric, service in (("ReconcileReconcilerStuck", "ReconcilerShardsStuck", "reconcile"),
                                  ("ReapRetentionRetentionUnfinished", "RetentionHoursUnfinished", "reap-retention")):
        p = alarms[f"Lightmetrics-{name}"]
        (m,) = _alarm_metrics({"Properties": p})
        assert (m["MetricName"], m["Dimensions"]) == (metric, [{"Name": "service", "Value": service}]), name
        assert p["Threshold"] == 1 and p["ComparisonOperator"] == "GreaterThanOrEqualToThreshold", name
    reconcile = (ROOT / "shared" / "lightmetrics" / "derived" / "reconcile.py").read_text()
    retention = (ROOT / "shared" / "lightmetrics" / "reaps" / "retention_tasks.py").read_text()
    assert 'name="ReconcilerShardsStuck"' in reconcile and 'name="RetentionHoursUnfinished"' in retention


def test_alarm_metric_names_are_the_ones_the_code_emits() -> None:
    handler = (ROOT / "functions" / "ingest" / "app.py").read_text()
    accept = (ROOT / "shared" / "lightmetrics" / "acceptance" / "accept.py").read_text()
    assert 'name="Ingest5xx"' in handler and 'service="ingest"' in handler
    assert 'os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Lightmetrics")' in handler
    assert 'name="InvariantViolation"' in accept
    work = (ROOT / "shared" / "lightmetrics" / "work" / "units.py").read_text()
    reconcile = (ROOT / "shared" / "lightmetrics" / "derived" / "reconcile.py").read_text()
    indexing = (ROOT / "shared" / "lightmetrics" / "derived" / "indexing.py").read_text()
    assert 'name="BlockersOpened"' in work and 'name="ReconcilerLagSeconds"' in reconcile
    assert 'alarm="IntegrityViolation"' in indexing and 'alarm="InvariantViolation"' in indexing


def test_runbook_has_an_entry_per_alarm_kind() -> None:
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    headings = {h.strip().lower() for h in re.findall(r"^## (.+)$", runbook, re.M)}
    assert {"5xxrate", "throttles", "invariantviolation", "errors", "dlqnotempty", "oldestmessage",
            "blockersopened", "reconcilerlag", "reconcilerstuck", "retentionunfinished", "integrityviolation",
            "executionsfailed", "newconflicts", "gcrestored"} <= headings


# --------------------------------------------------------------------------- cdk-nag


def test_cdk_nag_clean_and_every_suppression_justified(cdk_synth: Any) -> None:
    from aws_cdk.assertions import Match

    for finder in (cdk_synth.annotations.find_error, cdk_synth.annotations.find_warning):
        found = finder("*", Match.string_like_regexp("AwsSolutions-.*"))
        assert found == [], [f"{m.id}: {str(m.entry.data)[:160]}" for m in found]
    records = cdk_synth.stack.nag_suppressions
    assert records, "expected the documented suppressions"
    paths = {"/" + c.node.path for c in cdk_synth.stack.node.find_all()}
    for r in records:
        assert re.fullmatch(r"AwsSolutions-[A-Z0-9]+", r.rule)
        assert r.path in paths, f"suppression for a path that does not exist: {r.path}"
        assert len(r.reason) >= 40, r
    # What landed in the template: every suppression carries its rule and reason.
    in_template = [
        s for res in cdk_synth.json["Resources"].values()
        for s in res.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])
    ]  # fmt: skip
    assert len(in_template) == len(records)
    assert all(s["id"].startswith("AwsSolutions-") and len(s["reason"]) >= 40 for s in in_template)
    assert {r.rule for r in records} <= {"AwsSolutions-L1", "AwsSolutions-IAM5", "AwsSolutions-IAM4"}


# --------------------------------------------------------------------------- local runtime vs template


def test_local_provisioning_matches_the_template(runtime: Any, cdk_synth: Any) -> None:
    """provision() (the local runtime) and the synthesized stack build the same resources."""
    tag = uuid.uuid4().hex[:10]
    made = provision(runtime, SPEC, bucket=f"lm-infra-{tag}", table=f"lm-infra-{tag}",
                     secret_name=f"lm-infra/{tag}", namespace=NS)  # fmt: skip
    res = cdk_synth.json["Resources"]
    s3, ddb, sqs = (runtime.boto3_client(s) for s in ("s3", "dynamodb", "sqs"))

    # table: keys, attribute types, billing, TTL
    desc = ddb.describe_table(TableName=made["table"])["Table"]
    tbl = res["ControlTable"]["Properties"]
    assert desc["KeySchema"] == tbl["KeySchema"]
    assert sorted(desc["AttributeDefinitions"], key=str) == sorted(tbl["AttributeDefinitions"], key=str)
    assert desc["BillingModeSummary"]["BillingMode"] == tbl["BillingMode"]
    ttl = ddb.describe_time_to_live(TableName=made["table"])["TimeToLiveDescription"]
    assert (ttl["AttributeName"], ttl["TimeToLiveStatus"] in ("ENABLED", "ENABLING")) == (
        tbl["TimeToLiveSpecification"]["AttributeName"], tbl["TimeToLiveSpecification"]["Enabled"])

    # bucket versioning
    status = s3.get_bucket_versioning(Bucket=made["bucket"]).get("Status")
    assert status == res["AuthorityBucket"]["Properties"]["VersioningConfiguration"]["Status"]

    # queues: redrive (which DLQ, after how many receives), visibility; then the notifications
    ids = queue_ids(cdk_synth)
    name_of_id = {v: k for k, v in ids.items()}
    local_queues, cdk_queues = {}, {}
    arn_to_name = {}
    for name, q in [*made["queues"].items(), *made["shard_queues"].items()]:
        arn_to_name[q["arn"]] = name
        arn_to_name[q["dlq_arn"]] = next(s.dlq_name for s in (*SPEC.queues, *SPEC.shard_queues) if s.name == name)
        attrs = sqs.get_queue_attributes(QueueUrl=q["url"], AttributeNames=["All"])["Attributes"]
        redrive = json.loads(attrs["RedrivePolicy"])
        local_queues[name] = (arn_to_name[redrive["deadLetterTargetArn"]], int(redrive["maxReceiveCount"]),
                              int(attrs["VisibilityTimeout"]))
    for logical, r in resources(cdk_synth, "AWS::SQS::Queue").items():
        p = r["Properties"]
        if "RedrivePolicy" in p:
            dlq = render(p["RedrivePolicy"]["deadLetterTargetArn"]).strip("<>").removesuffix(".Arn")
            cdk_queues[name_of_id[logical]] = (name_of_id[dlq], int(p["RedrivePolicy"]["maxReceiveCount"]),
                                               int(p["VisibilityTimeout"]))
    assert local_queues == cdk_queues
    assert len(resources(cdk_synth, "AWS::SQS::Queue")) == 2 * len(local_queues)

    local_conf = s3.get_bucket_notification_configuration(Bucket=made["bucket"]).get("QueueConfigurations", [])
    local_notes = sorted(
        (arn_to_name[c["QueueArn"]], tuple(c["Events"]),
         tuple((f["Name"].lower(), f["Value"]) for f in c["Filter"]["Key"]["FilterRules"]))
        for c in local_conf
    )  # fmt: skip
    cdk_notes = []
    for n in resources(cdk_synth, "Custom::S3BucketNotifications").values():
        for c in n["Properties"]["NotificationConfiguration"].get("QueueConfigurations", []):
            qid = render(c["QueueArn"]).strip("<>").removesuffix(".Arn")
            rules = tuple((f["Name"].lower(), f["Value"]) for f in c["Filter"]["Key"]["FilterRules"])
            cdk_notes.append((name_of_id[qid], tuple(c["Events"]), rules))
    assert local_notes == sorted(cdk_notes)
    assert len(local_notes) == sum(len(q.events) for q in SPEC.queues)

    # state machines: the same set, by name (<stack>-<logical name> in AWS, <prefix><logical name> here)
    sfn = runtime.boto3_client("stepfunctions")
    local_names = {sm["name"] for sm in made["state_machines"].values()}
    cdk_names = {r["Properties"]["StateMachineName"] for r in resources(cdk_synth, "AWS::StepFunctions::StateMachine").values()}
    assert {n.removeprefix("Lightmetrics-") for n in cdk_names} == local_names == {sm.logical_name for sm in SPEC.state_machines}
    for sm in made["state_machines"].values():
        desc = sfn.describe_state_machine(stateMachineArn=sm["arn"])
        assert (desc["name"], desc["type"]) == (sm["name"], "STANDARD")


# --------------------------------------------------------------------------- the real CLI


def test_cdk_cli_synth_without_aws_account_or_docker(tmp_path: Path) -> None:
    from infra.components.layer import refresh_shared_package

    if not CDK_CLI.exists():
        pytest.fail("the CDK CLI is not installed: run `make cdk-cli` (make test does it)")
    refresh_shared_package()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LM_", "CDK_"))}
    env.update(
        {
            "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
            "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "18,20",
            "CDK_DISABLE_CLI_TELEMETRY": "true",
            "AWS_EC2_METADATA_DISABLED": "true",  # no credentials, and do not go looking for them
            "CDK_DOCKER": "/bin/false",  # any Docker use would fail the synth
            "HOME": str(tmp_path),  # no ~/.aws, no CDK user config
        }
    )
    out = tmp_path / "cdk.out"
    proc = subprocess.run(
        [str(CDK_CLI), "synth", "--quiet", "--no-notices", "--output", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "AwsSolutions-" not in proc.stderr, proc.stderr[-3000:]
    template = json.loads((out / "Lightmetrics.template.json").read_text())
    types = {r["Type"] for r in template["Resources"].values()}
    assert {"AWS::S3::Bucket", "AWS::S3::BucketPolicy", "AWS::DynamoDB::Table", "AWS::Lambda::Function",
            "AWS::Lambda::LayerVersion", "AWS::Lambda::Url", "AWS::CloudWatch::Alarm"} <= types  # fmt: skip
    env_vars = next(r["Properties"]["Environment"]["Variables"] for r in template["Resources"].values()
                    if r["Type"] == "AWS::Lambda::Function" and r["Properties"].get("Handler") == "functions.ingest.app.handler")  # fmt: skip
    assert env_vars["LM_PREFIX"] == ""  # cdk.json's default namespace


# --------------------------------------------------------------------------- state machines (issue 5)


def test_state_machines_roles_and_schedule_from_the_spec(cdk_synth: Any) -> None:
    sms = resources(cdk_synth, "AWS::StepFunctions::StateMachine")
    assert len(sms) == len(SPEC.state_machines) >= 1
    rules = resources(cdk_synth, "AWS::Events::Rule")
    for spec in SPEC.state_machines:
        built = cdk_synth.stack.state_machines.built[spec.name]
        sm_id = logical_id(cdk_synth, built.machine)
        p = sms[sm_id]["Properties"]
        assert (p["StateMachineName"], p["StateMachineType"]) == (f"Lightmetrics-{spec.logical_name}", "STANDARD")
        assert p["TracingConfiguration"] == {"Enabled": True}
        assert p["LoggingConfiguration"]["Level"] == "ALL"
        assert render(p["LoggingConfiguration"]["Destinations"]) == [
            {"CloudWatchLogsLogGroup": {"LogGroupArn": f"<{logical_id(cdk_synth, built.log_group)}.Arn>"}}]
        fn_ids = {fn: logical_id(cdk_synth, cdk_synth.stack.functions.built[fn].function) for fn in spec.function_names()}
        # The placeholders are the spec's, each filled with its function's ARN by CloudFormation.
        assert render(p["DefinitionSubstitutions"]) == {ph: f"<{fn_ids[fn]}.Arn>" for ph, fn in spec.substitutions}
        assert set(re.findall(r"\$\{([A-Za-z0-9_]+)\}", p["DefinitionString"])) == {ph for ph, _ in spec.substitutions}
        for fn in spec.function_names():
            assert SPEC.function(fn).trigger_kind == "task"
            assert not [m for m in resources(cdk_synth, "AWS::Lambda::EventSourceMapping").values()
                        if render(m["Properties"]["FunctionName"]) == f"<{fn_ids[fn]}>"]

        # Role: assumed by Step Functions; invokes exactly its task functions. Everything else is
        # what CDK adds for tracing and log delivery, which has no resource-level permissions.
        role = resources(cdk_synth, "AWS::IAM::Role")[logical_id(cdk_synth, built.role)]["Properties"]
        (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Principal"] == {"Service": "states.amazonaws.com"} and "ManagedPolicyArns" not in role
        grants = role_grants(cdk_synth, logical_id(cdk_synth, built.role))
        assert {(a, r) for a, r, _ in grants if a.startswith("lambda:")} == {
            ("lambda:InvokeFunction", f"<{fn_ids[fn]}.Arn>") for fn in spec.function_names()}
        others = {(a, r) for a, r, _ in grants if not a.startswith("lambda:")}
        assert {r for _, r in others} == {"*"} and {a.split(":")[0] for a, _ in others} == {"xray", "logs"}

        # The schedule, with the spec's explicit input (nulls included); the walk's only without an
        # S3 Inventory (this synth has one; tests/test_infra_inventory.py synthesizes without).
        enabled = [r["Properties"] for r in rules.values() if r["Properties"]["State"] == "ENABLED"
                   and any(render(t["Arn"]) == f"<{sm_id}>" for t in r["Properties"]["Targets"])]
        if not scheduled(spec.name, inventory=True):
            assert enabled == [] and built.rule is None
            continue
        (rule,) = enabled
        assert rule["ScheduleExpression"] == spec.schedule and rule["State"] == "ENABLED"
        (target,) = rule["Targets"]
        assert json.loads(target["Input"]) == json.loads(spec.schedule_input or "{}")
        events_role_id = render(target["RoleArn"]).strip("<>").removesuffix(".Arn")
        assert role_grants(cdk_synth, events_role_id) == {g("states:StartExecution", f"<{sm_id}>")}

    walk = SPEC.state_machine("bootstrap-walk")
    assert walk.schedule == "cron(0 3 ? * SUN *)"  # weekly, Sunday 03:00 UTC
    assert json.loads(walk.schedule_input or "") == {"agent": None, "resume": False, "page_size": 10000, "parallelism": 40}
    # Functions learn the state machines' ARNs (built from the names: no dependency cycle).
    cont = cdk_synth.stack.functions.built["walk-continue"]
    env = render(cdk_synth.json["Resources"][logical_id(cdk_synth, cont.function)]["Properties"]["Environment"]["Variables"])
    assert json.loads(env["LM_STATE_MACHINE_ARNS"]) == {sm.name: sm_arn(sm.logical_name) for sm in SPEC.state_machines}
    assert "BootstrapWalkArn" in cdk_synth.json["Outputs"]


def test_walk_functions_are_least_privilege(cdk_synth: Any) -> None:
    """The walk's functions, spelled out (the generic exact-set test derives the same from the spec)."""
    page = SPEC.function("walk-page")
    assert set(page.s3_write) == {"accepted-by-time/v1/", "accepted-by-blob/v1/", "raw-blobs-by-time/v1/",
                                  "quarantine-by-blob/v1/"}
    # accepted-by-time/v1/: rule W5, a key's entry checked by a HEAD or its group's LIST; v2: a key
    # missing from v1 looked up in the segments and seals of its hours (read and listed, never written)
    assert set(page.s3_read) == {"accepted/v1/", "quarantine/v1/", "raw-blobs/v1/", "retention/v1/", "accepted-by-time/v1/",
                                 "accepted-by-time/v2/"}
    assert "accepted-by-time/v2/" in page.s3_list and "accepted-by-time/v2/" not in page.s3_write
    assert not page.s3_delete and not page.sfn_start
    plan = SPEC.function("walk-plan")
    assert (plan.s3_read, plan.s3_write, set(plan.s3_list)) == ((), (), {"accepted/v1/", "quarantine/v1/"})
    for name in ("walk-begin", "walk-continue", "walk-end"):
        fn = SPEC.function(name)
        assert (fn.s3_read, fn.s3_write, fn.s3_list, fn.table) == ((), (), (), "write")
    assert [fn.name for fn in SPEC.functions if fn.sfn_start] == ["walk-continue", "reap-continue"]
    built = cdk_synth.stack.functions.built["walk-continue"]
    starts = {(a, r) for a, r, _ in role_grants(cdk_synth, logical_id(cdk_synth, built.role)) if a.startswith("states:")}
    assert starts == {("states:StartExecution", sm_arn("BootstrapWalk"))}


def _replace_strings(value: Any, mapping: dict[str, str]) -> Any:
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, dict):
        return {k: _replace_strings(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_strings(v, mapping) for v in value]
    return value


def test_deployed_definition_equals_what_the_local_runtime_loaded(runtime: Any, cdk_synth: Any) -> None:
    """The template in cdk.out, after CloudFormation's substitution, is the definition moto runs."""
    template = json.loads((Path(cdk_synth.outdir) / f"{cdk_synth.stack.stack_name}.template.json").read_text())
    fn_by_id = {logical_id(cdk_synth, b.function): name for name, b in cdk_synth.stack.functions.built.items()}
    tag = uuid.uuid4().hex[:8]
    prefix = f"asl{tag}-"
    made = provision(runtime, SPEC, bucket=f"lm-asl-{tag}", table=f"lm-asl-{tag}", secret_name=f"lm-asl/{tag}",
                     namespace=NS, queue_name_prefix=prefix)  # fmt: skip
    sfn = runtime.boto3_client("stepfunctions")
    machines = {k: r for k, r in template["Resources"].items() if r["Type"] == "AWS::StepFunctions::StateMachine"}
    assert len(machines) == len(SPEC.state_machines)
    for r in machines.values():
        p = r["Properties"]
        spec = next(sm for sm in SPEC.state_machines if p["StateMachineName"] == f"Lightmetrics-{sm.logical_name}")
        # The file itself is what CDK deploys (substitution happens in CloudFormation).
        assert p["DefinitionString"] == (ROOT / "infra" / "statemachines" / spec.definition).read_text()
        # CloudFormation's DefinitionSubstitutions, done here independently of lightmetrics.operator_tools.statemachines.
        names = {ph: fn_by_id[v["Fn::GetAtt"][0]] for ph, v in p["DefinitionSubstitutions"].items()}
        deployed = json.loads(re.sub(r"\$\{([A-Za-z0-9_]+)\}", lambda m: f"function:{names[m.group(1)]}",
                                     p["DefinitionString"]))
        loaded = json.loads(sfn.describe_state_machine(stateMachineArn=made["state_machines"][spec.name]["arn"])["definition"])
        local_arns = {f"arn:aws:lambda:us-east-1:123456789012:function:{prefix}{fn}": f"function:{fn}"
                      for fn in spec.function_names()}
        assert _replace_strings(loaded, local_arns) == deployed
        tasks = [s for s in _all_states(deployed) if s.get("Type") == "Task"]
        assert tasks and {t["Resource"] for t in tasks} == {f"function:{fn}" for fn in spec.function_names()}


def _all_states(definition: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for state in definition.get("States", {}).values():
        out.append(state)
        for key in ("ItemProcessor", "Iterator"):
            if key in state:
                out.extend(_all_states(state[key]))
    return out
