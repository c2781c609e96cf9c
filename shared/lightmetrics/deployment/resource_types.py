"""The resource spec's vocabulary: what a bucket, table, secret, queue, function and state machine
spec says, and how each renders for CDK and the local provisioner (:mod:`lightmetrics.deployment.resources`
holds the one spec built from them).

Plain frozen dataclasses, stdlib and the key codec's layout roots only: no boto3, no CDK.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lightmetrics.deployment.queue_types import OBJECT_CREATED_EVENT, QueueSpec, ShardQueueSpec
from lightmetrics.protocol.keys import LAYOUT_ROOTS, layout_roots
from lightmetrics.protocol.keys import KeyKind as K  # short: the spec names many kinds
from lightmetrics.protocol.segment_keys import V2_ROOTS

__all__ = [
    "LAYOUT_PREFIXES", "OBJECT_CREATED_EVENT", "READ_ONLY_PREFIXES", "TABLE_WRITES", "TRIGGER_KINDS", "BucketSpec",
    "FunctionSpec", "QueueSpec", "ResourceSpec", "SecretSpec", "ShardQueueSpec", "StateMachineSpec", "TableSpec",
]

AttributeType = Literal["S", "N", "B"]


#: Every top-level prefix of the key layout (docs/protocol.md §3), relative to the namespace: the
#: codec's :data:`~lightmetrics.protocol.keys.LAYOUT_ROOTS`, under the name the spec has always used.
LAYOUT_PREFIXES: tuple[str, ...] = LAYOUT_ROOTS
#: The derived v2 roots (docs/protocol.md §4.10): read (and listed) by the readers that already read
#: v2; no writer writes them yet, so they are not create-only layout prefixes of the bucket policy.
READ_ONLY_PREFIXES: tuple[str, ...] = tuple(V2_ROOTS.values())


@dataclass(frozen=True)
class BucketSpec:
    """The authority bucket. Versioning is required by the GC handshake (docs/protocol.md §15).

    The prefix tuples drive the bucket policy and the lifecycle rules of the CDK stack (all
    relative to the prefix namespace):

    * ``create_only_prefixes``: PutObject without ``If-None-Match`` and copies are denied;
    * ``multipart_prefixes``: the only prefixes where multipart uploads may be started;
    * ``no_delete_prefixes``: DeleteObject/DeleteObjectVersion denied to everyone;
    * ``gc_delete_prefixes``: deletes denied to everyone but the GC role;
    * ``noncurrent_expiry_prefixes``: derived data whose noncurrent versions a lifecycle
      rule expires (never acceptance records, evidence, raw blobs or retention markers).
    """

    logical_name: str = "AuthorityBucket"
    versioned: bool = True
    default_name: str = "lightmetrics-local"
    create_only_prefixes: tuple[str, ...] = LAYOUT_PREFIXES
    multipart_prefixes: tuple[str, ...] = layout_roots(K.RAW_BLOB)
    no_multipart_enforced_prefixes: tuple[str, ...] = layout_roots(K.ACCEPTED)
    no_delete_prefixes: tuple[str, ...] = layout_roots(
        K.ACCEPTED, K.QUARANTINE, K.CONFLICT_RESOLUTION, K.RETENTION_TOMBSTONE)
    gc_delete_prefixes: tuple[str, ...] = layout_roots(K.RAW_BLOB)
    noncurrent_expiry_prefixes: tuple[str, ...] = layout_roots(
        K.RAW_BLOBS_BY_TIME, K.ACCEPTED_BY_TIME, K.ACCEPTED_BY_BLOB, K.QUARANTINE_BY_BLOB,
        K.ROLLUP_MANIFEST, K.ROLLUP_PART, K.ROLLUP_INDEX)

    def __post_init__(self) -> None:
        layout = set(LAYOUT_PREFIXES)
        for field_name in ("create_only_prefixes", "multipart_prefixes", "no_multipart_enforced_prefixes",
                           "no_delete_prefixes", "gc_delete_prefixes", "noncurrent_expiry_prefixes"):
            unknown = set(getattr(self, field_name)) - layout
            if unknown:
                raise ValueError(f"BucketSpec.{field_name}: {sorted(unknown)} are not layout prefixes")
        if set(self.multipart_prefixes) & set(self.no_multipart_enforced_prefixes):
            raise ValueError("a prefix cannot both allow and forbid multipart uploads")
        keep = set(self.no_delete_prefixes) | set(self.gc_delete_prefixes)
        if keep & set(self.noncurrent_expiry_prefixes):
            raise ValueError("lifecycle must never expire versions under protected prefixes")


@dataclass(frozen=True)
class TableSpec:
    """The DynamoDB control table (leases, checkpoints, budgets, blockers, denylist)."""

    logical_name: str = "ControlTable"
    partition_key: tuple[str, AttributeType] = ("pk", "S")
    sort_key: tuple[str, AttributeType] | None = ("sk", "S")
    ttl_attribute: str | None = "expires_at"
    billing: Literal["PAY_PER_REQUEST", "PROVISIONED"] = "PAY_PER_REQUEST"
    default_name: str = "lightmetrics-control"

    def key_schema(self) -> list[dict[str, str]]:
        """``KeySchema`` in the DynamoDB API shape."""
        schema = [{"AttributeName": self.partition_key[0], "KeyType": "HASH"}]
        if self.sort_key is not None:
            schema.append({"AttributeName": self.sort_key[0], "KeyType": "RANGE"})
        return schema

    def attribute_definitions(self) -> list[dict[str, str]]:
        """``AttributeDefinitions`` for the key attributes, in the DynamoDB API shape."""
        keys = [self.partition_key] + ([self.sort_key] if self.sort_key else [])
        return [{"AttributeName": name, "AttributeType": typ} for name, typ in keys]


@dataclass(frozen=True)
class SecretSpec:
    """The HMAC secret(s) for ingest tokens, in Secrets Manager.

    The value is JSON ``{"current": "<key-id>", "keys": {"<key-id>": "<hex>", ...}}`` with at
    most two keys, so that a rotation can keep the old key valid while tokens move over.
    """

    logical_name: str = "IngestTokens"
    default_name: str = "lightmetrics/ingest-tokens"
    max_active_keys: int = 2


TRIGGER_KINDS = ("http", "queue", "schedule", "task")
TableAccess = Literal["none", "read", "write"]
#: a ``table="write"`` function's possible writes (IAM actions; a transaction is authorized item by item)
TABLE_WRITES = ("PutItem", "UpdateItem", "DeleteItem")


@dataclass(frozen=True)
class FunctionSpec:
    """A Lambda function: ``module`` is importable from the repo root or the installed package.

    The remaining fields are declarative: the CDK stack derives the function's trigger, its
    IAM policy (least privilege, nothing else) and its settings from them, and the infra tests
    derive the exact expected IAM sets from the same fields.

    * ``trigger``: ``"http"`` (Lambda Function URL), ``"queue:<queue name>"`` (SQS event source
      with partial-batch responses), ``"schedule:<EventBridge expression>"`` (e.g.
      ``"schedule:rate(5 minutes)"``) or ``"task"`` (invoked by Step Functions or an operator).
    * S3 prefixes are layout prefixes relative to the namespace (``"accepted/v1/"``):
      ``s3_read`` -> ``s3:GetObject`` (GET and HEAD); ``s3_write`` -> ``s3:PutObject`` (the bucket
      policy only lets conditional creates through); ``s3_list`` -> ``s3:ListBucket`` limited by an
      ``s3:prefix`` condition (also what turns a HEAD of a missing key into 404 instead of 403);
      ``s3_delete`` -> ``s3:DeleteObject`` (a delete marker); ``s3_delete_versions`` ->
      ``s3:DeleteObjectVersion`` (a given version or marker gone for good; GC's raw blobs only).
    * ``table``: control-table access (``read``: GetItem/Query; ``write``: also the writes of
      ``table_writes``, those of :data:`TABLE_WRITES` its code makes: tests/test_iam_least_privilege.py).
    * ``reads_secret``: ``secretsmanager:GetSecretValue`` on the token secret.
    * ``sqs_consume`` / ``sqs_read_attributes``: queue or DLQ names of :data:`QUEUES` it receives
      from and deletes on (beyond its own trigger) / whose attributes it reads (of
      :data:`SHARD_QUEUES` too: a function reading a shards queue's depth is told its URL).
    * ``cloudwatch_read``: ``cloudwatch:GetMetricStatistics`` and ``GetMetricData`` (queue age, reconciler).
    * ``sfn_start``: names of :data:`STATE_MACHINES` it may start executions of
      (``states:StartExecution`` on exactly those state machines; the walk continues a long walk
      in a new execution this way).
    * ``gc_role``: run as the GC role, the only principal the bucket policy lets delete under
      ``raw-blobs/v1/``. Deleting there requires it; nothing else may use it.
    * ``reserved_concurrency_param``: name of a deploy-time stack parameter that sets the
      function's reserved concurrency (an operator throttle); ``None`` for no reservation.
    * ``metrics_service``: the Powertools ``service`` the handler's metrics carry (the alarm
      dimension); defaults to ``name``.
    * ``url_auth``: the Function URL's auth type for ``http`` functions: ``"none"`` (ingest: agents
      are not AWS principals and carry HMAC tokens) or ``"iam"`` (admin: SigV4-signed operators;
      the local runtime checks the signature too, :mod:`lightmetrics.local.sigv4`).
    * ``shard_queue``: a ``schedule`` function whose one schedule fans out: each scheduled run sends
      one message ``{"shard": i, "fanout_ns": t}`` per reconciler shard (``LM_RECONCILE_SHARDS``) to this
      :class:`ShardQueueSpec`, which triggers the same function one message at a time (partial-batch
      responses), so N shards take one rule, not N (docs/protocol.md §12 R8).
    """

    name: str
    module: str
    attr: str = "handler"
    trigger: str = "task"
    s3_read: tuple[str, ...] = ()
    s3_write: tuple[str, ...] = ()
    s3_list: tuple[str, ...] = ()
    s3_delete: tuple[str, ...] = ()
    s3_delete_versions: tuple[str, ...] = ()
    table: TableAccess = "none"
    table_writes: tuple[str, ...] = ()
    reads_secret: bool = False
    sqs_consume: tuple[str, ...] = ()
    sqs_read_attributes: tuple[str, ...] = ()
    cloudwatch_read: bool = False
    sfn_start: tuple[str, ...] = ()
    gc_role: bool = False
    reserved_concurrency_param: str | None = None
    timeout_s: int = 30
    memory_mb: int = 512
    batch_size: int = 10  # a queue trigger's SQS batch size (up to 10 without a window, 10,000 with one)
    # a queue trigger's MaximumBatchingWindowInSeconds (0: none, Lambda invokes with what is there)
    batching_window_s: int = 0
    metrics_service: str | None = None
    url_auth: Literal["none", "iam"] = "none"
    shard_queue: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        kind = self.trigger.partition(":")[0]
        if self.shard_queue and kind != "schedule":
            raise ValueError(f"function {self.name!r}: shard_queue needs a 'schedule' trigger")
        if self.url_auth not in ("none", "iam") or (self.url_auth == "iam" and kind != "http"):
            raise ValueError(f"function {self.name!r}: url_auth is 'none' or 'iam', and 'iam' needs trigger 'http'")
        if kind not in TRIGGER_KINDS:
            raise ValueError(f"function {self.name!r}: trigger {self.trigger!r} is not one of {TRIGGER_KINDS}")
        if kind in ("queue", "schedule") and not self.trigger_arg:
            raise ValueError(f"function {self.name!r}: trigger {self.trigger!r} needs ':<argument>'")
        if kind in ("http", "task") and self.trigger_arg:
            raise ValueError(f"function {self.name!r}: trigger {kind!r} takes no argument")
        for field_name in ("s3_read", "s3_write", "s3_list", "s3_delete", "s3_delete_versions"):
            readable = READ_ONLY_PREFIXES if field_name in ("s3_read", "s3_list") else ()
            unknown = set(getattr(self, field_name)) - set(LAYOUT_PREFIXES) - set(readable)
            if unknown:
                raise ValueError(f"function {self.name!r}: {field_name} {sorted(unknown)} are not layout prefixes")
        if self.table not in ("none", "read", "write"):
            raise ValueError(f"function {self.name!r}: table access must be none, read or write")
        if (self.table == "write") != bool(self.table_writes) or not set(self.table_writes) <= set(TABLE_WRITES) \
                or not set(self.s3_delete_versions) <= set(self.s3_delete):
            raise ValueError(f"function {self.name!r}: table 'write' names its table_writes (of {TABLE_WRITES}); "
                             "s3_delete_versions are among its s3_delete prefixes")
        deletes = set(self.s3_delete)
        if deletes & set(BucketSpec().no_delete_prefixes):
            raise ValueError(f"function {self.name!r}: nothing may delete under {sorted(BucketSpec().no_delete_prefixes)}")
        if deletes & set(BucketSpec().gc_delete_prefixes) and not self.gc_role:
            raise ValueError(f"function {self.name!r}: only the GC role may delete raw blobs (set gc_role=True)")
        if not 1 <= self.timeout_s <= 900 or not 128 <= self.memory_mb <= 10240:
            raise ValueError(f"function {self.name!r}: timeout 1-900 s, memory 128-10240 MB")
        # Lambda's SQS event source: a window of 0-300 s; batches of 1-10 without one, 1-10,000 with one
        if not 0 <= self.batching_window_s <= 300 or not 1 <= self.batch_size <= (
                10_000 if self.batching_window_s else 10):
            raise ValueError(f"function {self.name!r}: batching window 0-300 s, batch size 1-10 (1-10,000 with a window)")

    @property
    def handler_string(self) -> str:
        """The Lambda ``Handler`` setting (``module.attr``)."""
        return f"{self.module}.{self.attr}"

    @property
    def trigger_kind(self) -> str:
        """``http``, ``queue``, ``schedule`` or ``task``."""
        return self.trigger.partition(":")[0]

    @property
    def trigger_arg(self) -> str:
        """The queue name or schedule expression of the trigger ("" for http/task)."""
        return self.trigger.partition(":")[2]

    @property
    def service(self) -> str:
        """The Powertools service name (the ``service`` metric dimension)."""
        return self.metrics_service or self.name

    def schedule_period_s(self) -> int | None:
        """The period of a ``schedule:rate(...)`` trigger in seconds (None for a cron or no schedule).

        >>> from lightmetrics.deployment.resources import SPEC
        >>> SPEC.function("reconcile").schedule_period_s(), SPEC.function("ingest").schedule_period_s()
        (300, None)
        """
        expression = self.trigger_arg if self.trigger_kind == "schedule" else ""
        if not (expression.startswith("rate(") and expression.endswith(")")):
            return None
        count, unit = expression[5:-1].split()
        return int(count) * {"minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "day": 86400,
                             "days": 86400}[unit]


@dataclass(frozen=True)
class StateMachineSpec:
    """A Step Functions state machine whose ASL lives in ``infra/statemachines/<definition>``.

    * ``name``: the logical name used by the CLI and in ``LM_STATE_MACHINE_ARNS`` (``bootstrap-walk``);
    * ``logical_name``: the CDK construct id and the suffix of the physical name
      (``<stack>-<logical_name>`` in AWS, ``<name prefix><logical_name>`` locally);
    * ``substitutions``: ``(placeholder, function name)`` pairs: every ``${placeholder}`` in the
      definition is the ARN of that :class:`FunctionSpec`. CDK fills them with definition
      substitutions, the local runtime with the local function ARNs — one map, one loader
      (:mod:`lightmetrics.operator_tools.statemachines`);
    * ``schedule`` / ``schedule_input``: an EventBridge schedule expression and the execution
      input it sends (JSON text, every field explicit), or None for manual starts only;
      ``disabled_schedule`` / ``disabled_schedule_input``: one more, deployed disabled;
      ``no_inventory_schedule_input``: the schedule's input on a bucket without S3 Inventory, where
      it differs (``schedules.schedule_input``).
    """

    name: str
    logical_name: str
    definition: str
    substitutions: tuple[tuple[str, str], ...] = ()
    schedule: str | None = None
    schedule_input: str | None = None
    #: a second schedule deployed disabled (an operator enables it deliberately), e.g. retention
    disabled_schedule: str | None = None
    disabled_schedule_input: str | None = None
    #: the input where no S3 Inventory (so no audit) runs, if not ``schedule_input``: GC's candidates
    no_inventory_schedule_input: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if not self.definition.endswith(".asl.json") or "/" in self.definition:
            raise ValueError(f"state machine {self.name!r}: definition must be a file name ending in .asl.json")
        placeholders = [p for p, _ in self.substitutions]
        if len(set(placeholders)) != len(placeholders):
            raise ValueError(f"state machine {self.name!r}: duplicate placeholders")
        for p in placeholders:
            if not p.isidentifier():
                raise ValueError(f"state machine {self.name!r}: placeholder {p!r} is not an identifier")
        for text in (self.schedule_input, self.disabled_schedule_input, self.no_inventory_schedule_input):
            if text is not None:
                json.loads(text)  # must be valid JSON

    def substitution_map(self) -> dict[str, str]:
        """placeholder -> function name."""
        return dict(self.substitutions)

    def function_names(self) -> tuple[str, ...]:
        """The functions its tasks invoke (each once, in placeholder order)."""
        return tuple(dict.fromkeys(fn for _, fn in self.substitutions))


@dataclass(frozen=True)
class ResourceSpec:
    """Everything the stack (or the local runtime) provisions."""

    bucket: BucketSpec = field(default_factory=BucketSpec)
    table: TableSpec = field(default_factory=TableSpec)
    secret: SecretSpec = field(default_factory=SecretSpec)
    queues: tuple[QueueSpec, ...] = ()
    functions: tuple[FunctionSpec, ...] = ()
    #: queues the functions' fan-outs send on (``FunctionSpec.shard_queue``), not fed by S3
    shard_queues: tuple[ShardQueueSpec, ...] = ()
    state_machines: tuple[StateMachineSpec, ...] = ()

    def __post_init__(self) -> None:
        names = [f.name for f in self.functions]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate function names in {names}")
        queue_names = {q.name for q in self.queues}
        all_queues = queue_names | {q.dlq_name for q in self.queues}
        shard_queues = {q.name for q in self.shard_queues}
        every = all_queues | shard_queues | {q.dlq_name for q in self.shard_queues}
        if len(every) != 2 * (len(self.queues) + len(self.shard_queues)):
            raise ValueError("queue and DLQ names must all be distinct")
        for fn in self.functions:
            if fn.trigger_kind == "queue" and fn.trigger_arg not in queue_names:
                raise ValueError(f"function {fn.name!r} is triggered by unknown queue {fn.trigger_arg!r}")
            if fn.shard_queue and fn.shard_queue not in shard_queues:
                raise ValueError(f"function {fn.name!r} fans out on unknown shard queue {fn.shard_queue!r}")
            # a shards queue's depth (and its DLQ's) may be read (status), never consumed but by its trigger
            unknown = (set(fn.sqs_consume) - all_queues) | (set(fn.sqs_read_attributes) - every)
            if unknown:
                raise ValueError(f"function {fn.name!r} names unknown queues {sorted(unknown)}")
        sm_names = [sm.name for sm in self.state_machines]
        if len(set(sm_names)) != len(sm_names):
            raise ValueError(f"duplicate state machine names in {sm_names}")
        by_name = {fn.name: fn for fn in self.functions}
        for sm in self.state_machines:
            for _, fn_name in sm.substitutions:
                if fn_name not in by_name:
                    raise ValueError(f"state machine {sm.name!r} invokes unknown function {fn_name!r}")
                if by_name[fn_name].trigger_kind != "task":
                    raise ValueError(f"state machine {sm.name!r}: function {fn_name!r} must have trigger 'task'")
        for fn in self.functions:
            unknown = set(fn.sfn_start) - set(sm_names)
            if unknown:
                raise ValueError(f"function {fn.name!r} may start unknown state machines {sorted(unknown)}")

    def function(self, name: str) -> FunctionSpec:
        """The function spec called ``name`` (KeyError if none)."""
        for fn in self.functions:
            if fn.name == name:
                return fn
        raise KeyError(f"no function {name!r} in the resource spec")

    def state_machine(self, name: str) -> StateMachineSpec:
        """The state machine spec called ``name`` (KeyError if none)."""
        for sm in self.state_machines:
            if sm.name == name:
                return sm
        raise KeyError(f"no state machine {name!r} in the resource spec")

    def shard_queue(self, name: str) -> ShardQueueSpec:
        """The shard queue spec called ``name`` (KeyError if none)."""
        for q in self.shard_queues:
            if q.name == name:
                return q
        raise KeyError(f"no shard queue {name!r} in the resource spec")

    def queue(self, name: str) -> QueueSpec:
        """The queue spec called ``name`` (KeyError if none)."""
        for q in self.queues:
            if q.name == name:
                return q
        raise KeyError(f"no queue {name!r} in the resource spec")

    def notification_configuration(
        self, queue_arns: Mapping[str, str], *, namespace: str = ""
    ) -> dict[str, Any]:
        """The bucket's whole ``NotificationConfiguration``, from queue name -> queue ARN."""
        configs = [q.s3_notification(queue_arns[q.name], namespace=namespace) for q in self.queues]
        return {"QueueConfigurations": configs} if configs else {}
