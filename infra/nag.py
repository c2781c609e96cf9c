"""cdk-nag (AwsSolutions) suppressions: each names the rule, the resource path and the reason.

Suppressions are computed from the stack (so a new FunctionSpec gets exactly the ones its own
fields justify) and applied by path; ``stack.nag_suppressions`` lists them for the tests and
the deploy notes. A finding not covered here fails ``tests/test_infra.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aws_cdk import Stack
from cdk_nag import NagPackSuppression, NagSuppressions

from infra.components.queues import NOTIFICATIONS_HANDLER_ID

if TYPE_CHECKING:
    from infra.stack import LightmetricsStack


@dataclass(frozen=True)
class NagSuppressionRecord:
    rule: str
    path: str
    reason: str
    applies_to: tuple[str, ...] = ()


def _path(construct: object) -> str:
    return "/" + construct.node.path  # type: ignore[attr-defined]


def suppressions_for(stack: "LightmetricsStack") -> list[NagSuppressionRecord]:
    records: list[NagSuppressionRecord] = []
    bucket_id = stack.spec.bucket.logical_name
    ns = stack.config.prefix
    policies: dict[str, set[str]] = {}
    for built in stack.functions.built.values():
        spec = built.spec
        records.append(
            NagSuppressionRecord(
                "AwsSolutions-L1",
                _path(built.function.node.default_child),
                "Python 3.12 is pinned on purpose: the shared layer's binary wheels (pydantic-core, "
                "zstandard) are built for cp312 by `make layer`; runtime and layer move together.",
            )
        )
        policy = built.role.node.try_find_child("DefaultPolicy")
        assert policy is not None, f"{spec.name}: role has no DefaultPolicy"
        wildcards = policies.setdefault(_path(policy.node.default_child), set())
        wildcards.add("Resource::*")  # X-Ray (tracing), and CloudWatch metric reads if granted
        for prefix in (*spec.s3_read, *spec.s3_write, *spec.s3_delete):
            wildcards.add(f"Resource::<{bucket_id}.Arn>/{ns}{prefix}*")
    for path, applies_to in policies.items():
        records.append(
            NagSuppressionRecord(
                "AwsSolutions-IAM5",
                path,
                "Object actions are granted per key-layout prefix (docs/protocol.md §3): keys are "
                "content- or identity-addressed, so `<prefix>*` is the narrowest grant; the bucket policy "
                "still forces conditional creates and forbids deletes there. `*` is only for "
                "xray:PutTraceSegments/PutTelemetryRecords and cloudwatch:GetMetric*, which support no "
                "resource-level permissions.",
                tuple(sorted(applies_to)),
            )
        )
    for built_sm in stack.state_machines.built.values():
        policy = built_sm.role.node.try_find_child("DefaultPolicy")
        assert policy is not None, f"{built_sm.spec.name}: role has no DefaultPolicy"
        records.append(
            NagSuppressionRecord(
                "AwsSolutions-IAM5",
                _path(policy.node.default_child),
                "Added by CDK for the state machine's tracing and logging: xray:PutTraceSegments/"
                "PutTelemetryRecords/GetSamplingRules/GetSamplingTargets and the CloudWatch Logs delivery "
                "actions (logs:CreateLogDelivery, ...) support no resource-level permissions. Its only "
                "other grant is lambda:InvokeFunction on exactly the functions its tasks name.",
                ("Resource::*",),
            )
        )
    records.append(
        NagSuppressionRecord(
            "AwsSolutions-IAM5",
            _path(stack.operator_policy.node.default_child),
            "The operators' policy: object reads are granted per key-layout prefix (docs/protocol.md §3; keys are "
            "content- or identity-addressed, so `<prefix>*` is the narrowest grant) and creates only on derived "
            "prefixes and resolution records, which the bucket policy keeps create-only; executions get their names "
            "at start, so DescribeExecution is on this stack's walk's and reap's executions (`<machine>:*`); "
            "cloudwatch:GetMetric* supports no resource-level permissions. No delete is granted.",
        )
    )
    handler = stack.node.try_find_child(NOTIFICATIONS_HANDLER_ID)
    if handler is not None:
        role = handler.node.find_child("Role")
        records.append(
            NagSuppressionRecord(
                "AwsSolutions-IAM4",
                _path(role.node.default_child),
                "CDK's own deploy-time custom resource that applies the bucket's S3->SQS notification "
                "configuration; AWSLambdaBasicExecutionRole only lets it write its logs, and its one "
                "other permission is s3:PutBucketNotification on the authority bucket.",
                ("Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",),
            )
        )
    return records


def apply_suppressions(stack: Stack) -> list[NagSuppressionRecord]:
    records = suppressions_for(stack)  # type: ignore[arg-type]
    for r in records:
        NagSuppressions.add_resource_suppressions_by_path(
            stack,
            r.path,
            [NagPackSuppression(id=r.rule, reason=r.reason, applies_to=list(r.applies_to) or None)],
        )
    return records
