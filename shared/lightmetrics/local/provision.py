"""Create the resources of a :class:`~lightmetrics.deployment.resource_types.ResourceSpec`, idempotently.

The local counterpart of the CDK stack: it reads the same spec and converges an account (moto
locally, though nothing here is moto-specific) to it. Running it twice changes nothing; an
existing secret keeps its value unless one is passed.

Example::

    >>> rt = LocalRuntime(port=4566).start()                               # doctest: +SKIP
    >>> out = provision(rt, SPEC, bucket="lightmetrics-local",            # doctest: +SKIP
    ...                 table="lightmetrics-control", secret_name="lightmetrics/ingest-tokens")
    >>> out["created"]                                                     # doctest: +SKIP
    ['bucket', 'table', 'secret']
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, cast

from botocore.exceptions import ClientError

from lightmetrics.acceptance.auth import TokenKeys
from lightmetrics.deployment.resource_types import QueueSpec, ResourceSpec
from lightmetrics.local.function_host import ACCOUNT_ID

__all__ = ["ProvisionError", "provision", "queue_urls_setting", "shard_queue_url_setting", "state_machine_arns_setting"]


class ProvisionError(RuntimeError):
    """An existing resource contradicts the spec (e.g. a table with another key schema)."""


def _client_factory(session_or_clients: Any) -> Callable[[str], Any]:
    """Accept a boto3 Session, a LocalRuntime (``boto3_client``) or a {service: client} map."""
    if isinstance(session_or_clients, Mapping):
        return lambda service: session_or_clients[service]
    if hasattr(session_or_clients, "boto3_client"):
        return cast(Callable[[str], Any], session_or_clients.boto3_client)
    if hasattr(session_or_clients, "client"):
        return cast(Callable[[str], Any], session_or_clients.client)
    raise TypeError("provision() needs a boto3 Session, a LocalRuntime or a {service: client} mapping")


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def provision(
    session_or_clients: Any,
    spec: ResourceSpec,
    *,
    bucket: str,
    table: str,
    secret_name: str,
    secret_value: str | None = None,
    namespace: str = "",
    queue_name_prefix: str = "",
    function_arn: Callable[[str], str] | None = None,
    roles: bool = True,
) -> dict[str, Any]:
    """Converge bucket, control table, token secret, queues, bucket notifications, state
    machines and (``roles``) the stack's roles (:mod:`lightmetrics.local.principals`; none with a
    ``{service: client}`` map that has no ``"iam"``) to ``spec``.

    ``namespace`` is the prefix namespace (``LM_PREFIX``) prepended to queue prefix filters;
    ``queue_name_prefix`` is prepended to physical queue, state machine and function names
    (several systems in one moto), and to role names. ``function_arn`` maps a function of the spec to the ARN its
    state machine tasks invoke (default: the local function host's ARN of
    ``queue_name_prefix + name``). Returns names, ARNs, the secret value, ``roles`` (principal -> role ARN)
    and ``created``: what did not exist before.
    """
    client = _client_factory(session_or_clients)
    s3, ddb, sm = client("s3"), client("dynamodb"), client("secretsmanager")
    created: list[str] = []

    _converge_bucket(s3, spec, bucket, created)
    desc = _converge_table(ddb, spec, table, created)
    secret_arn, current = _converge_secret(sm, secret_name, secret_value, created)
    queues = _converge_queues(client, s3, spec, bucket, namespace=namespace, queue_name_prefix=queue_name_prefix)
    shard_queues = _converge_shard_queues(client, spec, queue_name_prefix=queue_name_prefix)
    state_machines = _converge_state_machines(client, spec, created, queue_name_prefix=queue_name_prefix,
                                              function_arn=function_arn)

    made = {
        "bucket": bucket,
        "bucket_arn": f"arn:aws:s3:::{bucket}",
        "table": table,
        "table_arn": desc["TableArn"],
        "secret_name": secret_name,
        "secret_arn": secret_arn,
        "secret_value": current,
        "queues": queues,
        "shard_queues": shard_queues,
        "state_machines": state_machines,
        "created": created,
        "roles": {},
    }
    if roles and not (isinstance(session_or_clients, Mapping) and "iam" not in session_or_clients):
        from lightmetrics.local.principals import local_policy_arns, provision_principals

        arns = local_policy_arns(made, namespace=namespace, name_prefix=queue_name_prefix)
        # the demo's inventory lands in the authority bucket (there is no ops bucket locally)
        made["roles"] = provision_principals(client, spec, arns, name_prefix=queue_name_prefix,
                                             ops_bucket=made["bucket_arn"])
    return made


def _converge_bucket(s3: Any, spec: ResourceSpec, bucket: str, created: list[str]) -> None:
    """The bucket (and its versioning): HEAD first, because create_bucket's "already exists" answers differ by region."""
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if _error_code(exc) not in ("404", "NoSuchBucket", "NotFound"):
            raise  # 403 means someone else's bucket: never paper over that
        region = s3.meta.region_name
        kwargs: dict[str, Any] = {"Bucket": bucket}
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        s3.create_bucket(**kwargs)
        created.append("bucket")
    if spec.bucket.versioned:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})


