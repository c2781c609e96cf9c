"""The main stack: everything is derived from ``lightmetrics.deployment.resources.SPEC``.

Constructs: ``Storage`` (authority bucket, bucket policy, GC role, ops bucket), ``Control``
(DynamoDB control table), ``Layer`` (shared Lambda layer), ``Queues`` (SQS + DLQ + S3
notifications, one per QueueSpec), ``Functions`` (one Lambda per FunctionSpec, with its trigger
and least-privilege role), ``StateMachines`` (one Step Functions state machine per
StateMachineSpec, from its ASL file, with its role, logs and schedule), ``Observability`` (SNS
topic, alarms, dashboard), the operators' managed policy (``OperatorPolicy``).
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from infra.components.control_table import ControlTable
from infra.components.functions import Functions, log_retention, secret_policy_arn
from infra.components.layer import LAYER_DIR, SharedLayer
from infra.components.observability import Observability
from infra.components.operators import operator_policy
from infra.components.pipeline import Pipeline
from infra.components.queues import IndexQueues, ShardQueues
from infra.components.statemachines import StateMachines, state_machine_arn
from infra.components.storage import Storage
from infra.config import InfraConfig
from infra.nag import NagSuppressionRecord, apply_suppressions
from infra.scanners import apply_checkov_skips
from lightmetrics.deployment.resource_types import ResourceSpec
from lightmetrics.deployment.resources import SPEC
from lightmetrics.operator_tools.stack_outputs import (
    EMPTY_PREFIX,
    SCALAR_OUTPUTS,
    queue_output_key,
    state_machine_output_key,
)


class LightmetricsStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: InfraConfig,
        spec: ResourceSpec = SPEC,
        layer_dir: Path = LAYER_DIR,
        **kwargs: object,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            description="Lightmetrics ingest: S3 acceptance authority, control table, functions, alarms",
            **kwargs,  # type: ignore[arg-type]
        )
        self.config = config
        self.spec = spec

        self.storage = Storage(
            self,
            "Storage",
            spec=spec.bucket,
            namespace=config.prefix,
            bucket_name=config.bucket_name,
            noncurrent_version_days=config.noncurrent_version_days,
            abort_multipart_days=config.abort_multipart_days,
            ops_retention_days=config.ops_retention_days,
            inventory_retention_days=config.inventory_retention_days,
            inventory=config.inventory,
        )
        self.control = ControlTable(self, "Control", spec=spec.table, table_name=config.table_name)
        self.layer = SharedLayer(self, "Layer", layer_dir=layer_dir)
        self.queues = IndexQueues(
            self, "Queues", specs=spec.queues, bucket=self.storage.bucket, namespace=config.prefix,
            log_retention=log_retention(config.log_retention_days),
        )
        self.shard_queues = ShardQueues(self, "ShardQueues", specs=spec.shard_queues)
        self.functions = Functions(
            self,
            "Functions",
            spec=spec,
            config=config,
            storage=self.storage,
            table_arn=self.control.table.table_arn,
            table_name=self.control.table.table_name,
            layer=self.layer.layer,
            queues={**self.queues.by_name, **self.shard_queues.by_name},
            state_machine_arns={sm.name: state_machine_arn(self, config, sm) for sm in spec.state_machines},
        )
        self.state_machines = StateMachines(
            self, "StateMachines", specs=spec.state_machines, functions=self.functions.built, config=config
        )
        self.observability = Observability(
            self,
            "Observability",
            config=config,
            functions=list(self.functions.built.values()),
            queues=self.queues.built,
            state_machines=list(self.state_machines.built.values()),
            shard_queues=self.shard_queues.built,
        )
        self.operator_policy = operator_policy(
            self, "OperatorPolicy", config=config, spec=spec, storage=self.storage, table_arn=self.control.table.table_arn,
            secret_arn=secret_policy_arn(self, config.secret_name),
            queues={**self.queues.by_name, **self.shard_queues.by_name},
            admin_function_arn=self.functions.built["admin"].function.function_arn)
        self.pipeline = Pipeline(self, "Pipeline", config=config, bucket=self.storage.bucket, ops_bucket=self.storage.ops_bucket,
                                 table_arn=self.control.table.table_arn, table_name=self.control.table.table_name,
                                 alarm_topic=self.observability.topic)

        # What `lmctl env --stack <name>` reads back (lightmetrics.operator_tools.stack_outputs: one list of them).
        scalar = {"BucketName": self.storage.bucket.bucket_name, "Prefix": config.prefix or EMPTY_PREFIX,
                  "TableName": self.control.table.table_name, "SecretName": config.secret_name}
        for key, setting in SCALAR_OUTPUTS.items():
            CfnOutput(self, key, value=scalar[key], description=setting)
        for queue in self.queues.built:
            for name, q in ((queue.spec.name, queue.queue), (queue.spec.dlq_name, queue.dlq)):
                CfnOutput(self, queue_output_key(name), value=q.queue_url,
                          description=f'LM_QUEUE_URLS: {{"{name}": "<this URL>"}}')
        for shard_queue in self.shard_queues.built:  # lmctl status reads its depth and its DLQ's
            CfnOutput(self, queue_output_key(shard_queue.spec.name), value=shard_queue.queue.queue_url,
                      description="LM_RECONCILE_SHARDS_QUEUE_URL")
        CfnOutput(self, "GcRoleArn", value=self.storage.gc_role.role_arn, description="the only raw-blob deleter")
        CfnOutput(self, "OperatorPolicyArn", value=self.operator_policy.managed_policy_arn,
                  description="what lmctl needs (docs/runbook.md): attach it to the operators' role")
        CfnOutput(self, "OpsBucketName", value=self.storage.ops_bucket.bucket_name, description="inventory, access logs")
        for built in self.state_machines.built.values():
            CfnOutput(self, state_machine_output_key(built.spec.logical_name), value=built.machine.state_machine_arn,
                      description=f'LM_STATE_MACHINE_ARNS: {{"{built.spec.name}": "<this ARN>"}}')
        CfnOutput(self, "AlarmTopicArn", value=self.observability.topic.topic_arn)
        CfnOutput(self, "DashboardName", value=self.observability.dashboard.dashboard_name)

        self.nag_suppressions: list[NagSuppressionRecord] = apply_suppressions(self)
        apply_checkov_skips(self)  # checkov's per-resource exceptions, each with its reason
