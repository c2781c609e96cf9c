"""Typed configuration, read from the environment (Lambda) or flags (CLI) and validated at start.

Names are fixed by the interface contract: every field ``x`` is read from ``LM_X`` and the CLI
flag ``--x`` (underscores as dashes) mirrors it. Durations are whole seconds in ``LM_*_S``.

The protocol's timing assumptions are configuration rules (:mod:`lightmetrics.protocol.timing`),
refused at start (docs/protocol.md §18): H1 and H2 on ``LM_GC_GRACE_S`` here, against the functions'
timeouts (:mod:`lightmetrics.deployment.timeouts`); D1 on a retention's ``tombstone_wait_s`` where a
reap's input is read. A local host (:mod:`lightmetrics.protocol.hosting`) may run shorter waits;
configuration read anywhere else may not.

Example:
    >>> cfg = Settings.from_env({"LM_BUCKET": "my-bucket", "LM_TABLE": "t", "LM_COLLECTOR_ID": "c1"})
    >>> cfg.bucket, cfg.max_frame_bytes
    ('my-bucket', 6291456)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator

from lightmetrics.deployment.timeouts import longest_accept_s, longest_reap_task_s
from lightmetrics.protocol.errors import ConfigError
from lightmetrics.protocol.timing import DEFAULT_CLOCK_SKEW_S, gc_grace_rule_broken

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")

ENV_PREFIX = "LM_"
#: How the stack's ``Prefix`` output writes an empty prefix (a CloudFormation output cannot be empty);
#: ``LM_PREFIX`` accepts it as "".
EMPTY_PREFIX = "(empty)"

#: Most reconciler shards (``LM_RECONCILE_SHARDS``): one per range of an hour's plan, whose ranges
#: are at most ``hour_ranges.MAX_RANGES`` (the same number; a test holds them equal).
MAX_RECONCILE_SHARDS = 256
#: ``Settings.from_env`` validation context: enforce the timing rules (False only for a local host).
_TIMING_RULES = "timing_rules"


class Settings(BaseModel):
    """Every configurable value of the system, with its ``LM_`` variable name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bucket: str = Field(description="LM_BUCKET: the acceptance authority's bucket")
    prefix: str = Field("", description="LM_PREFIX: prefix namespace inside the bucket ('(empty)' = none)")
    table: str = Field("lightmetrics-control", description="LM_TABLE: DynamoDB control table")
    collector_id: str = Field("collector-1", description="LM_COLLECTOR_ID: recorded in manifests")
    ingest_url: str | None = Field(None, description="LM_INGEST_URL: ingest endpoint for clients")
    auth_secret_id: str = Field(
        "lightmetrics/ingest-tokens", description="LM_AUTH_SECRET_ID: Secrets Manager id of the token keys"
    )
    retry_horizon_s: int = Field(7 * 86400, ge=60, description="LM_RETRY_HORIZON_S: longest agent retry")
    settle_s: int = Field(900, ge=0, description="LM_SETTLE_S: settle window after an hour ends")
    clock_skew_s: int = Field(DEFAULT_CLOCK_SKEW_S, ge=0, le=3600, description=(
        "LM_CLOCK_SKEW_S: how far two hosts' clocks may disagree (the GC grace allows for it, rule H1)"))
    gc_grace_s: int = Field(900, ge=0, description=(
        "LM_GC_GRACE_S: GC delete-marker grace; longer than the ingest timeout plus LM_CLOCK_SKEW_S (rule H1)"))
    retention_s: int = Field(90 * 86400, ge=3600, description="LM_RETENTION_S: raw data retention")
    rollup_retention_s: int = Field(400 * 86400, ge=3600, description="LM_ROLLUP_RETENTION_S")
    max_frame_bytes: int = Field(6 * 1024 * 1024, ge=64, le=64 * 1024 * 1024, description="LM_MAX_FRAME_BYTES")
    ingest_acceptance: Literal["s3_manifest"] = Field(
        "s3_manifest", description="LM_INGEST_ACCEPTANCE: only strict active-active is supported"
    )
    s3_max_attempts: int = Field(5, ge=1, le=20, description="LM_S3_MAX_ATTEMPTS: per conditional create")
    s3_timeout_s: int = Field(5, ge=1, le=120, description="LM_S3_TIMEOUT_S: connect/read timeout")
    # At least 3: two transient failures (an old one and a new one) never make a blocker by themselves.
    retry_budget_count: int = Field(5, ge=3, le=1000, description="LM_RETRY_BUDGET_COUNT: failures before a blocker")
    retry_budget_age_s: int = Field(3600, ge=1, description="LM_RETRY_BUDGET_AGE_S: failing this long makes a blocker")
    reconcile_lookback_s: int = Field(6 * 3600, ge=0, description="LM_RECONCILE_LOOKBACK_S: rescan after downtime")
    reconcile_margin_s: int = Field(120, ge=0, le=3600, description=(
        "LM_RECONCILE_MARGIN_S: an entry whose PUT began this long before the newest entry a run saw is "
        "verified once and not again (longer than any PUT in flight)"))
    reconcile_shards: int = Field(1, description=(
        f"LM_RECONCILE_SHARDS: reconciler shards run in parallel (1-{MAX_RECONCILE_SHARDS}), each over its key "
        "range of every hour (docs/protocol.md §12 R8)"))
    reconcile_shards_queue_url: str | None = Field(None, description=(
        "LM_RECONCILE_SHARDS_QUEUE_URL: the queue the reconciler's one schedule fans out on, a message per shard "
        "(unset: a scheduled run is shard 0's; with more than one shard, a configuration error)"))
    reconcile_jitter_s: int = Field(60, description=(
        "LM_RECONCILE_JITTER_S: each shard's message of a fan-out is delayed a random 0 to this many seconds, "
        "so N shards do not start in the same second (0-900, SQS's longest delay; under the schedule's period)"))
    queue_urls: dict[str, str] = Field(
        default_factory=dict, description="LM_QUEUE_URLS: JSON {queue name: URL} of the index queues and DLQs"
    )
    state_machine_arns: dict[str, str] = Field(
        default_factory=dict,
        description="LM_STATE_MACHINE_ARNS: JSON {state machine name: ARN}, e.g. bootstrap-walk (lmctl walk)",
    )
    queue_probe: Literal["cloudwatch", "count"] = Field(
        "cloudwatch", description="LM_QUEUE_PROBE: how the reconciler sees queue age (count = local runtime)"
    )
    secret_cache_s: int = Field(300, ge=0, description="LM_SECRET_CACHE_S: token key cache lifetime")
    denylist_ttl_s: int = Field(
        60, ge=1, le=3600,
        description="LM_DENYLIST_TTL_S: ingest re-reads the identity denylist at most this often (its staleness bound)",
    )

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str) -> str:
        if not _BUCKET_RE.match(v) or ".." in v:
            raise ValueError("must be a valid S3 bucket name (3-63 chars, lowercase, digits, '.', '-')")
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if v == EMPTY_PREFIX:  # the stack's Prefix output for "" (CloudFormation outputs cannot be empty)
            return ""
        if v and (not v.endswith("/") or v.startswith("/") or "//" in v):
            raise ValueError("must be empty or end with '/' (e.g. 'prod/'), without a leading '/'")
        return v

    @field_validator("queue_urls", mode="before")
    @classmethod
    def _queue_urls(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError:
                raise ValueError('must be a JSON object {"queue-name": "https://..."}') from None
        return v

    @field_validator("state_machine_arns", mode="before")
    @classmethod
    def _state_machine_arns(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError:
                raise ValueError('must be a JSON object {"bootstrap-walk": "arn:aws:states:..."}') from None
        return v

    @field_validator("gc_grace_s")
    @classmethod
    def _gc_grace(cls, v: int, info: ValidationInfo) -> int:
        enforced = (info.context or {}).get(_TIMING_RULES, True)
        broken = enforced and gc_grace_rule_broken(v, clock_skew_s=info.data.get("clock_skew_s"),
                                                   longest_accept_s=longest_accept_s(),
                                                   longest_reap_task_s=longest_reap_task_s())
        if broken:
            raise ValueError(broken)
        return v

    @field_validator("reconcile_shards")
    @classmethod
    def _reconcile_shards(cls, v: int) -> int:
        # One shard per range of an hour's plan: a plan has 1 to MAX_RECONCILE_SHARDS ranges.
        if not 1 <= v <= MAX_RECONCILE_SHARDS:
            raise ValueError(f"must be a whole number of shards from 1 to {MAX_RECONCILE_SHARDS} "
                             f"(one per key range of an hour, docs/protocol.md §12 R8), got {v}")
        return v

    @field_validator("reconcile_jitter_s")
    @classmethod
    def _reconcile_jitter(cls, v: int) -> int:
        from lightmetrics.deployment.resources import SPEC

        # SQS delays a message at most 900 s; a jitter as long as the period would overlap the next fan-out.
        period = SPEC.function("reconcile").schedule_period_s() or 900
        if not 0 <= v < min(901, period):
            raise ValueError(f"must be 0 to {min(900, period - 1)} seconds (at most SQS's 900 s delay, shorter "
                             f"than the reconcile schedule's {period} s period), got {v}")
        return v

    @field_validator("collector_id")
    @classmethod
    def _collector(cls, v: str) -> str:
        if not 1 <= len(v) <= 128 or any(ord(c) < 0x20 for c in v):
            raise ValueError("must be 1-128 printable characters")
        return v

    @classmethod
    def env_name(cls, field: str) -> str:
        return ENV_PREFIX + field.upper()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, timing_rules: bool | None = None,
                 **overrides: object) -> "Settings":
        """Build settings from ``LM_*`` variables; ``overrides`` (CLI flags) win when not None.

        ``timing_rules`` (H1) defaults to the host's choice (:mod:`lightmetrics.protocol.hosting`): always
        enforced on AWS; the local runtime, which runs the demo's and tests' short waits, passes False.
        """
        from lightmetrics.protocol.hosting import current

        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for name in cls.model_fields:
            var = cls.env_name(name)
            if var in env and env[var] != "":
                values[name] = env[var]
        values.update({k: v for k, v in overrides.items() if v is not None})
        enforce = current().timing_rules if timing_rules is None else timing_rules
        try:
            return cls.model_validate(values, context={_TIMING_RULES: enforce})
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None


def setting_from_env(name: str, env: Mapping[str, str] | None = None) -> Any:
    """One setting from its ``LM_*`` variable, validated by its field's rules, without the
    settings a command that needs only this one does not use (``LM_BUCKET``, ...): e.g.
    ``lmctl frame encode`` reads ``LM_MAX_FRAME_BYTES``, the limit ingest enforces (413 above).

    >>> setting_from_env("max_frame_bytes", {}), setting_from_env("max_frame_bytes", {"LM_MAX_FRAME_BYTES": "4194304"})
    (6291456, 4194304)
    """
    env = os.environ if env is None else env
    field = Settings.model_fields[name]
    raw = env.get(Settings.env_name(name), "")
    if raw == "":
        return field.default
    definition: Any = (field.annotation, field)
    one: Any = create_model("OneSetting", **{name: definition})
    try:
        return getattr(one.model_validate({name: raw}), name)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    lines = ["invalid configuration:"]
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else "?"
        var = Settings.env_name(field) if field in Settings.model_fields else field
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "is required"
        elif err["type"] == "extra_forbidden":
            msg = "is not a known setting"
        lines.append(f"  {var} (--{field.replace('_', '-')}): {msg}")
    return "\n".join(lines)
