"""The one resource spec that the CDK app and the local provisioner both read.

Plain frozen dataclasses and stdlib only: no boto3, no CDK. The CDK stack maps each spec onto
constructs; :mod:`lightmetrics.local.provision` maps it onto API calls against moto. Physical
names come from configuration at run time (``LM_BUCKET``, ``LM_TABLE``, ``LM_AUTH_SECRET_ID``);
the ``default_name`` of each spec is only the local default.

Example::

    >>> from lightmetrics.deployment.resources import SPEC
    >>> SPEC.table.key_schema()
    [{'AttributeName': 'pk', 'KeyType': 'HASH'}, {'AttributeName': 'sk', 'KeyType': 'RANGE'}]
    >>> SPEC.function("ingest").handler_string
    'functions.ingest.app.handler'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "BUCKET",
    "LAYOUT_PREFIXES",
    "TRIGGER_KINDS",
    "FUNCTIONS",
    "OBJECT_CREATED_EVENT",
    "QUEUES",
    "SECRET",
    "SPEC",
    "STATE_MACHINES",
    "TABLE",
    "BucketSpec",
    "FunctionSpec",
    "QueueSpec",
    "ResourceSpec",
    "SecretSpec",
    "StateMachineSpec",
    "TableSpec",
]

#: The only S3 event the system subscribes to: every write is a create (docs/protocol.md §10).
OBJECT_CREATED_EVENT = "s3:ObjectCreated:*"

AttributeType = Literal["S", "N", "B"]


#: Every top-level prefix of the key layout (docs/protocol.md §3), relative to the namespace.
#: ``lightmetrics.protocol.keys.PREFIXES`` is the codec's view of the same list; a test keeps them equal.
LAYOUT_PREFIXES: tuple[str, ...] = (
    "raw-blobs/v1/",
    "raw-blobs-by-time/v1/",
    "accepted/v1/",
    "accepted-by-time/v1/",
    "accepted-by-blob/v1/",
    "quarantine/v1/",
    "quarantine-by-blob/v1/",
    "conflict-resolutions/v1/",
    "manifests/v1/",
    "rollup/v1/",
    "index/v1/",
    "retention/v1/",
    "audit/v1/",
)


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
    multipart_prefixes: tuple[str, ...] = ("raw-blobs/v1/",)
    no_multipart_enforced_prefixes: tuple[str, ...] = ("accepted/v1/",)
    no_delete_prefixes: tuple[str, ...] = (
        "accepted/v1/",
        "quarantine/v1/",
        "conflict-resolutions/v1/",
        "retention/v1/",
    )
    gc_delete_prefixes: tuple[str, ...] = ("raw-blobs/v1/",)
    noncurrent_expiry_prefixes: tuple[str, ...] = (
        "raw-blobs-by-time/v1/",
        "accepted-by-time/v1/",
        "accepted-by-blob/v1/",
        "quarantine-by-blob/v1/",
        "manifests/v1/",
        "rollup/v1/",
        "index/v1/",
    )

    def __post_init__(self) -> None:
        layout = set(LAYOUT_PREFIXES)
        for field_name in (
            "create_only_prefixes",
            "multipart_prefixes",
            "no_multipart_enforced_prefixes",
            "no_delete_prefixes",
            "gc_delete_prefixes",
            "noncurrent_expiry_prefixes",
        ):
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


@dataclass(frozen=True)
class QueueSpec:
    """An SQS queue fed by S3 ``ObjectCreated`` notifications under one key prefix, with a DLQ.

    ``prefix`` is relative to the prefix namespace (``LM_PREFIX``); the notification filter is
    ``namespace + prefix``.
    """

    name: str
    prefix: str
    dlq_name: str
    max_receive_count: int = 5
    visibility_timeout_s: int = 60
    events: tuple[str, ...] = (OBJECT_CREATED_EVENT,)

    def s3_notification(self, queue_arn: str, *, namespace: str = "") -> dict[str, Any]:
        """One ``QueueConfigurations`` entry of ``PutBucketNotificationConfiguration``."""
        return {
            "Id": self.name,
            "QueueArn": queue_arn,
            "Events": list(self.events),
            "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": namespace + self.prefix}]}},
        }

    def redrive_policy(self, dlq_arn: str) -> str:
        """The queue's ``RedrivePolicy`` attribute (a JSON string, as SQS wants it)."""
        return json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(self.max_receive_count)})


