"""IAM enforced by the local runtime's moto: every request is checked against its principal's policies.

moto only checks identity policies when ``INITIAL_NO_AUTH_ACTION_COUNT`` is finite; the local runtime
owns its moto (in-process), so :func:`enforce` sets it to 0 for the process and closes four gaps in
moto's checks that would otherwise make enforcement all-or-nothing here:

* a DynamoDB transaction or batch is allowed item by item (``TransactWriteItems`` needs ``PutItem``,
  ``UpdateItem``, ``DeleteItem`` or ``ConditionCheckItem`` on each item's table, as on AWS: IAM has no
  action of the transaction's own name, which moto asked about);
* the resource of a DynamoDB, Secrets Manager or Step Functions request (moto checks every one of
  them against ``*``, so a statement scoped to a table, a secret or a state machine never matched);
* S3's IAM actions: moto asks about the API operation (``s3:HeadObject``, ``s3:ListObjectsV2``), where
  IAM knows ``s3:GetObject``, ``s3:ListBucket``, ``s3:GetObjectVersion`` (a request for a version) ...;
  likewise SQS's batches (``sqs:DeleteMessageBatch`` is ``sqs:DeleteMessage``) and CloudWatch's prefix;
* a bodiless GET's signature is checked over no body (moto took its parsed parameters for a body,
  and refused every signed Lambda ``GetFunctionConfiguration``);
* IAM's wildcards: ``?`` is one character (moto made it a regex quantifier, and ``<secret>-??????``,
  the stack's secret ARN, failed to compile);
* ``DeleteObjects`` is allowed key by key (``s3:DeleteObject``, or ``s3:DeleteObjectVersion`` for a
  version) as on AWS, where moto checked the bucket ARN;
* a refusal names the principal, the action and the resource, as AWS's now does, and the services that
  speak JSON answer it in JSON (``AccessDeniedException``; moto sent them XML, which botocore reads as
  an error without a code).

Two memos make the checks cheap without changing one decision: a pattern's regular expression is
compiled once, and an identity policy's decision is kept per (policy document, action, resource)
(:func:`policy_decision`): moto's evaluation is a pure function of those three, and it parsed the
role's whole document and matched every statement again on every request.

What moto still does not model (docs/deploy.md, "IAM enforced locally"): condition keys (moto has no
request context but ``sts:ExternalId``, and ignores a condition it cannot evaluate: the statement then
grants unconditionally, so ``s3:prefix`` and ``dynamodb:LeadingKeys`` limits are not enforced here),
bucket policies and other resource-based policies.

The deployer: an IAM user whose access key is ``testing``/``testing`` — the key every local client
has always used — allowed everything. Provisioning, the tests' own setup and the demo's stand-ins for
AWS services run as it; the system's code runs as the principals of :mod:`lightmetrics.local.principals`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from typing import Any

from lightmetrics.local.function_host import ACCOUNT_ID, REGION

__all__ = ["DEPLOYER_ARN", "DEPLOYER_KEY", "DEPLOYER_USER", "USAGE_LOG_ENV", "enforce", "enforced", "ensure_deployer",
           "policy_decision"]

DEPLOYER_USER = "lm-deployer"
DEPLOYER_ARN = f"arn:aws:iam::{ACCOUNT_ID}:user/{DEPLOYER_USER}"
#: (access key id, secret): the dummy credentials of every local client, now the deployer's
DEPLOYER_KEY = ("testing", "testing")
_ALLOW_ALL = json.dumps({"Version": "2012-10-17",
                         "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})
_lock = threading.Lock()
_log_lock = threading.Lock()
#: a file every allowed request is appended to (principal, action, resource): what the roles really use
USAGE_LOG_ENV = "LM_IAM_USAGE_LOG"


def enforced() -> bool:
    """Whether this process's moto checks every request."""
    from moto import settings

    return bool(settings.INITIAL_NO_AUTH_ACTION_COUNT == 0)


def enforce(on: bool = True) -> bool:
    """Make this process's moto check (or stop checking) every request; returns the previous state."""
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    with _lock:
        previous = enforced()
        if on:
            _patch_moto()
            ensure_deployer()
        settings.INITIAL_NO_AUTH_ACTION_COUNT = 0 if on else float("inf")
        ActionAuthenticatorMixin.request_count = 0
    return previous


