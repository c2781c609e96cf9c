"""SigV4 for the local admin endpoint: what a Function URL with ``AuthType: AWS_IAM`` checks on AWS.

:func:`verify_sigv4` recomputes the signature of a Function URL event (payload 2.0, as the local
HTTP server builds it) with botocore's own signer (:class:`botocore.auth.SigV4Auth`) over exactly
the headers the client signed, and compares it in constant time. Unsigned, malformed, expired
(more than 5 minutes of clock skew, as AWS), signed for another service/region, by an unknown
access key, or with a wrong secret: :class:`SigV4Error` (answered 403 ``Forbidden``, like AWS).
:func:`iam_guard` wraps a handler with that check and fills ``requestContext.authorizer.iam``
(the caller) as AWS does. :func:`sign_headers` is the client side (tests, the demo).

Example:
    >>> guarded = iam_guard(admin_handler, {"testing": "testing"})               # doctest: +SKIP
    >>> headers = sign_headers("GET", url, b"", access_key="testing", secret_key="testing")  # doctest: +SKIP
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from lightmetrics.local.function_host import ACCOUNT_ID, REGION

SERVICE = "lambda"  # Function URLs are signed for the "lambda" service
MAX_SKEW_S = 300
_AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request,"
    r"\s*SignedHeaders=(?P<signed>[a-z0-9;\-]+),\s*Signature=(?P<sig>[0-9a-f]{64})$"
)


class SigV4Error(Exception):
    """The request is not validly signed (HTTP 403)."""


def _body(event: Mapping[str, Any]) -> bytes:
    raw = event.get("body") or ""
    if event.get("isBase64Encoded"):
        return base64.b64decode(raw)
    return raw.encode() if isinstance(raw, str) else bytes(raw)


def verify_sigv4(event: Mapping[str, Any], credentials: Mapping[str, str], *, region: str = REGION,
                 service: str = SERVICE, now_s: Callable[[], float] = time.time) -> str:
    """Return the access key that validly signed ``event``; raise :class:`SigV4Error` otherwise."""
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    m = _AUTH_RE.match(headers.get("authorization", "").strip())
    if not m:
        raise SigV4Error("missing or malformed SigV4 Authorization header")
    if (m["region"], m["service"]) != (region, service):
        raise SigV4Error(f"signed for {m['service']}/{m['region']}, expected {service}/{region}")
    secret = credentials.get(m["key"])
    if secret is None:
        raise SigV4Error("unknown access key")
    amz_date = headers.get("x-amz-date", "")
    try:
        signed_at = calendar.timegm(time.strptime(amz_date, SIGV4_TIMESTAMP))
    except ValueError:
        raise SigV4Error("missing or malformed X-Amz-Date") from None
    if amz_date[:8] != m["date"] or abs(now_s() - signed_at) > MAX_SKEW_S:
        raise SigV4Error("signature expired or dated in the future")
    signed = m["signed"].split(";")
    if "host" not in signed or any(h not in headers for h in signed):
        raise SigV4Error("signed headers must include host and be present")
    body = _body(event)
    declared = headers.get("x-amz-content-sha256")
    if declared is not None and declared != hashlib.sha256(body).hexdigest():
        raise SigV4Error("x-amz-content-sha256 does not match the body")
    query = event.get("rawQueryString") or ""
    url = f"http://{headers['host']}{event.get('rawPath') or '/'}" + (f"?{query}" if query else "")
    request = AWSRequest(method=event["requestContext"]["http"]["method"], url=url, data=body,
                         headers={h: headers[h] for h in signed})
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(m["key"], secret), service, region)
    string_to_sign = signer.string_to_sign(request, signer.canonical_request(request))
    if not hmac.compare_digest(signer.signature(string_to_sign, request), m["sig"]):
        raise SigV4Error("signature does not match")
    return m["key"]


def iam_guard(handler: Callable[[dict[str, Any], Any], Any], credentials: Mapping[str, str], *,
              region: str = REGION, now_s: Callable[[], float] = time.time) -> Callable[[dict[str, Any], Any], Any]:
    """``handler`` behind a local ``AWS_IAM`` Function URL: 403 unless validly signed."""

    def guarded(event: dict[str, Any], context: Any) -> Any:
        try:
            key = verify_sigv4(event, credentials, region=region, now_s=now_s)
        except SigV4Error as exc:
            return {"statusCode": 403, "headers": {"content-type": "application/json", "x-lm-auth-error": str(exc)},
                    "body": json.dumps({"Message": "Forbidden"})}
        event = dict(event)
        context_ = dict(event.get("requestContext") or {})
        context_["authorizer"] = {"iam": {"accessKey": key, "accountId": ACCOUNT_ID, "callerId": key,
                                          "userArn": f"arn:aws:iam::{ACCOUNT_ID}:user/{key}", "userId": key}}
        event["requestContext"] = context_
        return handler(event, context)

    return guarded


def sign_headers(method: str, url: str, body: bytes = b"", *, access_key: str, secret_key: str,
                 region: str = REGION, headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """Headers (including ``Authorization``) of a SigV4-signed request, as any AWS SDK would send."""
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    SigV4Auth(Credentials(access_key, secret_key), SERVICE, region).add_auth(request)
    return dict(request.headers.items())


__all__ = ["MAX_SKEW_S", "SERVICE", "SigV4Error", "iam_guard", "sign_headers", "verify_sigv4"]
