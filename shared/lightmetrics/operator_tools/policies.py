"""Every IAM statement the stack grants, once: the CDK app and the local runtime both build roles from here.

A statement is IAM's own JSON shape (``{"Sid"?, "Effect", "Action", "Resource", "Condition"?}``),
so CDK wraps it in a ``PolicyStatement`` (``infra/``) and the local runtime puts it, as it is, in
the inline policy of the principal it provisions for that role (:mod:`lightmetrics.local.principals`),
where moto enforces it. The ARNs come in through :class:`PolicyArns`: CDK tokens in the stack, the
local resources' ARNs locally; nothing else differs.

The principals (:func:`principals`): one per function role (the GC functions share the GC role, as
in the stack), one per state machine role, the pipeline job role, and the operators'
(:func:`operator_statements`: a managed policy in the stack, the role ``lmctl`` runs as locally). Logs, X-Ray and the event source
mapping's own queue grants are what CDK adds by itself (log groups, tracing, ``SqsEventSource``);
:func:`trigger_statements` names the last, for the local poller.

Example:
    >>> arns = PolicyArns(bucket="arn:aws:s3:::b", namespace="", table="arn:t", secret="arn:s")
    >>> [s["Action"] for s in function_statements(SPEC.function("walk-end"), arns)]
    [['dynamodb:GetItem', 'dynamodb:Query', 'dynamodb:UpdateItem']]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.deployment.resource_types import BucketSpec, FunctionSpec, ResourceSpec, StateMachineSpec
from lightmetrics.deployment.resources import SPEC
from lightmetrics.protocol.keys import KeyKind as K  # short: the policy names many kinds
from lightmetrics.protocol.keys import layout_roots
from lightmetrics.reaps.gc_marks import marks_pks

__all__ = [
    "CLOUDWATCH_READ_ACTIONS",
    "GC_PRINCIPAL",
    "OPERATOR_PRINCIPAL",
    "OPERATOR_TABLE_KEYS",
    "OPERATOR_WRITE_PREFIXES",
    "INVENTORY_PREFIX",
    "LEASE_KEYS",
    "LOGS_PREFIX",
    "PIPELINE_JOB_PRINCIPAL",
    "PIPELINE_READ_PREFIXES",
    "PIPELINE_WRITE_PREFIXES",
    "READ_KEYS",
    "S3_DELETE_ACTIONS",
    "SQS_CONSUME_ACTIONS",
    "TABLE_ACTIONS",
    "TRIGGER_QUEUE_ACTIONS",
    "PolicyArns",
    "Statement",
    "function_principal",
    "function_statements",
    "operator_statements",
    "pipeline_job_statements",
    "principals",
    "state_machine_principal",
    "state_machine_statements",
    "trigger_statements",
    "watermark_keys",
]

#: one IAM policy statement, in IAM's JSON shape
Statement = dict[str, Any]

#: the reads of ``table="read"`` and ``"write"``; a write function adds its ``table_writes``
TABLE_ACTIONS: dict[str, tuple[str, ...]] = {
    "none": (),
    "read": ("dynamodb:GetItem", "dynamodb:Query"),
    "write": ("dynamodb:GetItem", "dynamodb:Query"),
}
SQS_CONSUME_ACTIONS = ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes")
CLOUDWATCH_READ_ACTIONS = ("cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics")
#: every S3 delete action (what the bucket policy denies under the protected prefixes)
S3_DELETE_ACTIONS = ("s3:DeleteObject", "s3:DeleteObjectVersion")
#: what CDK's ``SqsEventSource`` grants a queue-triggered function's role on its queue (``grantConsumeMessages``)
TRIGGER_QUEUE_ACTIONS = ("sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueUrl", "sqs:DeleteMessage",
                         "sqs:GetQueueAttributes")

GC_PRINCIPAL = "gc"
PIPELINE_JOB_PRINCIPAL = "pipeline-job"
OPERATOR_PRINCIPAL = "operator"

#: layout prefixes the pipeline jobs read (GET/HEAD) and write (conditional create)
PIPELINE_READ_PREFIXES = layout_roots(
    K.ACCEPTED, K.ACCEPTED_BY_TIME, K.ACCEPTED_BY_BLOB, K.RAW_BLOB, K.RAW_BLOBS_BY_TIME, K.QUARANTINE,
    K.QUARANTINE_BY_BLOB, K.ROLLUP_MANIFEST, K.ROLLUP_PART, K.ROLLUP_INDEX, K.RETENTION_TOMBSTONE, K.AUDIT,
    # the audit's orphan check reads a conflict's resolution (docs/protocol.md §15 G3)
    K.CONFLICT_RESOLUTION)
PIPELINE_WRITE_PREFIXES = layout_roots(K.ROLLUP_PART, K.ROLLUP_INDEX, K.ROLLUP_MANIFEST, K.AUDIT)
#: control-table partitions the jobs touch (docs/control-table.md): the rollup's lease (written),
#: the completeness watermarks the audit proves (raised: docs/protocol.md §13 W6, :func:`watermark_keys`),
#: and those only read: the reconciler's checkpoints, and the reap's marks partitions (each of the
#: shards by name, then ``checkpoint#reap``: an old writer's marks, docs/protocol.md §17)
LEASE_KEYS = ("lease#rollup",)
READ_KEYS = ("checkpoint#reconcile", *marks_pks())
#: in the ops bucket: the inventory reports (the storage stack's destination) and the job runs' logs
INVENTORY_PREFIX = "inventory"
LOGS_PREFIX = "emr/logs/"


def watermark_keys() -> tuple[str, ...]:
    """The completeness watermarks' partition keys (the audit raises them)."""
    from lightmetrics.derived.walk.state import INDEXES, watermark_pk

    return tuple(watermark_pk(index) for index in INDEXES)


