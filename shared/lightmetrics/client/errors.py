"""Typed errors of the agent client (:mod:`lightmetrics.client`).

The CLI maps each to an exit code without parsing messages: :class:`AuthRejected` is exit 2
(fix the token), :class:`SpoolError` is exit 2 (bad spool), anything transient never raises —
it is reported as pending work (exit 4).

Example:
    >>> err = AuthRejected(401, "token key 'k0' is not active", identity=None, endpoint="http://127.0.0.1:4567")
    >>> isinstance(err, ClientStopped), err.http_status
    (True, 401)
"""

from __future__ import annotations

from typing import Any

from lightmetrics.protocol.errors import LightmetricsError
from lightmetrics.protocol.identity import BatchIdentity


class ClientError(LightmetricsError):
    """Base class of every error raised by the agent client."""


class ClientConfigError(ClientError, ValueError):
    """The client was given an unusable token, endpoint list or agent id (exit 2)."""


class SpoolError(ClientError):
    """The spool directory or one of its files is unusable (unreadable, foreign, malformed)."""


class SpoolConflictError(SpoolError):
    """``enqueue`` was given different bytes for an identity the spool already holds.

    The spool never replaces a batch: two encodings of one identity are exactly the identity
    conflict the protocol exists to catch, so the agent must not create one locally.
    """

    def __init__(self, identity: BatchIdentity, held_sha256: str, new_sha256: str) -> None:
        super().__init__(
            f"{identity}: the spool already holds frame {held_sha256[:12]}..., refusing different bytes "
            f"{new_sha256[:12]}... for the same identity"
        )
        self.identity = identity
        self.held_sha256 = held_sha256
        self.new_sha256 = new_sha256


class ClientStopped(ClientError):
    """The client stopped on purpose; nothing was deleted from the spool."""


class AuthRejected(ClientStopped):
    """Ingest rejected the token: 401 (bad, missing or revoked token) or a 403 that is not
    ``denied`` (status ``unauthorized``: a token minted for another agent). Retrying cannot help:
    an operator must fix the token. (A 403 ``denied`` is not this: it refuses one identity on the
    denylist, and the client parks that boot's batches and keeps delivering the rest.)
    """

    def __init__(
        self,
        http_status: int,
        reason: str,
        *,
        identity: BatchIdentity | None,
        endpoint: str,
        body: dict[str, Any] | None = None,
    ) -> None:
        hint = (
            "mint a token for this agent with `lmctl agent-token --agent-id ...`"
            if http_status == 401
            else "the token was minted for another agent: give this agent its own (`lmctl agent-token`)"
        )
        super().__init__(f"ingest at {endpoint} answered {http_status} (token rejected): {reason}; {hint}")
        self.http_status = http_status
        self.reason = reason
        self.identity = identity
        self.endpoint = endpoint
        self.body = body or {}
