"""The DynamoDB control table (docs/control-table.md), from :class:`lightmetrics.deployment.resource_types.TableSpec`."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from lightmetrics.deployment.resource_types import TableSpec

_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}


class ControlTable(Construct):
    """On-demand (or provisioned, per spec), point-in-time recovery, TTL, RETAIN, deletion protection."""

    def __init__(self, scope: Construct, construct_id: str, *, spec: TableSpec, table_name: str | None) -> None:
        super().__init__(scope, construct_id)
        pk_name, pk_type = spec.partition_key
        sort_key = (
            dynamodb.Attribute(name=spec.sort_key[0], type=_TYPES[spec.sort_key[1]]) if spec.sort_key else None
        )
        self.table = dynamodb.Table(
            self,
            spec.logical_name,
            table_name=table_name,
            partition_key=dynamodb.Attribute(name=pk_name, type=_TYPES[pk_type]),
            sort_key=sort_key,
            billing_mode=(
                dynamodb.BillingMode.PAY_PER_REQUEST
                if spec.billing == "PAY_PER_REQUEST"
                else dynamodb.BillingMode.PROVISIONED
            ),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=spec.ttl_attribute,
            deletion_protection=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
        cfn = self.table.node.default_child
        assert isinstance(cfn, dynamodb.CfnTable)
        cfn.override_logical_id(spec.logical_name)
