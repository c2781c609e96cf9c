"""The one resource spec that the CDK app and the local provisioner both read.

Plain frozen dataclasses and stdlib only: no boto3, no CDK. The CDK stack maps each spec onto
constructs; :mod:`lightmetrics.local.provision` maps it onto API calls against moto. Physical
names come from configuration at run time (``LM_BUCKET``, ``LM_TABLE``, ``LM_AUTH_SECRET_ID``);
the ``default_name`` of each spec is only the local default.

Example::

    >>> from lightmetrics.resources import SPEC
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
    "FUNCTIONS",
    "OBJECT_CREATED_EVENT",
    "QUEUES",
    "SECRET",
    "SPEC",
    "TABLE",
    "BucketSpec",
    "FunctionSpec",
    "QueueSpec",
    "ResourceSpec",
    "SecretSpec",
    "TableSpec",
]

#: The only S3 event the system subscribes to: every write is a create (system.md §10).
OBJECT_CREATED_EVENT = "s3:ObjectCreated:*"

AttributeType = Literal["S", "N", "B"]


@dataclass(frozen=True)
class BucketSpec:
    """The authority bucket. Versioning is required by the GC handshake (system.md §7)."""

    logical_name: str = "AuthorityBucket"
    versioned: bool = True
    default_name: str = "lightmetrics-local"


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


@dataclass(frozen=True)
class FunctionSpec:
    """A Lambda function: ``module`` is importable from the repo root or the installed package."""

    name: str
    module: str
    attr: str = "handler"

    @property
    def handler_string(self) -> str:
        """The Lambda ``Handler`` setting (``module.attr``)."""
        return f"{self.module}.{self.attr}"


@dataclass(frozen=True)
class ResourceSpec:
    """Everything the stack (or the local runtime) provisions."""

    bucket: BucketSpec = field(default_factory=BucketSpec)
    table: TableSpec = field(default_factory=TableSpec)
    secret: SecretSpec = field(default_factory=SecretSpec)
    queues: tuple[QueueSpec, ...] = ()
    functions: tuple[FunctionSpec, ...] = ()

    def function(self, name: str) -> FunctionSpec:
        """The function spec called ``name`` (KeyError if none)."""
        for fn in self.functions:
            if fn.name == name:
                return fn
        raise KeyError(f"no function {name!r} in the resource spec")

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
# Indexer queues come later; the provisioner and notification derivation already handle them.
QUEUES: tuple[QueueSpec, ...] = ()
FUNCTIONS: tuple[FunctionSpec, ...] = (FunctionSpec("ingest", "functions.ingest.app", "handler"),)

SPEC = ResourceSpec(bucket=BUCKET, table=TABLE, secret=SECRET, queues=QUEUES, functions=FUNCTIONS)