TRIGGER_KINDS = ("http", "queue", "schedule", "task")
TableAccess = Literal["none", "read", "write"]


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
      ``s3_delete`` -> ``s3:DeleteObject`` and ``s3:DeleteObjectVersion``.
    * ``table``: control-table access (``read``: GetItem/Query; ``write``: also Put/Update/Delete).
    * ``reads_secret``: ``secretsmanager:GetSecretValue`` on the token secret.
    * ``sqs_consume`` / ``sqs_read_attributes``: queue or DLQ names of :data:`QUEUES` it receives
      from and deletes on (beyond its own trigger) / whose attributes it reads.
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
    * ``schedule_per_shard``: a ``schedule`` function runs once per reconciler shard
      (``LM_RECONCILE_SHARDS``): one schedule each, with the input ``{"shard": i}``
      (:meth:`schedule_inputs`; docs/protocol.md §12 R8).
    """

    name: str
    module: str
    attr: str = "handler"
    trigger: str = "task"
    s3_read: tuple[str, ...] = ()
    s3_write: tuple[str, ...] = ()
    s3_list: tuple[str, ...] = ()
    s3_delete: tuple[str, ...] = ()
    table: TableAccess = "none"
    reads_secret: bool = False
    sqs_consume: tuple[str, ...] = ()
    sqs_read_attributes: tuple[str, ...] = ()
    cloudwatch_read: bool = False
    sfn_start: tuple[str, ...] = ()
    gc_role: bool = False
    reserved_concurrency_param: str | None = None
    timeout_s: int = 30
    memory_mb: int = 512
    batch_size: int = 10
    metrics_service: str | None = None
    url_auth: Literal["none", "iam"] = "none"
    schedule_per_shard: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        kind = self.trigger.partition(":")[0]
        if self.schedule_per_shard and kind != "schedule":
            raise ValueError(f"function {self.name!r}: schedule_per_shard needs a 'schedule' trigger")
        if self.url_auth not in ("none", "iam") or (self.url_auth == "iam" and kind != "http"):
            raise ValueError(f"function {self.name!r}: url_auth is 'none' or 'iam', and 'iam' needs trigger 'http'")
        if kind not in TRIGGER_KINDS:
            raise ValueError(f"function {self.name!r}: trigger {self.trigger!r} is not one of {TRIGGER_KINDS}")
        if kind in ("queue", "schedule") and not self.trigger_arg:
            raise ValueError(f"function {self.name!r}: trigger {self.trigger!r} needs ':<argument>'")
        if kind in ("http", "task") and self.trigger_arg:
            raise ValueError(f"function {self.name!r}: trigger {kind!r} takes no argument")
        for field_name in ("s3_read", "s3_write", "s3_list", "s3_delete"):
            unknown = set(getattr(self, field_name)) - set(LAYOUT_PREFIXES)
            if unknown:
                raise ValueError(f"function {self.name!r}: {field_name} {sorted(unknown)} are not layout prefixes")
        if self.table not in ("none", "read", "write"):
            raise ValueError(f"function {self.name!r}: table access must be none, read or write")
        deletes = set(self.s3_delete)
        if deletes & set(BucketSpec().no_delete_prefixes):
            raise ValueError(f"function {self.name!r}: nothing may delete under {sorted(BucketSpec().no_delete_prefixes)}")
        if deletes & set(BucketSpec().gc_delete_prefixes) and not self.gc_role:
            raise ValueError(f"function {self.name!r}: only the GC role may delete raw blobs (set gc_role=True)")
        if not 1 <= self.timeout_s <= 900 or not 128 <= self.memory_mb <= 10240:
            raise ValueError(f"function {self.name!r}: timeout 1-900 s, memory 128-10240 MB")

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

    def schedule_inputs(self, shards: int) -> list[dict[str, int] | None]:
        """The input of each of this function's schedules: ``{"shard": i}`` for each of ``shards``
        shards if :attr:`schedule_per_shard`, else one schedule sending EventBridge's own event (None).

        >>> SPEC.function("reconcile").schedule_inputs(2), SPEC.function("sweep-dlq").schedule_inputs(2)
        ([{'shard': 0}, {'shard': 1}], [None])
        """
        return [{"shard": i} for i in range(shards)] if self.schedule_per_shard else [None]


@dataclass(frozen=True)
class StateMachineSpec:
    """A Step Functions state machine whose ASL lives in ``infra/statemachines/<definition>``.

    * ``name``: the logical name used by the CLI and in ``LM_STATE_MACHINE_ARNS`` (``bootstrap-walk``);
    * ``logical_name``: the CDK construct id and the suffix of the physical name
      (``<stack>-<logical_name>`` in AWS, ``<name prefix><logical_name>`` locally);
    * ``substitutions``: ``(placeholder, function name)`` pairs: every ``${placeholder}`` in the
      definition is the ARN of that :class:`FunctionSpec`. CDK fills them with definition
      substitutions, the local runtime with the local function ARNs — one map, one loader
      (:mod:`lightmetrics.deployment.statemachines`);
    * ``schedule`` / ``schedule_input``: an EventBridge schedule expression and the execution
      input it sends (JSON text, every field explicit), or None for manual starts only;
      ``disabled_schedule`` / ``disabled_schedule_input``: one more, deployed disabled.
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
        for text in (self.schedule_input, self.disabled_schedule_input):
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
    state_machines: tuple[StateMachineSpec, ...] = ()

    def __post_init__(self) -> None:
        names = [f.name for f in self.functions]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate function names in {names}")
        queue_names = {q.name for q in self.queues}
        all_queues = queue_names | {q.dlq_name for q in self.queues}
        if len(all_queues) != 2 * len(self.queues):
            raise ValueError("queue and DLQ names must all be distinct")
        for fn in self.functions:
            if fn.trigger_kind == "queue" and fn.trigger_arg not in queue_names:
                raise ValueError(f"function {fn.name!r} is triggered by unknown queue {fn.trigger_arg!r}")
            unknown = (set(fn.sqs_consume) | set(fn.sqs_read_attributes)) - all_queues
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


