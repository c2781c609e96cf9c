"""Deploy-time configuration of the stack, read from CDK context (``cdk.json`` or ``-c key=value``).

Keys that name a :class:`lightmetrics.deployment.settings.Settings` field (``prefix``, ``retry_horizon_s``,
``max_frame_bytes``, ...) become that setting, are validated by ``Settings`` itself and reach
every function as ``LM_<FIELD>``. The other keys configure the stack:

| key | default | meaning |
|---|---|---|
| ``stack_name`` | ``Lightmetrics`` | CloudFormation stack name |
| ``secret_name`` | ``lightmetrics/ingest-tokens`` | Secrets Manager name of the token keys (created by the operator) |
| ``bucket_name``, ``table_name`` | generated | optional physical names |
| ``alarm_topic_arn`` | create a topic | import an existing SNS topic for the alarms |
| ``alarm_email`` | none | subscribe an address to the created topic |
| ``log_retention_days`` | 30 | CloudWatch Logs retention of every function |
| ``noncurrent_version_days`` | 30 | lifecycle: noncurrent versions under derived prefixes |
| ``abort_multipart_days`` | 1 | lifecycle: incomplete multipart uploads |
| ``ops_retention_days`` | 90 | access logs in the ops bucket |
| ``inventory`` | ``true`` | weekly S3 Inventory of the bucket and the audit over it; ``false``: the weekly walk instead |
| ``inventory_retention_days`` | 14 | S3 Inventory reports in the ops bucket (the weekly audit reads the latest) |
| ``ingest_5xx_rate_percent`` | 1 | alarm threshold: ingest 5xx answers per 100 invocations |
| ``log_level`` | ``INFO`` | ``POWERTOOLS_LOG_LEVEL`` |
| ``ingest_reserved_concurrency_default`` | 50 | default of the reserved-concurrency stack parameters |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightmetrics.deployment.resources import SPEC
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CDK_JSON = ROOT / "cdk.json"

#: The namespace every function's Powertools metrics use (the alarms read from it).
METRICS_NAMESPACE = "Lightmetrics"

#: A Function URL delivers a binary body base64-encoded inside a JSON event, and a synchronous
#: invocation carries at most 6 MB (6,291,456 bytes): a frame must fit with room for the headers.
LAMBDA_SYNC_PAYLOAD_BYTES = 6 * 1024 * 1024
EVENT_OVERHEAD_BYTES = 64 * 1024

# Settings that only make sense at run time or are wired from resources, never from context.
_WIRED_SETTINGS = {"bucket", "table", "auth_secret_id", "ingest_url", "queue_urls", "state_machine_arns",
                   "reconcile_shards_queue_url"}

_STACK_DEFAULTS: dict[str, Any] = {
    "stack_name": "Lightmetrics",
    "secret_name": SPEC.secret.default_name,
    "bucket_name": "",
    "table_name": "",
    "alarm_topic_arn": "",
    "alarm_email": "",
    "log_retention_days": 30,
    "noncurrent_version_days": 30,
    "abort_multipart_days": 1,
    "ops_retention_days": 90,
    "inventory": True,
    "inventory_retention_days": 14,
    "ingest_5xx_rate_percent": 1,
    "log_level": "INFO",
    "ingest_reserved_concurrency_default": 50,
}


class InfraConfigError(ConfigError):
    """The CDK context is invalid; the message names the context key."""


def _boolean(key: str, v: Any) -> bool:
    """A context flag: cdk.json gives a JSON bool, ``-c key=value`` a string."""
    if isinstance(v, bool):
        return v
    if str(v).lower() in ("true", "false"):
        return str(v).lower() == "true"
    raise InfraConfigError(f"CDK context {key!r} must be true or false")


def cdk_json_context(path: Path = CDK_JSON) -> dict[str, Any]:
    """The ``context`` of ``cdk.json`` (the CLI passes it to the app; in-process apps read it here)."""
    return dict(json.loads(path.read_text()).get("context", {}))


@dataclass(frozen=True)
class InfraConfig:
    """Validated stack configuration."""

    stack_name: str
    secret_name: str
    bucket_name: str | None
    table_name: str | None
    alarm_topic_arn: str | None
    alarm_email: str | None
    log_retention_days: int
    noncurrent_version_days: int
    abort_multipart_days: int
    ops_retention_days: int
    #: S3 Inventory configured: the weekly audit moves every watermark and the walk is not scheduled;
    #: without it the audit's schedule goes too and the walk runs weekly (schedules.scheduled)
    inventory: bool
    inventory_retention_days: int
    ingest_5xx_rate_percent: float
    log_level: str
    ingest_reserved_concurrency_default: int
    settings: Settings = field(repr=False)

    @property
    def prefix(self) -> str:
        """The prefix namespace (``LM_PREFIX``): every key, ARN and filter starts with it."""
        return self.settings.prefix

    @classmethod
    def from_context(cls, get: Any) -> "InfraConfig":
        """Build from a context getter (``node.try_get_context``) or a mapping."""
        lookup = get.get if isinstance(get, Mapping) else get

        def value(key: str) -> Any:
            v = lookup(key)
            return _STACK_DEFAULTS.get(key) if v is None else v

        overrides: dict[str, Any] = {}
        for name in Settings.model_fields:
            if name in _WIRED_SETTINGS:
                continue
            v = lookup(name)
            if v is not None and v != "":
                overrides[name] = v
        try:
            # The bucket is a CloudFormation token at synth time; validate the rest with a stand-in.
            settings = Settings(bucket="placeholder-bucket", auth_secret_id=str(value("secret_name")), **overrides)
        except Exception as exc:  # pydantic's ValidationError, reworded with the context key
            raise InfraConfigError(f"invalid CDK context: {exc}") from None

        def integer(key: str, low: int, high: int) -> int:
            try:
                n = int(value(key))
            except (TypeError, ValueError):
                raise InfraConfigError(f"CDK context {key!r} must be an integer") from None
            if not low <= n <= high:
                raise InfraConfigError(f"CDK context {key!r} must be between {low} and {high}")
            return n

        try:
            rate = float(value("ingest_5xx_rate_percent"))
        except (TypeError, ValueError):
            raise InfraConfigError("CDK context 'ingest_5xx_rate_percent' must be a number") from None
        cfg = cls(
            stack_name=str(value("stack_name")),
            secret_name=str(value("secret_name")),
            bucket_name=str(value("bucket_name")) or None,
            table_name=str(value("table_name")) or None,
            alarm_topic_arn=str(value("alarm_topic_arn")) or None,
            alarm_email=str(value("alarm_email")) or None,
            log_retention_days=integer("log_retention_days", 1, 3653),
            noncurrent_version_days=integer("noncurrent_version_days", 1, 3650),
            abort_multipart_days=integer("abort_multipart_days", 1, 365),
            ops_retention_days=integer("ops_retention_days", 1, 3650),
            inventory=_boolean("inventory", value("inventory")),
            inventory_retention_days=integer("inventory_retention_days", 8, 3650),
            ingest_5xx_rate_percent=rate,
            log_level=str(value("log_level")).upper(),
            ingest_reserved_concurrency_default=integer("ingest_reserved_concurrency_default", -1, 10000),
            settings=settings,
        )
        cfg._check()
        return cfg

    def _check(self) -> None:
        if not 0 < self.ingest_5xx_rate_percent <= 100:
            raise InfraConfigError("CDK context 'ingest_5xx_rate_percent' must be in (0, 100]")
        if self.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise InfraConfigError("CDK context 'log_level' must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        encoded = -(-self.settings.max_frame_bytes // 3) * 4  # base64 length
        if encoded + EVENT_OVERHEAD_BYTES > LAMBDA_SYNC_PAYLOAD_BYTES:
            limit = (LAMBDA_SYNC_PAYLOAD_BYTES - EVENT_OVERHEAD_BYTES) // 4 * 3
            raise InfraConfigError(
                f"CDK context 'max_frame_bytes' = {self.settings.max_frame_bytes}: a Function URL "
                f"delivers the body base64-encoded in a 6 MB event, so frames above {limit} bytes "
                "could never arrive; lower it (the Lambda default is 4194304)"
            )