@dataclass(frozen=True)
class PolicyArns:
    """The ARNs the statements name: CDK tokens in the stack, the local resources' ARNs locally.

    ``secret`` is the token secret's ARN as IAM names it (``<name>-??????``: Secrets Manager
    appends six random characters); ``queues`` maps every queue and DLQ name of the spec,
    ``state_machines`` and ``functions`` the spec's names, to ARNs; ``executions`` a state
    machine's name to the ARN pattern of its executions (``arn:...:execution:<machine>:*``).
    """

    bucket: str
    namespace: str
    table: str
    secret: str
    queues: Mapping[str, str] = field(default_factory=dict)
    state_machines: Mapping[str, str] = field(default_factory=dict)
    functions: Mapping[str, str] = field(default_factory=dict)
    executions: Mapping[str, str] = field(default_factory=dict)

    def objects(self, prefixes: tuple[str, ...] | list[str]) -> list[str]:
        """Object ARNs ``<bucket>/<namespace><prefix>*``, one per layout prefix."""
        return [f"{self.bucket}/{self.namespace}{p}*" for p in prefixes]

    def list_condition(self, prefixes: tuple[str, ...] | list[str]) -> dict[str, Any]:
        """``s3:ListBucket`` limited to listings under ``prefixes``."""
        return {"StringLike": {"s3:prefix": [self.namespace + p + "*" for p in prefixes]}}


def _allow(actions: Any, resources: list[str], condition: dict[str, Any] | None = None,
           sid: str | None = None) -> Statement:
    out: Statement = {"Sid": sid} if sid else {}
    out.update({"Effect": "Allow", "Action": list(actions), "Resource": resources})
    if condition:
        out["Condition"] = condition
    return out


def function_statements(spec: FunctionSpec, arns: PolicyArns, bucket: BucketSpec | None = None) -> list[Statement]:
    """Everything ``spec`` may do, and nothing else (logs and X-Ray are added with the function)."""
    bucket = bucket or SPEC.bucket
    out: list[Statement] = []
    if spec.s3_read:
        out.append(_allow(["s3:GetObject"], arns.objects(spec.s3_read)))
    if spec.s3_write:
        out.append(_allow(["s3:PutObject"], arns.objects(spec.s3_write)))
    if spec.s3_delete:
        out.append(_allow(["s3:DeleteObject"], arns.objects(spec.s3_delete)))
    if spec.s3_delete_versions:
        out.append(_allow(["s3:DeleteObjectVersion"], arns.objects(spec.s3_delete_versions)))
    if spec.s3_list:
        out.append(_allow(["s3:ListBucket"], [arns.bucket], arns.list_condition(spec.s3_list)))
    if spec.gc_role:
        # GC lists the versions of one blob key (which delete markers it placed) on a crash recovery of
        # recorded intents, a settle of a mark whose marker id was not recorded, and every restore.
        out.append(_allow(["s3:ListBucketVersions"], [arns.bucket], arns.list_condition(bucket.gc_delete_prefixes)))
    if TABLE_ACTIONS[spec.table]:
        out.append(_allow([*TABLE_ACTIONS[spec.table], *(f"dynamodb:{a}" for a in spec.table_writes)], [arns.table]))
    if spec.reads_secret:
        out.append(_allow(["secretsmanager:GetSecretValue"], [arns.secret]))
    if spec.sqs_consume:
        out.append(_allow(SQS_CONSUME_ACTIONS, [arns.queues[n] for n in spec.sqs_consume]))
    if spec.sqs_read_attributes:
        out.append(_allow(["sqs:GetQueueAttributes"], [arns.queues[n] for n in spec.sqs_read_attributes]))
    if spec.cloudwatch_read:
        # CloudWatch metric reads have no resource-level permissions.
        out.append(_allow(CLOUDWATCH_READ_ACTIONS, ["*"]))
    if spec.sfn_start:
        out.append(_allow(["states:StartExecution"], [arns.state_machines[n] for n in spec.sfn_start]))
    if spec.shard_queue:  # the fan-out (SendMessageBatch is authorized as sqs:SendMessage)
        out.append(_allow(["sqs:SendMessage"], [arns.queues[spec.shard_queue]]))
    return out


