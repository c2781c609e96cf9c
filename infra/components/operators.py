"""The operators' managed policy: what ``lmctl`` needs (docs/runbook.md), from the same statements the
local runtime gives the role ``lmctl`` runs as there
(:func:`lightmetrics.operator_tools.policies.operator_statements`).

Attach it to the role or group your operators assume (stack output ``OperatorPolicyArn``). Its cdk-nag
suppression (``AwsSolutions-IAM5``: prefix wildcards, executions, metric reads) is in ``infra/nag.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.components.functions import cdk_statement, policy_arns
from infra.components.statemachines import state_machine_arn, state_machine_name
from infra.components.storage import Storage
from infra.config import InfraConfig
from lightmetrics.deployment.resource_types import ResourceSpec
from lightmetrics.operator_tools.policies import operator_statements


def operator_policy(scope: Construct, construct_id: str, *, config: InfraConfig, spec: ResourceSpec, storage: Storage,
                    table_arn: str, secret_arn: str, queues: Mapping[str, sqs.IQueue],
                    admin_function_arn: str) -> iam.ManagedPolicy:
    """The managed policy of :func:`~lightmetrics.operator_tools.policies.operator_statements`."""
    stack = Stack.of(scope)
    arns = policy_arns(storage=storage, table_arn=table_arn, secret_arn=secret_arn, queues=queues,
                       state_machine_arns={sm.name: state_machine_arn(stack, config, sm) for sm in spec.state_machines})
    executions = {sm.name: stack.format_arn(service="states", resource="execution",
                                            resource_name=f"{state_machine_name(config, sm)}:*",
                                            arn_format=ArnFormat.COLON_RESOURCE_NAME) for sm in spec.state_machines}
    statements = operator_statements(replace(arns, executions=executions), spec, admin_function=admin_function_arn)
    return iam.ManagedPolicy(scope, construct_id, description="Lightmetrics operators (lmctl): docs/runbook.md",
                             statements=[cdk_statement(s) for s in statements])


__all__ = ["operator_policy"]