BUCKET = BucketSpec()
TABLE = TableSpec()
SECRET = SecretSpec()
#: The event path (docs/protocol.md §10): one queue per authoritative prefix, each with its DLQ.
QUEUES: tuple[QueueSpec, ...] = (
    QueueSpec("index-accepted", "accepted/v1/", "index-accepted-dlq", max_receive_count=5, visibility_timeout_s=120),
    QueueSpec("index-raw-blobs", "raw-blobs/v1/", "index-raw-blobs-dlq", max_receive_count=5, visibility_timeout_s=120),
    QueueSpec("index-quarantine", "quarantine/v1/", "index-quarantine-dlq", max_receive_count=5,
              visibility_timeout_s=120),
)

FUNCTIONS: tuple[FunctionSpec, ...] = (
    FunctionSpec(
        "ingest",
        "functions.ingest.app",
        "handler",
        trigger="http",
        # Blob, acceptance record, conflict evidence: conditional creates only.
        s3_write=("raw-blobs/v1/", "accepted/v1/", "quarantine/v1/"),
        # GET of an existing record, HEAD of a pre-existing blob, HEAD of a resolution record.
        s3_read=("accepted/v1/", "raw-blobs/v1/", "conflict-resolutions/v1/"),
        # So that a missing key is a 404, not a 403.
        s3_list=("accepted/v1/", "raw-blobs/v1/", "conflict-resolutions/v1/"),
        reads_secret=True,
        table="read",  # the identity denylist: one Query per LM_DENYLIST_TTL_S into a cache, never per request
        reserved_concurrency_param="IngestReservedConcurrency",
        timeout_s=60,
        memory_mb=1024,
        description="Accepts metric batches: authenticate, validate, conditional creates in S3",
    ),
    FunctionSpec(
        "admin",
        "functions.admin.app",
        "handler",
        trigger="http",
        url_auth="iam",  # operators sign with SigV4; nothing else can reach it
        # Evidence (GET) and resolution records (GET; conditional create, write-once).
        s3_read=("quarantine/v1/", "conflict-resolutions/v1/"),
        s3_write=("conflict-resolutions/v1/",),
        s3_list=("quarantine/v1/", "conflict-resolutions/v1/"),
        table="write",  # conflict registry, denylist, blockers, status reads
        sqs_read_attributes=tuple(n for q in QUEUES for n in (q.name, q.dlq_name)),  # status: queue depths
        timeout_s=30,
        description="Admin API (IAM auth): identity conflicts, resolutions, denylist, blockers, status",
    ),
    FunctionSpec(
        "index-accepted",
        "functions.index_accepted.app",
        trigger="queue:index-accepted",
        s3_read=("accepted/v1/", "retention/v1/"),  # the record; the hour's tombstone (HEAD)
        s3_write=("accepted-by-time/v1/", "accepted-by-blob/v1/"),
        s3_list=("accepted/v1/", "retention/v1/"),
        table="write",  # retry budgets and blockers
        timeout_s=60,
        description="Indexes acceptance records: accepted-by-time and accepted-by-blob",
    ),
    FunctionSpec(
        "index-raw-blobs",
        "functions.index_raw_blobs.app",
        trigger="queue:index-raw-blobs",
        s3_read=("raw-blobs/v1/", "retention/v1/"),  # HEAD for LastModified and identity metadata
        s3_write=("raw-blobs-by-time/v1/",),
        s3_list=("raw-blobs/v1/", "retention/v1/"),
        table="write",
        timeout_s=60,
        description="Indexes raw blobs (orphans too): raw-blobs-by-time",
    ),
    FunctionSpec(
        "index-quarantine",
        "functions.index_quarantine.app",
        trigger="queue:index-quarantine",
        s3_read=("quarantine/v1/",),
        s3_write=("quarantine-by-blob/v1/",),
        s3_list=("quarantine/v1/",),
        table="write",
        timeout_s=60,
        description="Indexes identity-conflict evidence: quarantine-by-blob",
    ),
    FunctionSpec(
        "reconcile",
        "functions.reconcile.app",
        trigger="schedule:rate(5 minutes)",
        # reads and lists raw-blobs-by-time and accepted-by-blob: an entry is checked against the
        # blob listing, and the repair HEADs an entry before writing it (protocol §12)
        s3_read=("accepted-by-time/v1/", "accepted/v1/", "raw-blobs/v1/", "retention/v1/", "accepted-by-blob/v1/",
                 "raw-blobs-by-time/v1/"),
        s3_write=("accepted-by-time/v1/", "accepted-by-blob/v1/", "raw-blobs-by-time/v1/"),
        s3_list=("accepted-by-time/v1/", "accepted/v1/", "raw-blobs/v1/", "retention/v1/", "raw-blobs-by-time/v1/"),
        table="write",  # checkpoint, budgets, blockers
        sqs_read_attributes=tuple(n for q in QUEUES for n in (q.name, q.dlq_name)),
        cloudwatch_read=True,  # ApproximateAgeOfOldestMessage decides when an hour may close
        timeout_s=900,
        memory_mb=1024,
        schedule_per_shard=True,  # one schedule per shard, input {"shard": i} (protocol §12 R8)
        description="Steady-state reconciler: repairs derived state from a DynamoDB checkpoint",
    ),
    FunctionSpec(
        "sweep-dlq",
        "functions.sweep_dlq.app",
        trigger="schedule:rate(5 minutes)",
        table="write",
        sqs_consume=tuple(q.dlq_name for q in QUEUES),
        timeout_s=300,
        description="Turns every dead-lettered index message into a blocker",
    ),
    # The bootstrap walk's Step Functions tasks (docs/walks.md): thin shells over lightmetrics.derived.walk.
    FunctionSpec(
        "walk-begin",
        "functions.walk_begin.app",
        trigger="task",
        table="write",  # the walk lease and checkpoint
        timeout_s=60,
        description="Bootstrap walk: take the lease; start a new epoch, resume one, or continue an execution",
    ),
    FunctionSpec(
        "walk-plan",
        "functions.walk_plan.app",
        trigger="task",
        # Partitions (agent, then boot) by ListObjectsV2 with a Delimiter. Stray keys outside the
        # layout become blockers without being read.
        s3_list=("accepted/v1/", "quarantine/v1/"),
        table="write",  # lease, checkpoint, blockers
        timeout_s=120,
        description="Bootstrap walk: finished partitions out, the next ones in; routes the loop",
    ),
    FunctionSpec(
        "walk-page",
        "functions.walk_page.app",
        trigger="task",
        # repair_accepted / index_quarantine: the records, blobs (HEAD) and tombstones (HEAD); a
        # record's accepted-by-time entry (HEAD, or a LIST of its hour and boot: §13 W5) ...
        s3_read=("accepted/v1/", "quarantine/v1/", "raw-blobs/v1/", "retention/v1/", "accepted-by-time/v1/"),
        # ... and every derived entry they hang off (conditional creates only).
        s3_write=("accepted-by-time/v1/", "accepted-by-blob/v1/", "raw-blobs-by-time/v1/", "quarantine-by-blob/v1/"),
        # One page of a partition; and a missing blob, tombstone or entry must be a 404, not a 403.
        s3_list=("accepted/v1/", "quarantine/v1/", "raw-blobs/v1/", "retention/v1/", "accepted-by-time/v1/"),
        table="write",  # lease, checkpoint, retry budgets, blockers
        timeout_s=300,
        memory_mb=1024,
        description="Bootstrap walk: one page of one partition, every key repaired, then the checkpoint",
    ),
    FunctionSpec(
        "walk-continue",
        "functions.walk_continue.app",
        trigger="task",
        table="write",  # records the next execution in the checkpoint
        sfn_start=("bootstrap-walk",),  # the same state machine, under the same lease and epoch
        timeout_s=60,
        description="Bootstrap walk: continue in a new execution (stays under the history limit)",
    ),
    FunctionSpec(
        "walk-end",
        "functions.walk_end.app",
        trigger="task",
        table="write",  # checkpoint, lease release, completeness watermarks
        timeout_s=60,
        description="Bootstrap walk: finish (watermark) or record a failure; release the lease",
    ),
    # The reap's Step Functions tasks (docs/reaps.md): thin shells over lightmetrics.reaps.
    FunctionSpec(
        "reap-begin",
        "functions.reap_begin.app",
        trigger="task",
        # Retention without --hour lists accepted-by-time's hours and HEADs their reaped markers; GC
        # with audit_run "latest" lists the audits' commit markers (audit/v1/committed/, rule G-B3).
        s3_read=("retention/v1/",),
        s3_list=("accepted-by-time/v1/", "manifests/v1/", "retention/v1/", "audit/v1/"),
        table="write",  # the reap lease and checkpoint
        timeout_s=60,
        description="Reap: validate the input (dry_run explicit), take the lease, write the checkpoint",
    ),
    FunctionSpec(
        "reap-gc",
        "functions.reap_gc.app",
        trigger="task",
        # The proof reads only authoritative keys: the blob (HEAD), its acceptance record (GET), the
        # conflict evidence and resolution (HEAD), the hour's tombstone (HEAD); candidates come from
        # raw-blobs/ or raw-blobs-by-time/ listings or the Spark audit's orphan-blob-candidates
        # (audit/v1/), retention's from the hour's accepted-by-time.
        s3_read=("raw-blobs/v1/", "accepted/v1/", "quarantine/v1/", "conflict-resolutions/v1/", "retention/v1/",
                 "accepted-by-time/v1/", "audit/v1/"),
        s3_list=("raw-blobs/v1/", "raw-blobs-by-time/v1/", "accepted/v1/", "quarantine/v1/",
                 "conflict-resolutions/v1/", "retention/v1/", "accepted-by-time/v1/", "audit/v1/"),
        # The one blob deleter (delete markers, then exactly the captured versions) and the blob's
        # raw-blobs-by-time hint, which goes with it.
        s3_delete=("raw-blobs/v1/", "raw-blobs-by-time/v1/"),
        gc_role=True,
        table="write",  # lease, checkpoint (intents and marks)
        timeout_s=600,
        memory_mb=1024,
        description="Reap (GC role, the only raw-blob deleter): prove and mark a page of blobs, or settle marks",
    ),
    FunctionSpec(
        "reap-retention",
        "functions.reap_retention.app",
        trigger="task",
        # The hour's acceptance records are the authority for which accepted-by-blob entry to delete
        # (read only; listing them keeps a vanished record a 404, not a 403: protocol §16 R-I5).
        s3_read=("accepted/v1/", "accepted-by-time/v1/", "retention/v1/"),
        # Tombstones and reaped markers: conditional creates, never deleted.
        s3_write=("retention/v1/",),
        s3_list=("accepted/v1/", "accepted-by-time/v1/", "accepted-by-blob/v1/", "retention/v1/", "rollup/v1/",
                 "index/v1/", "manifests/v1/"),
        # Derived prefixes only: the retention role can delete no blob and no acceptance record.
        # Rollup retention (scope rollup): chunks, chunk indexes, then generation manifests.
        s3_delete=("accepted-by-time/v1/", "accepted-by-blob/v1/", "rollup/v1/", "index/v1/", "manifests/v1/"),
        table="write",  # lease, checkpoint, retention records; reads the completeness watermark
        timeout_s=600,
        description="Reap (retention role): tombstone an expired hour, delete its derived entries, mark it reaped",
    ),
    FunctionSpec(
        "reap-continue",
        "functions.reap_continue.app",
        trigger="task",
        table="write",  # renews the lease, records the next execution in the checkpoint
        sfn_start=("reap",),  # the same state machine, under the same lease and epoch
        timeout_s=60,
        description="Reap: continue in a new execution (stays under the history limit)",
    ),
    FunctionSpec(
        "reap-end",
        "functions.reap_end.app",
        trigger="task",
        table="write",  # checkpoint, lease release
        timeout_s=60,
        description="Reap: the final report (examined, marked, purged, restored, kept and why); release the lease",
    ),
)