def ensure_deployer() -> None:
    """The deployer user with the ``testing`` key, allowed everything (again after a reset of moto)."""
    from moto.iam.models import iam_backends

    backend = iam_backends[ACCOUNT_ID]["aws"]
    if DEPLOYER_USER not in backend.users:
        backend.create_user(REGION, DEPLOYER_USER)
        backend.put_user_policy(DEPLOYER_USER, "deployer", _ALLOW_ALL)
    user = backend.users[DEPLOYER_USER]
    if not any(k.access_key_id == DEPLOYER_KEY[0] for k in user.access_keys):
        key = backend.create_access_key(DEPLOYER_USER)
        backend.access_keys.pop(key.physical_resource_id, None)
        key.access_key_id, key.secret_access_key = DEPLOYER_KEY
        backend.access_keys[key.physical_resource_id] = key


# ------------------------------------------------------------------------------------------ moto's gaps

def _iam_glob(pattern: str, value: str) -> re.Match[str] | None:
    """IAM's wildcards: ``*`` any run of characters, ``?`` exactly one; everything else literal."""
    return _iam_regex(pattern).match(value)


@functools.lru_cache(maxsize=4096)
def _iam_regex(pattern: str) -> re.Pattern[str]:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(f"^{regex}$", re.DOTALL)


@functools.lru_cache(maxsize=1 << 16)
def policy_decision(document: str, action: str, resource: str) -> Any:
    """moto's decision (a ``PermissionResult``) of an identity policy ``document`` on ``action`` over
    ``resource``, memoized: a pure function of the three (no principal, no request condition values).

    >>> doc = '{"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}]}'
    >>> policy_decision(doc, "s3:GetObject", "arn:aws:s3:::b/k").name, policy_decision(doc, "s3:PutObject", "*").name
    ('PERMITTED', 'NEUTRAL')
    """
    _patch_moto()  # decided with IAM's wildcards (:func:`_iam_glob`), as every enforced check is
    return _MOTO_POLICY["class"](document).is_action_permitted(action, resource)


#: moto's own IAMPolicy class, kept when :func:`_patch_moto` puts :class:`_MemoizedPolicy` in its place
_MOTO_POLICY: dict[str, Any] = {}


class _MemoizedPolicy:
    """moto's ``IAMPolicy`` as its access control uses it, an identity policy's decisions memoized
    (:func:`policy_decision`); a trust policy's (a principal, condition values) are evaluated as moto does."""

    def __init__(self, policy: Any) -> None:
        self._policy = policy

    def is_action_permitted(self, action: str, resource: str = "*", principal: str | None = None,
                            incoming_condition_values: dict[str, str] | None = None) -> Any:
        if principal is None and incoming_condition_values is None:
            document = _policy_document(self._policy)
            if document is not None:
                return policy_decision(document, action, resource)
        return _MOTO_POLICY["class"](self._policy).is_action_permitted(action, resource, principal,
                                                                         incoming_condition_values)


def _policy_document(policy: Any) -> str | None:
    """The text moto evaluates for ``policy`` (an inline document, or a managed policy's default version)."""
    if isinstance(policy, str):
        return policy
    if isinstance(policy, dict):
        return str(policy["policy_document"])
    return next((str(v.document) for v in getattr(policy, "versions", []) if v.is_default), None)


#: S3 API operation -> the IAM action AWS authorizes it by (operations not listed are their own action)
S3_ACTIONS = {
    "HeadObject": "GetObject", "ListObjectsV2": "ListBucket", "ListObjects": "ListBucket", "HeadBucket": "ListBucket",
    "ListObjectVersions": "ListBucketVersions", "DeleteObjects": "DeleteObject", "ListBuckets": "ListAllMyBuckets",
    "CreateMultipartUpload": "PutObject", "UploadPart": "PutObject", "CompleteMultipartUpload": "PutObject",
    "CopyObject": "PutObject", "ListParts": "ListMultipartUploadParts",
}
#: the IAM action of an object operation on a given version (``versionId`` in the query)
S3_VERSION_ACTIONS = {"GetObject": "GetObjectVersion", "DeleteObject": "DeleteObjectVersion"}


#: other services' API operations whose IAM action has another name (a batch is authorized as its item)
OTHER_ACTIONS = {"sqs": {"DeleteMessageBatch": "DeleteMessage", "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
                         "SendMessageBatch": "SendMessage"}}
#: services whose IAM prefix is not their signing name
IAM_PREFIXES = {"monitoring": "cloudwatch"}


