"""Agent tokens: ``<key-id>.<hex HMAC-SHA256(secret[key-id], agent_id)>``.

Two keys may be active at once so a rotation never locks agents out: tokens minted with the
previous key keep working until that key is removed from the secret. Comparison is constant
time. The keys live in Secrets Manager as ``{"current": "k2", "keys": {"k1": "..", "k2": ".."}}``.

Example:
    >>> keys = TokenKeys(current="k1", keys={"k1": "00" * 32})
    >>> token = mint_token(keys, "agent-a")
    >>> verify_token(keys, token, "agent-a")
    >>> verify_token(keys, token, "agent-b")
    Traceback (most recent call last):
    ...
    lightmetrics.protocol.errors.AuthError: token is not valid for agent 'agent-b' (minted for another agent)
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets as _secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from lightmetrics.deployment.resources import SECRET
from lightmetrics.protocol.errors import AuthError, ConfigError

_KEY_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TOKEN_RE = re.compile(r"^(?P<kid>[A-Za-z0-9_-]{1,64})\.(?P<mac>[0-9a-f]{64})$")
MAX_ACTIVE_KEYS = SECRET.max_active_keys


class TokenKeys(BaseModel):
    """The secret's JSON: the key id new tokens use, and every key still accepted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    current: str
    keys: dict[str, str]

    @model_validator(mode="after")
    def _check(self) -> "TokenKeys":
        if not self.keys or len(self.keys) > MAX_ACTIVE_KEYS:
            raise ValueError(f"between 1 and {MAX_ACTIVE_KEYS} keys must be active")
        for kid, secret in self.keys.items():
            if not _KEY_ID_RE.match(kid):
                raise ValueError(f"key id {kid!r} must be 1-64 of [A-Za-z0-9_-]")
            if len(secret) < 32:
                raise ValueError(f"key {kid!r} is too short (at least 32 characters)")
        if self.current not in self.keys:
            raise ValueError(f"current key {self.current!r} is not among the keys")
        return self

    @classmethod
    def generate(cls, key_id: str = "k1") -> "TokenKeys":
        return cls(current=key_id, keys={key_id: _secrets.token_hex(32)})

    @classmethod
    def parse(cls, value: Any) -> "TokenKeys":
        try:
            if isinstance(value, (str, bytes)):
                return cls.model_validate_json(value)
            return cls.model_validate(value)
        except ValidationError as exc:
            raise ConfigError(f"token secret is malformed: {exc.errors()[0]['msg']}") from None


def _mac(secret: str, agent_id: str) -> str:
    return hmac.new(secret.encode("utf-8"), agent_id.encode("utf-8"), hashlib.sha256).hexdigest()


def mint_token(keys: TokenKeys, agent_id: str, key_id: str | None = None) -> str:
    kid = key_id or keys.current
    if kid not in keys.keys:
        raise ConfigError(f"key {kid!r} is not active")
    return f"{kid}.{_mac(keys.keys[kid], agent_id)}"


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or AuthError(401)."""
    if not authorization:
        raise AuthError("missing Authorization header", 401)
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("Authorization must be 'Bearer <token>'", 401)
    return token.strip()


def verify_token(keys: TokenKeys, token: str, agent_id: str) -> None:
    """Return if ``token`` authorizes ``agent_id``; raise AuthError 401 (bad) or 403 (other agent)."""
    m = _TOKEN_RE.match(token)
    if not m:
        raise AuthError("malformed token (expected <key-id>.<64 hex>)", 401)
    secret = keys.keys.get(m["kid"])
    if secret is None:
        raise AuthError(f"token key {m['kid']!r} is not active (revoked or unknown)", 401)
    if not hmac.compare_digest(_mac(secret, agent_id), m["mac"]):
        # A well-formed token under an active key that does not match: minted for another agent.
        raise AuthError(f"token is not valid for agent {agent_id!r} (minted for another agent)", 403)


class CachedTokenKeys:
    """Token keys fetched through ``load`` and kept for ``max_age_s`` (rotation staleness bound)."""

    def __init__(self, load: Callable[[], Any], max_age_s: float = 300, now: Callable[[], float] = time.monotonic):
        self._load = load
        self._max_age = max_age_s
        self._now = now
        self._lock = threading.Lock()
        self._value: TokenKeys | None = None
        self._at = 0.0

    def get(self) -> TokenKeys:
        with self._lock:
            if self._value is None or self._now() - self._at >= self._max_age:
                self._value = TokenKeys.parse(self._load())
                self._at = self._now()
            return self._value


def secrets_manager_loader(secret_id: str, client: Any) -> Callable[[], Any]:
    """Load the token secret through Powertools' Secrets provider (its own cache disabled:
    :class:`CachedTokenKeys` owns the staleness bound)."""
    from aws_lambda_powertools.utilities.parameters import SecretsProvider

    provider = SecretsProvider(boto3_client=client)

    def load() -> Any:
        return provider.get(secret_id, max_age=0, transform="json")

    return load