#: Step Functions state machines; their ASL is in infra/statemachines/ (docs/walks.md).
STATE_MACHINES: tuple[StateMachineSpec, ...] = (
    StateMachineSpec(
        "bootstrap-walk",
        "BootstrapWalk",
        "bootstrap_walk.asl.json",
        substitutions=(
            ("WalkBeginFunctionArn", "walk-begin"),
            ("WalkPlanFunctionArn", "walk-plan"),
            ("WalkPageFunctionArn", "walk-page"),
            ("WalkContinueFunctionArn", "walk-continue"),
            ("WalkEndFunctionArn", "walk-end"),
        ),
        # Weekly, Sunday 03:00 UTC: a full walk (the only kind that moves the watermark).
        schedule="cron(0 3 ? * SUN *)",
        schedule_input=json.dumps(
            {"agent": None, "resume": False, "page_size": 10000, "parallelism": 40}, sort_keys=True
        ),
        description="Bootstrap walk: complete, resumable cold reconciliation of accepted/v1/ and quarantine/v1/",
    ),
    StateMachineSpec(
        "reap",
        "Reap",
        "reap.asl.json",
        substitutions=(
            ("ReapBeginFunctionArn", "reap-begin"),
            ("ReapGcFunctionArn", "reap-gc"),
            ("ReapRetentionFunctionArn", "reap-retention"),
            ("ReapContinueFunctionArn", "reap-continue"),
            ("ReapEndFunctionArn", "reap-end"),
        ),
        # Daily GC at 04:00 UTC. It deletes (dry_run false, stated explicitly): every deletion is
        # proven from authoritative reads and goes through the delete-marker handshake. Its
        # candidates are the newest committed weekly audit's orphan-blob-candidates (rule G-B3), so
        # its cost follows the orphans, not the blobs: each audit run is proven once, and a day with
        # no new audit costs one listing. At most max_pages pages a run (a run ends; the next day's goes
        # on from the audit's cursor): 2,000 pages of 500 = 1 M orphans a day, 10x the orphans of a
        # fleet at 1,000 batches/s with 0.1% of them orphaned (docs/performance.md); a normal day's
        # run takes what that day's orphans take.
        schedule="cron(0 4 * * ? *)",
        schedule_input=json.dumps({"mode": "gc", "dry_run": False, "source": "audit", "audit_run": "latest",
                                   "max_pages": 2000}, sort_keys=True),
        # Retention deletes data by policy: its schedule is deployed DISABLED until an operator
        # sets LM_RETENTION_S deliberately and enables the rule (docs/reaps.md).
        disabled_schedule="cron(0 5 * * ? *)",
        disabled_schedule_input=json.dumps({"mode": "retention", "dry_run": False, "hour": None, "page_size": 1000},
                                           sort_keys=True),
        description="Reap: GC of orphan raw blobs (mode gc) and retention of expired hours (mode retention)",
    ),
)

SPEC = ResourceSpec(
    bucket=BUCKET, table=TABLE, secret=SECRET, queues=QUEUES, functions=FUNCTIONS, state_machines=STATE_MACHINES
)