def _converge_table(ddb: Any, spec: ResourceSpec, table: str, created: list[str]) -> dict[str, Any]:
    """The control table (its key schema must be the spec's) and its TTL; its description."""
    try:
        desc = ddb.describe_table(TableName=table)["Table"]
        if desc["KeySchema"] != spec.table.key_schema():
            raise ProvisionError(
                f"table {table!r} has key schema {desc['KeySchema']}, spec wants {spec.table.key_schema()}"
            )
    except ClientError as exc:
        if _error_code(exc) != "ResourceNotFoundException":
            raise
        ddb.create_table(
            TableName=table,
            KeySchema=spec.table.key_schema(),
            AttributeDefinitions=spec.table.attribute_definitions(),
            BillingMode=spec.table.billing,
            **(
                {"ProvisionedThroughput": {"ReadCapacityUnits": 5, "WriteCapacityUnits": 5}}
                if spec.table.billing == "PROVISIONED"
                else {}
            ),
        )
        ddb.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
        desc = ddb.describe_table(TableName=table)["Table"]
        created.append("table")
    if spec.table.ttl_attribute:
        ttl = ddb.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
        if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
            ddb.update_time_to_live(
                TableName=table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": spec.table.ttl_attribute},
            )
    return dict(desc)


def _converge_secret(sm: Any, secret_name: str, secret_value: str | None, created: list[str]) -> tuple[str, str]:
    """The token secret, keeping an existing value (tokens already issued must stay valid); its ARN and value."""
    if secret_value is not None:
        TokenKeys.parse(secret_value)  # never store a value the readers would refuse
    try:
        secret_arn = sm.describe_secret(SecretId=secret_name)["ARN"]
        current = sm.get_secret_value(SecretId=secret_name)["SecretString"]
        if secret_value is not None and secret_value != current:
            sm.put_secret_value(SecretId=secret_name, SecretString=secret_value)
            current = secret_value
    except ClientError as exc:
        if _error_code(exc) != "ResourceNotFoundException":
            raise
        current = secret_value if secret_value is not None else TokenKeys.generate("k1").model_dump_json()
        secret_arn = sm.create_secret(Name=secret_name, SecretString=current)["ARN"]
        created.append("secret")
    return secret_arn, current


def _converge_dead_lettered(sqs: Any, name: str, dlq_name: str, attributes: Callable[[str, str], dict[str, str]],
                            dlq_attributes: dict[str, str] | None = None) -> dict[str, str]:
    """A queue and its DLQ; ``attributes(dlq_arn, arn)`` are the queue's. create_queue with no
    attributes is idempotent; the attributes are then set, so a re-run converges a queue whose
    settings drifted instead of failing. Their URLs and ARNs."""
    def arn_of(url: str) -> str:
        return str(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])

    dlq_url = sqs.create_queue(QueueName=dlq_name)["QueueUrl"]
    if dlq_attributes:
        sqs.set_queue_attributes(QueueUrl=dlq_url, Attributes=dlq_attributes)
    dlq_arn = arn_of(dlq_url)
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = arn_of(url)
    sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes(dlq_arn, arn))
    return {"url": url, "arn": arn, "dlq_url": dlq_url, "dlq_arn": dlq_arn}