def _s3_iam_action(operation: str, path: str) -> str:
    """``s3:<IAM action>`` of an S3 API operation on ``path`` (with its query string).

    >>> _s3_iam_action("HeadObject", "/b/k?versionId=3"), _s3_iam_action("ListObjectsV2", "/b?list-type=2")
    ('s3:GetObjectVersion', 's3:ListBucket')
    """
    action = S3_ACTIONS.get(operation, operation)
    if "versionId=" in path.partition("?")[2]:
        action = S3_VERSION_ACTIONS.get(action, action)
    return f"s3:{action}"


def _dynamodb_resource(self: Any) -> str:
    table = _json_body(self).get("TableName")
    return f"arn:aws:dynamodb:{self.region}:{self.current_account}:table/{table}" if table else "*"


#: a DynamoDB request made of items -> each item's kind -> the IAM action that item needs
DYNAMODB_ITEM_ACTIONS = {
    "TransactWriteItems": {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                           "ConditionCheck": "ConditionCheckItem"},
    "TransactGetItems": {"Get": "GetItem"},
}


def _dynamodb_item_actions(operation: str, body: dict[str, Any]) -> list[tuple[str, str]] | None:
    """``(IAM action, table)`` of every item of a transaction or batch; None for any other request."""
    if operation in DYNAMODB_ITEM_ACTIONS:
        kinds = DYNAMODB_ITEM_ACTIONS[operation]
        return [(kinds[k], v.get("TableName", "")) for item in body.get("TransactItems", []) for k, v in item.items()]
    if operation == "BatchWriteItem":
        return [("PutItem" if "PutRequest" in r else "DeleteItem", table)
                for table, requests in body.get("RequestItems", {}).items() for r in requests]
    if operation == "BatchGetItem":
        return [("GetItem", table) for table in body.get("RequestItems", {})]
    return None


def _dynamodb_authorize(original: Any) -> Any:
    def authorize(self: Any, resource: str = "*") -> None:
        items = _dynamodb_item_actions(self._get_action(), _json_body(self))
        if items is None:
            return original(self, resource)
        for action, table in dict.fromkeys(items):
            self._get_action = lambda action=action: action  # what the check asks about, this item
            try:
                original(self, f"arn:aws:dynamodb:{self.region}:{self.current_account}:table/{table}")
            finally:
                self.__dict__.pop("_get_action", None)
        return None
    return authorize


def _secret_resource(self: Any) -> str:
    secret_id = _json_body(self).get("SecretId")
    if not secret_id:
        return "*"
    if str(secret_id).startswith("arn:"):
        return str(secret_id)
    from moto.secretsmanager.models import secretsmanager_backends

    try:
        return str(secretsmanager_backends[self.current_account][self.region].describe_secret(secret_id).arn)
    except Exception:  # a missing secret: the action itself answers ResourceNotFound
        return f"arn:aws:secretsmanager:{self.region}:{self.current_account}:secret:{secret_id}"


def _states_resource(self: Any) -> str:
    body = _json_body(self)
    return str(body.get("stateMachineArn") or body.get("executionArn") or "*")


def _json_body(self: Any) -> dict[str, Any]:
    body = self.body
    if isinstance(body, (str, bytes)):
        try:
            body = json.loads(body or "{}")
        except ValueError:
            return {}
    return body if isinstance(body, dict) else {}


def _patch_moto() -> None:
    from moto.iam import access_control

    if getattr(access_control, "_lm_patched", False):
        return
    access_control.IAMPolicyStatement._match = staticmethod(_iam_glob)  # type: ignore[method-assign,assignment]
    _MOTO_POLICY["class"] = access_control.IAMPolicy
    access_control.IAMPolicy = _MemoizedPolicy  # type: ignore[misc,assignment]  # the access checks' name only
    _patch_resources_and_actions(access_control)
    _patch_requests(access_control)
    access_control._lm_patched = True  # type: ignore[attr-defined]


def _patch_resources_and_actions(access_control: Any) -> None:
    from moto.dynamodb.responses import DynamoHandler
    from moto.s3.responses import S3Response
    from moto.secretsmanager.responses import SecretsManagerResponse
    from moto.stepfunctions.responses import StepFunctionResponse

    DynamoHandler._determine_resource = _dynamodb_resource  # type: ignore[attr-defined]
    DynamoHandler._authenticate_and_authorize_normal_action = _dynamodb_authorize(  # type: ignore[method-assign]
        DynamoHandler._authenticate_and_authorize_normal_action)
    SecretsManagerResponse._determine_resource = _secret_resource  # type: ignore[attr-defined]
    StepFunctionResponse._determine_resource = _states_resource  # type: ignore[attr-defined]
    original_delete_keys = S3Response._bucket_response_delete_keys

    def delete_keys(self: Any, bucket_name: str, authenticated: bool = True) -> Any:
        if not authenticated:  # moto checked s3:DeleteObject on the bucket: AWS checks each key
            authenticated = _each_delete_allowed(self, bucket_name)
        return original_delete_keys(self, bucket_name, authenticated)

    S3Response._bucket_response_delete_keys = delete_keys  # type: ignore[method-assign]


