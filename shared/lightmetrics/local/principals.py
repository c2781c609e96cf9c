"""The stack's roles, provisioned locally from the same statements, and the credentials of each.

:func:`provision_principals` creates one IAM role per principal of
:func:`lightmetrics.operator_tools.policies.principals` — each function role (the GC functions share the GC
role), each state machine role, the pipeline job role — whose one inline policy is exactly the
statements the stack grants it, with the local resources' ARNs. A function's role follows from its
name (:func:`function_role_name`); the function host assumes it (:func:`function_credentials`), so
a function's code signs every request with its own role's credentials and moto, enforcing
(:mod:`lightmetrics.local.iam_enforcement`), refuses what the role does not allow.

The trust policies name the service (as in the stack) and the local deployer, which assumes the roles
where AWS's service would (the function host, the event pump, the Spark job's launcher).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import ClientError

from lightmetrics.deployment.resource_types import ResourceSpec
from lightmetrics.deployment.resources import SPEC
from lightmetrics.local.function_host import ACCOUNT_ID, REGION
from lightmetrics.local.iam_enforcement import DEPLOYER_ARN
from lightmetrics.operator_tools.policies import (
    OPERATOR_PRINCIPAL,
    PIPELINE_JOB_PRINCIPAL,
    PolicyArns,
    Statement,
    function_principal,
    principals,
)

__all__ = ["POLICY_NAME", "Credentials", "assume", "forget_credentials", "function_credentials", "function_role_name",
           "local_policy_arns", "local_role_credentials", "name_prefix_of", "provision_principals", "role_name",
           "session_environment"]

#: the name of each role's one inline policy
POLICY_NAME = "least-privilege"
#: botocore's credential arguments: aws_access_key_id, aws_secret_access_key, aws_session_token
Credentials = dict[str, str]
#: the service each role trusts (the operators' role trusts no service: people assume it)
_SERVICES: dict[str, str | None] = {"fn": "lambda.amazonaws.com", "gc": "lambda.amazonaws.com",
                                    "sm": "states.amazonaws.com", PIPELINE_JOB_PRINCIPAL: "emr-serverless.amazonaws.com",
                                    OPERATOR_PRINCIPAL: None}


def role_name(principal: str, name_prefix: str = "") -> str:
    """The local role of a principal (``fn-walk-page`` -> ``lm-fn-walk-page``)."""
    return f"{name_prefix}lm-{principal}"


def local_policy_arns(made: Mapping[str, Any], *, namespace: str, name_prefix: str = "") -> PolicyArns:
    """The ARNs of what :func:`lightmetrics.local.provision.provision` made, for the shared statements."""
    from lightmetrics.operator_tools.statemachines import lambda_arn

    queues: dict[str, str] = {}
    for name, q in [*made.get("queues", {}).items(), *made.get("shard_queues", {}).items()]:
        queues[name], queues[f"{name}-dlq"] = q["arn"], q["dlq_arn"]
    machines = {n: sm["arn"] for n, sm in made.get("state_machines", {}).items()}
    secret = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT_ID}:secret:{made['secret_name']}-??????"
    functions = _FunctionArns(lambda fn: lambda_arn(name_prefix + fn, region=REGION))
    return PolicyArns(bucket=made["bucket_arn"], namespace=namespace, table=made["table_arn"], secret=secret,
                      queues=queues, state_machines=machines, functions=functions,
                      executions={n: arn.replace(":stateMachine:", ":execution:") + ":*" for n, arn in machines.items()})


class _FunctionArns(dict):  # type: ignore[type-arg]
    """function name -> its local ARN, for any name asked."""

    def __init__(self, arn: Callable[[str], str]) -> None:
        super().__init__()
        self._arn = arn

    def __missing__(self, name: str) -> str:
        return self._arn(name)


def provision_principals(client: Callable[[str], Any], spec: ResourceSpec, arns: PolicyArns, *,
                         name_prefix: str = "", ops_bucket: str | None = None,
                         overrides: Mapping[str, list[Statement]] | None = None) -> dict[str, str]:
    """Create (or converge) every principal's role and its policy; principal name -> role ARN.
    ``overrides`` replaces a principal's statements (a test taking one away shows enforcement is on)."""
    iam = client("iam")
    wanted = principals(arns, spec, ops_bucket=ops_bucket, with_triggers=True)
    wanted.update(overrides or {})
    out: dict[str, str] = {}
    for principal, statements in wanted.items():
        name = role_name(principal, name_prefix)
        kind = principal if principal in _SERVICES else principal.split("-")[0]
        out[principal] = _converge_role(iam, name, _SERVICES[kind])
        _converge_policy(iam, name, statements)
    return out