def _converge_queues(client: Callable[[str], Any], s3: Any, spec: ResourceSpec, bucket: str, *, namespace: str,
                     queue_name_prefix: str) -> dict[str, dict[str, str]]:
    """The queues, DLQs, redrive, and the notifications that feed them; each queue's URL and ARN and its DLQ's."""
    queues: dict[str, dict[str, str]] = {}
    if spec.queues:
        sqs = client("sqs")
        bucket_arn = f"arn:aws:s3:::{bucket}"
        for q in spec.queues:
            def attributes(dlq_arn: str, arn: str, q: QueueSpec = q) -> dict[str, str]:
                # The queue policy is what real S3 needs to deliver (moto does not check it).
                policy = {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "s3.amazonaws.com"},
                            "Action": "sqs:SendMessage",
                            "Resource": arn,
                            "Condition": {"ArnEquals": {"aws:SourceArn": bucket_arn}},
                        }
                    ],
                }
                return {"RedrivePolicy": q.redrive_policy(dlq_arn), "VisibilityTimeout": str(q.visibility_timeout_s),
                        "Policy": json.dumps(policy)}

            queues[q.name] = _converge_dead_lettered(sqs, queue_name_prefix + q.name, queue_name_prefix + q.dlq_name,
                                                     attributes)
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration=spec.notification_configuration(
                {name: v["arn"] for name, v in queues.items()}, namespace=namespace
            ),
        )
    return queues


def _converge_shard_queues(client: Callable[[str], Any], spec: ResourceSpec, *,
                           queue_name_prefix: str) -> dict[str, dict[str, str]]:
    """The shard queues the functions fan out on, with their DLQs (no S3 notification feeds them)."""
    if not spec.shard_queues:
        return {}
    sqs = client("sqs")
    return {q.name: _converge_dead_lettered(
        sqs, queue_name_prefix + q.name, queue_name_prefix + q.dlq_name,
        lambda dlq_arn, _arn, q=q: {"RedrivePolicy": q.redrive_policy(dlq_arn),
                                    "VisibilityTimeout": str(q.visibility_timeout_s)},
        {"MessageRetentionPeriod": str(q.dlq_retention_s)}) for q in spec.shard_queues}


def _converge_state_machines(client: Callable[[str], Any], spec: ResourceSpec, created: list[str], *,
                             queue_name_prefix: str,
                             function_arn: Callable[[str], str] | None) -> dict[str, dict[str, str]]:
    """The state machines, from the same ASL files and substitution map as the CDK stack; each one's ARN, name and
    definition."""
    state_machines: dict[str, dict[str, str]] = {}
    if spec.state_machines:
        from lightmetrics.local.principals import role_name
        from lightmetrics.operator_tools.policies import state_machine_principal
        from lightmetrics.operator_tools.statemachines import lambda_arn, render_definition

        sfn = client("stepfunctions")
        region = sfn.meta.region_name or "us-east-1"
        resolve = function_arn or (lambda fn: lambda_arn(queue_name_prefix + fn, region=region))
        existing: dict[str, str] = {}
        for page in sfn.get_paginator("list_state_machines").paginate():
            existing.update({m["name"]: m["stateMachineArn"] for m in page["stateMachines"]})
        for sm in spec.state_machines:
            name = queue_name_prefix + sm.logical_name
            definition = render_definition(sm, resolve)
            # the role provision_principals makes for it (its ARN is known before it exists)
            role = f"arn:aws:iam::{ACCOUNT_ID}:role/{role_name(state_machine_principal(sm), queue_name_prefix)}"
            if name in existing:
                arn = existing[name]
                sfn.update_state_machine(stateMachineArn=arn, definition=definition, roleArn=role)
            else:
                arn = sfn.create_state_machine(name=name, definition=definition, roleArn=role, type="STANDARD")[
                    "stateMachineArn"
                ]
                created.append(f"state-machine:{sm.name}")
            state_machines[sm.name] = {"arn": arn, "name": name, "definition": definition}
    return state_machines


def shard_queue_url_setting(made: dict[str, Any], spec: ResourceSpec) -> str | None:
    """``LM_RECONCILE_SHARDS_QUEUE_URL`` for what :func:`provision` made: the URL of the queue the
    spec's reconcile function fans out on (None without it)."""
    name = spec.function("reconcile").shard_queue
    return made.get("shard_queues", {}).get(name, {}).get("url") if name else None


def state_machine_arns_setting(made: dict[str, Any]) -> dict[str, str]:
    """``LM_STATE_MACHINE_ARNS`` for what :func:`provision` made: logical name -> ARN."""
    return {name: sm["arn"] for name, sm in made.get("state_machines", {}).items()}


def queue_urls_setting(made: dict[str, Any]) -> dict[str, str]:
    """``LM_QUEUE_URLS`` for what :func:`provision` made: logical queue and DLQ names -> URLs."""
    out: dict[str, str] = {}
    for name, q in made.get("queues", {}).items():
        out[name] = q["url"]
        out[f"{name}-dlq"] = q["dlq_url"]
    return out