def _patch_requests(access_control: Any) -> None:
    """The checks themselves: which action, over which body, and the refusal's message."""
    access_control.S3IAMRequest._raise_access_denied = _s3_access_denied
    access_control.IAMRequest._raise_access_denied = _access_denied
    original_request = access_control.IAMRequestBase._create_aws_request

    def raw_body_request(self: Any) -> Any:
        if self._method not in ("GET", "HEAD", "DELETE") or self._body:
            return original_request(self)
        data, self._data = self._data, {}
        try:
            return original_request(self)
        finally:
            self._data = data

    access_control.IAMRequestBase._create_aws_request = raw_body_request
    original_s3_init = access_control.S3IAMRequest.__init__

    def s3_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_s3_init(self, *args, **kwargs)
        self._action = _s3_iam_action(self._action.partition(":")[2], self._path)

    access_control.S3IAMRequest.__init__ = s3_init
    original_init = access_control.IAMRequest.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        operation = self._action.partition(":")[2]
        action = OTHER_ACTIONS.get(self._service, {}).get(operation, operation)
        self._action = f"{IAM_PREFIXES.get(self._service, self._service)}:{action}"

    access_control.IAMRequest.__init__ = init
    original_check = access_control.IAMRequestBase.check_action_permitted

    usage_log = os.environ.get(USAGE_LOG_ENV)

    def check_action_permitted(self: Any, resource: str) -> None:
        self._lm_resource = resource  # for the refusal's message
        original_check(self, resource)
        if usage_log:
            with _log_lock, open(usage_log, "a", encoding="utf-8") as fh:
                fh.write(f"{self._access_key.arn}\t{self._action}\t{resource}\n")

    access_control.IAMRequestBase.check_action_permitted = check_action_permitted


#: services whose refusals are JSON, and the error code each answers
JSON_REFUSALS = {"dynamodb": "AccessDeniedException", "secretsmanager": "AccessDeniedException",
                 "states": "AccessDeniedException", "monitoring": "AccessDeniedException", "sqs": "AccessDenied",
                 "lambda": "AccessDeniedException", "sts": "AccessDenied"}


def _refusal_message(self: Any) -> str:
    message = f"User: {self._access_key.arn} is not authorized to perform: {self._action}"
    resource = getattr(self, "_lm_resource", None)
    return message + (f" on resource: {resource}" if resource and resource != "*" else "")


def _access_denied(self: Any) -> None:
    from moto.core.exceptions import AccessDeniedError, JsonRESTError

    code = JSON_REFUSALS.get(self._service)
    if code is None:
        error = AccessDeniedError(user_arn=self._access_key.arn, action=self._action)
        error.message = _refusal_message(self)
        raise error
    raise JsonRESTError(code, _refusal_message(self))


def _s3_access_denied(self: Any) -> None:
    from moto.s3.exceptions import BucketAccessDeniedError

    error = BucketAccessDeniedError(self._data.get("BucketName", ""))
    error.message = _refusal_message(self)
    raise error


def _each_delete_allowed(self: Any, bucket_name: str) -> bool:
    """Whether every object of a ``DeleteObjects`` may be deleted by the caller (then moto deletes them;
    else it refuses them all, where AWS would refuse only the denied keys: a mixed batch is a bug here)."""
    import xmltodict
    from moto.s3.exceptions import S3AccessDeniedError

    objects = xmltodict.parse(self.body, strip_whitespace=False)["Delete"].get("Object", [])
    try:
        for obj in objects if isinstance(objects, list) else [objects]:
            operation = "DeleteObjectVersion" if obj.get("VersionId") else "DeleteObject"
            self._get_action = lambda operation=operation: operation  # what the check asks about, this key
            try:
                self._authenticate_and_authorize_s3_action(bucket_name=bucket_name, key_name=obj["Key"])
            except S3AccessDeniedError:
                return False
        return True
    finally:
        self.__dict__.pop("_get_action", None)