def _converge_role(iam: Any, name: str, service: str | None) -> str:
    principal = {"Service": service, "AWS": DEPLOYER_ARN} if service else {"AWS": DEPLOYER_ARN}
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": principal}]}
    try:
        return str(iam.get_role(RoleName=name)["Role"]["Arn"])
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "NoSuchEntity":
            raise
    return str(iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"])


def _converge_policy(iam: Any, name: str, statements: list[Statement]) -> None:
    if statements:
        document = {"Version": "2012-10-17", "Statement": statements}
        iam.put_role_policy(RoleName=name, PolicyName=POLICY_NAME, PolicyDocument=json.dumps(document))
        return
    try:  # a role allowed nothing has no policy (IAM refuses an empty one)
        iam.delete_role_policy(RoleName=name, PolicyName=POLICY_NAME)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "NoSuchEntity":
            raise


def assume(client: Callable[[str], Any], role_arn: str, session_name: str) -> Credentials:
    """Temporary credentials of ``role_arn`` (as the caller of ``client``, the deployer)."""
    c = client("sts").assume_role(RoleArn=role_arn, RoleSessionName=session_name[:64])["Credentials"]
    return {"aws_access_key_id": c["AccessKeyId"], "aws_secret_access_key": c["SecretAccessKey"],
            "aws_session_token": c["SessionToken"]}


_cache: dict[tuple[str, str], Credentials | None] = {}
_cache_lock = threading.Lock()


def function_role_name(function_name: str, spec: ResourceSpec = SPEC) -> str | None:
    """The local role of a (physical) function name: ``<prefix><spec name>`` runs as
    ``<prefix>lm-<its principal>`` (the GC functions as ``<prefix>lm-gc``); None for no function of ``spec``.

    >>> function_role_name("wk1-reap-gc"), function_role_name("walk-end"), function_role_name("echo")
    ('wk1-lm-gc', 'lm-fn-walk-end', None)
    """
    for fn in sorted(spec.functions, key=lambda f: -len(f.name)):
        if function_name.endswith(fn.name):
            return role_name(function_principal(fn), function_name[: -len(fn.name)])
    return None


def function_credentials(client: Callable[[str], Any], endpoint_url: str, function_name: str,
                         spec: ResourceSpec = SPEC) -> Credentials | None:
    """The credentials a function runs with: its role's, assumed (cached per endpoint and function);
    None for a function with no role provisioned (it runs as its host)."""
    key = (endpoint_url, function_name)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    role = function_role_name(function_name, spec)
    credentials = None
    if role is not None:
        try:
            arn = client("iam").get_role(RoleName=role)["Role"]["Arn"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchEntity":
                raise
        else:
            credentials = assume(client, arn, function_name)
    with _cache_lock:
        _cache[key] = credentials
    return credentials


def forget_credentials(endpoint_url: str | None = None) -> None:
    """Drop cached credentials (all, or one runtime's): after a reset of moto they are stale."""
    with _cache_lock:
        for key in [k for k in _cache if endpoint_url is None or k[0] == endpoint_url]:
            del _cache[key]


def name_prefix_of(queue_urls: Mapping[str, str]) -> str:
    """A local system's name prefix, read off its queue URLs (``.../wk1-index-accepted`` -> ``wk1-``).

    >>> name_prefix_of({"index-accepted": "http://h/1/wk1-index-accepted"}), name_prefix_of({})
    ('wk1-', '')
    """
    for name, url in queue_urls.items():
        last = url.rstrip("/").rsplit("/", 1)[-1]
        if last.endswith(name):
            return last[: -len(name)]
    return ""


def local_role_credentials(principal: str, queue_urls: Mapping[str, str]) -> Credentials | None:
    """Pointed at the local runtime (``AWS_ENDPOINT_URL``): ``principal``'s role of the system whose
    queues are ``queue_urls``, assumed with the deployer's key as the service would (EMR Serverless
    runs the pipeline's jobs as the job role); None elsewhere, or when that system has no roles."""
    import os

    import boto3

    from lightmetrics.local.iam_enforcement import DEPLOYER_KEY

    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return None

    def client(service: str) -> Any:
        return boto3.client(service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id=DEPLOYER_KEY[0],
                            aws_secret_access_key=DEPLOYER_KEY[1])

    name = role_name(principal, name_prefix_of(queue_urls))
    try:
        arn = client("iam").get_role(RoleName=name)["Role"]["Arn"]
    except ClientError:  # no such role (provisioned without roles), or a runtime without IAM
        return None
    return assume(client, arn, name)


def session_environment(credentials: Credentials) -> dict[str, str]:
    """The environment variables that make a process's AWS clients sign with ``credentials``."""
    return {"AWS_ACCESS_KEY_ID": credentials["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": credentials["aws_secret_access_key"],
            "AWS_SESSION_TOKEN": credentials["aws_session_token"]}