def trigger_statements(spec: FunctionSpec, arns: PolicyArns) -> list[Statement]:
    """What the stack's event source mapping grants the function's role on its trigger queue or its
    shard queue (CDK adds it with ``SqsEventSource``); locally the event pump polls as the function's
    principal with it."""
    queues = [spec.trigger_arg] if spec.trigger_kind == "queue" else []
    queues += [spec.shard_queue] if spec.shard_queue else []
    return [_allow(TRIGGER_QUEUE_ACTIONS, [arns.queues[q]], sid="EventSourceMapping") for q in queues]


def state_machine_statements(spec: StateMachineSpec, arns: PolicyArns) -> list[Statement]:
    """A state machine's role: ``lambda:InvokeFunction`` on exactly the functions its tasks name."""
    return [_allow(["lambda:InvokeFunction"], [arns.functions[fn] for fn in spec.function_names()])]


def pipeline_job_statements(arns: PolicyArns, *, ops_bucket: str | None = None,
                            bundle_objects: tuple[str, ...] = ()) -> list[Statement]:
    """The pipeline jobs' role (audit and rollup; docs/pipeline.md §7): read the layout, create rollups
    and audits, the rollup lease, the audit's watermarks, read the reconciler's and GC's state. With
    ``ops_bucket``: the inventory reports and the job logs there; ``bundle_objects``: the job's code."""
    out = [
        _allow(["s3:GetObject"], arns.objects(PIPELINE_READ_PREFIXES), sid="ReadLayout"),
        _allow(["s3:PutObject"], arns.objects(PIPELINE_WRITE_PREFIXES), sid="CreateRollupsAndAudits"),
        _allow(["s3:ListBucket"], [arns.bucket], arns.list_condition(PIPELINE_READ_PREFIXES), sid="ListLayout"),
    ]
    if ops_bucket is not None:
        out.append(_allow(["s3:GetObject"], [f"{ops_bucket}/{INVENTORY_PREFIX}/*"], sid="ReadInventory"))
    if bundle_objects:
        out.append(_allow(["s3:GetObject"], list(bundle_objects), sid="ReadJobBundle"))
    if ops_bucket is not None:
        out.append(_allow(["s3:ListBucket"], [ops_bucket], {"StringLike": {"s3:prefix": [f"{INVENTORY_PREFIX}/*"]}},
                          sid="ListInventory"))
        out.append(_allow(["s3:PutObject"], [f"{ops_bucket}/{LOGS_PREFIX}*"], sid="WriteJobLogs"))
    out += [
        _allow(["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"], [arns.table],
               {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": list(LEASE_KEYS)}}, sid="RollupLease"),
        # GetItem: a raise whose answer was lost is read back before it is called unmoved (§11.1 CW1)
        _allow(["dynamodb:GetItem", "dynamodb:UpdateItem"], [arns.table],
               {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": list(watermark_keys())}}, sid="AuditWatermarks"),
        # Read only: the reconciler's checkpoints (which hours are closed) and GC's recorded marks
        # (the audit's blobs in GC's hands, docs/protocol.md §15).
        _allow(["dynamodb:GetItem", "dynamodb:Query"], [arns.table],
               {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": list(READ_KEYS)}},
               sid="ReadCheckpointsAndGcMarks"),
    ]
    return out


#: layout prefixes an operator's commands create in (create-only by the bucket policy): derived entries
#: (``lmctl blockers retry`` re-runs the unit, ``lmctl reconcile`` repairs) and resolution records
#: (``lmctl conflicts resolve``); nothing else, and no delete anywhere
OPERATOR_WRITE_PREFIXES = layout_roots(K.ACCEPTED_BY_TIME, K.ACCEPTED_BY_BLOB, K.RAW_BLOBS_BY_TIME,
                                       K.QUARANTINE_BY_BLOB, K.CONFLICT_RESOLUTION)
#: control-table partitions an operator's commands write (``dynamodb:LeadingKeys``): blocker decisions
#: and the budgets a resume clears, the conflict registry, the denylist and its lifts, a reconciler
#: run's checkpoints and the hour-range plans (``lmctl reconcile plan``)
OPERATOR_TABLE_KEYS = ("blockers", "budget#*", "conflicts", "denylist", "denylist#lifted", "checkpoint#reconcile",
                       "plan#hour-ranges")


def operator_statements(arns: PolicyArns, spec: ResourceSpec = SPEC, *, admin_function: str | None = None,
                        layout: tuple[str, ...] | None = None) -> list[Statement]:
    """What an operator's ``lmctl`` needs (docs/runbook.md, docs/deploy.md "Operators"): start and
    watch walks and reaps, read the control table and write its operator partitions, read the whole
    layout (show, verify, query, conflicts show), create derived entries and resolution records,
    queue depths and the re-sends of ``blockers retry``, the token secret (``agent-token``), metric
    reads (``reconcile`` on AWS); with ``admin_function``, the admin API (its Function URL).
    No delete of any object, no write of an acceptance record, blob, evidence, tombstone or rollup."""
    from lightmetrics.deployment.resource_types import LAYOUT_PREFIXES

    layout = layout or LAYOUT_PREFIXES
    machines = [sm.name for sm in spec.state_machines]
    out = [
        _allow(["states:StartExecution", "states:ListExecutions"], [arns.state_machines[n] for n in machines],
               sid="StartWalksAndReaps"),
        # the history: why a refused start failed, in the task's own words
        _allow(["states:DescribeExecution", "states:GetExecutionHistory"], [arns.executions[n] for n in machines],
               sid="WatchExecutions"),
        _allow(["dynamodb:GetItem", "dynamodb:Query"], [arns.table], sid="ReadControlTable"),
        _allow(["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"], [arns.table],
               {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": list(OPERATOR_TABLE_KEYS)}}, sid="OperatorDecisions"),
        _allow(["s3:GetObject"], arns.objects(layout), sid="ReadLayout"),
        _allow(["s3:ListBucket"], [arns.bucket], arns.list_condition(layout), sid="ListLayout"),
        _allow(["s3:PutObject"], arns.objects(OPERATOR_WRITE_PREFIXES), sid="CreateDerivedEntriesAndResolutions"),
        _allow(["sqs:GetQueueAttributes"], [arns.queues[n] for q in spec.queues for n in (q.name, q.dlq_name)]
               + [arns.queues[n] for sq in spec.shard_queues for n in (sq.name, sq.dlq_name)], sid="QueueDepths"),
        _allow(["sqs:SendMessage"], [arns.queues[q.name] for q in spec.queues], sid="ResendBlockedMessages"),
        _allow(["secretsmanager:GetSecretValue"], [arns.secret], sid="MintAgentTokens"),
        _allow(CLOUDWATCH_READ_ACTIONS, ["*"], sid="ReadQueueMetrics"),  # no resource-level permissions
    ]
    if admin_function is not None:
        out.append(_allow(["lambda:InvokeFunctionUrl"], [admin_function],
                          {"StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}}, sid="AdminApi"))
    return out


def function_principal(spec: FunctionSpec) -> str:
    """The principal a function runs as: the GC role for ``gc_role`` functions, else its own."""
    return GC_PRINCIPAL if spec.gc_role else f"fn-{spec.name}"


def state_machine_principal(spec: StateMachineSpec) -> str:
    return f"sm-{spec.name}"


def principals(arns: PolicyArns, spec: ResourceSpec = SPEC, *, ops_bucket: str | None = None,
               with_triggers: bool = False) -> dict[str, list[Statement]]:
    """Principal name -> its statements, for every role of the stack the local runtime runs code as
    (``with_triggers``: the function roles also get their event source mapping's queue grants)."""
    out: dict[str, list[Statement]] = {}
    for fn in spec.functions:
        statements = function_statements(fn, arns, spec.bucket)
        if with_triggers:
            statements += trigger_statements(fn, arns)
        out.setdefault(function_principal(fn), []).extend(statements)
    for sm in spec.state_machines:
        out[state_machine_principal(sm)] = state_machine_statements(sm, arns)
    out[PIPELINE_JOB_PRINCIPAL] = pipeline_job_statements(arns, ops_bucket=ops_bucket)
    out[OPERATOR_PRINCIPAL] = operator_statements(arns, spec)
    return out
