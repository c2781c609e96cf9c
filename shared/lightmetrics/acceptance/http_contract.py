"""The ingest HTTP contract (docs/protocol.md §6-7), independent of how the request arrived.

The Lambda handler and the local runtime's HTTP endpoint both parse their request into
:class:`HttpRequest` and call :meth:`IngestService.handle`; the JSON body is
:meth:`AcceptResult.to_json`, identical to ``lmctl accept --json``.

Status codes: 200 accepted/duplicate, 409 identity_conflict, 503 unavailable (with
``Retry-After``), 400 invalid identity or frame, 401 bad or missing token, 403 token for
another agent (status ``unauthorized``: the token is rejected) or an agent/boot on the denylist
(status ``denied``, :class:`DenylistCache`: only that identity is refused), 405 not POST, 413 body
over ``LM_MAX_FRAME_BYTES``. The ``status`` word, not the HTTP code, tells an agent whether to stop
(its token) or to park one identity (docs/protocol.md §6).

Example:
    >>> service.handle(HttpRequest("POST", {"x-lm-agent-id": "a", ...}, body))   # doctest: +SKIP
    HttpResponse(status=200, body={'status': 'accepted', 'duplicate': False, ...})
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.acceptance.accept import AcceptContext, AcceptResult, AcceptStatus, accept_batch
from lightmetrics.acceptance.auth import CachedTokenKeys, bearer_token, verify_token
from lightmetrics.acceptance.denylist import DenylistCache
from lightmetrics.protocol.errors import AuthError, ConfigError, InvalidIdentityError
from lightmetrics.protocol.identity import BatchIdentity, id_from_header

log = logging.getLogger(__name__)

H_AGENT, H_BOOT, H_START, H_END = "x-lm-agent-id", "x-lm-boot-id", "x-lm-seq-start", "x-lm-seq-end"
#: the identity headers as the protocol spells them (docs/protocol.md §7), for the 400 that names a missing one
IDENTITY_HEADERS = {H_AGENT: "X-Lm-Agent-Id", H_BOOT: "X-Lm-Boot-Id", H_START: "X-Lm-Seq-Start", H_END: "X-Lm-Seq-End"}


@dataclass
class HttpRequest:
    method: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes


@dataclass
class HttpResponse:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    def to_lambda(self) -> dict[str, Any]:
        headers = {"content-type": "application/json", **self.headers}
        return {"statusCode": self.status, "headers": headers, "body": json.dumps(self.body, sort_keys=True)}


def _error(status: AcceptStatus, reason: str, http: int | None = None) -> AcceptResult:
    return AcceptResult(status=status, reason=reason, http_status_override=http)


def response_for(result: AcceptResult) -> HttpResponse:
    headers = {}
    if result.retry_after_s is not None:
        headers["retry-after"] = str(result.retry_after_s)
    return HttpResponse(result.http_status, result.to_json(), headers)


def parse_lambda_event(event: Mapping[str, Any]) -> HttpRequest:
    """Function URL / HTTP API (payload 2.0) or REST API (1.0) event -> :class:`HttpRequest`.

    Uses Powertools' event data classes; header names are matched case-insensitively.
    """
    from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent, LambdaFunctionUrlEvent

    if event.get("version") == "2.0" or "requestContext" in event and "http" in event["requestContext"]:
        ev: Any = LambdaFunctionUrlEvent(dict(event))
        method = ev.request_context.http.method
    else:
        ev = APIGatewayProxyEvent(dict(event))
        method = ev.http_method
    headers = {str(k).lower(): str(v) for k, v in (ev.headers or {}).items()}
    raw = ev.body or ""
    if ev.is_base64_encoded:
        try:
            body = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidIdentityError("body is not valid base64") from None
    else:
        body = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
    return HttpRequest(method=str(method).upper(), headers=headers, body=body)


class IngestService:
    """Authenticate, validate and accept one HTTP submission."""

    def __init__(self, ctx: AcceptContext, token_keys: CachedTokenKeys, denylist: DenylistCache | None = None) -> None:
        self.ctx = ctx
        self.token_keys = token_keys
        self.denylist = denylist

    def handle(self, request: HttpRequest) -> HttpResponse:
        return response_for(self._handle(request))

    def _handle(self, request: HttpRequest) -> AcceptResult:
        if request.method != "POST":
            return _error(AcceptStatus.INVALID, f"method {request.method} not allowed; POST the frame", 405)
        if request.headers.get("content-encoding", "identity").lower() not in ("", "identity"):
            return _error(AcceptStatus.INVALID, "Content-Encoding is not allowed; compression is a frame flag")
        if len(request.body) > self.ctx.max_frame_bytes:
            return _error(
                AcceptStatus.INVALID,
                f"body is {len(request.body)} bytes, over the {self.ctx.max_frame_bytes} byte limit",
                413,
            )
        if not request.body:  # before authentication too: nothing was sent that could be accepted
            return _error(AcceptStatus.INVALID, "empty body: POST one Lightmetrics frame (docs/frame-format.md)")
        try:
            token = bearer_token(request.headers.get("authorization"))
            missing = [shown for name, shown in IDENTITY_HEADERS.items() if name not in request.headers]
            if missing:
                return _error(AcceptStatus.INVALID, f"invalid identity headers: missing header {', '.join(missing)} "
                              f"(a submission names its identity in {', '.join(IDENTITY_HEADERS.values())})")
            identity = BatchIdentity.create(
                id_from_header(request.headers.get(H_AGENT), "agent_id"),
                id_from_header(request.headers.get(H_BOOT), "boot_id"),
                request.headers.get(H_START),
                request.headers.get(H_END),
            )
        except AuthError as exc:
            return _error(AcceptStatus.UNAUTHORIZED, str(exc), exc.status)
        except InvalidIdentityError as exc:
            return _error(AcceptStatus.INVALID, f"invalid identity headers: {exc}")
        try:
            verify_token(self.token_keys.get(), token, identity.agent_id)
        except AuthError as exc:  # 401, or 403 for a token minted for another agent: either way the token
            return _error(AcceptStatus.UNAUTHORIZED, str(exc), exc.status)
        except ConfigError as exc:
            log.error("token keys unusable: %s", exc)
            return AcceptResult(status=AcceptStatus.UNAVAILABLE, reason="token keys unavailable", retry_after_s=5)
        except Exception as exc:  # Secrets Manager unreachable: the agent retries
            log.error("token keys could not be loaded: %s", exc)
            return AcceptResult(status=AcceptStatus.UNAVAILABLE, reason="token keys unavailable", retry_after_s=5)
        # Step 1, continued: a denied agent/boot, from the cached denylist (never a per-request read).
        entry = self.denylist.denied(identity) if self.denylist is not None else None
        if entry is not None:
            return _error(AcceptStatus.DENIED, f"identity {identity.agent_id}/{identity.boot_id} is denied by an "
                          f"operator (denylist entry {entry}); see `lmctl conflicts list --agent {identity.agent_id}`")
        return accept_batch(self.ctx, identity, request.body)
