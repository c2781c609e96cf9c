"""Fault injection at the boto3 client, on botocore's ``before-send`` event.

Faults happen where real ones do — between our code and S3 — and a fault can be chosen to
land or not land the request:

* ``403`` (AccessDenied), ``409``, ``412``, ``500``, ``503`` (SlowDown): answered locally, the
  request never reaches S3;
* ``timeout``: the request is not sent, the caller sees a read timeout;
* ``timeout_after_landing``: the request *is* sent and applied by S3 (or DynamoDB), then the caller
  sees a read timeout — the case that tempts an implementation into a double acceptance; a client
  with botocore's own retries (the control table's) then sends the request again, and a
  conditional write's retry fails its own condition;
* ``stall_after_landing``: the request lands, a marker file is touched, then the call sleeps
  (the demo kills the process in that sleep: a real crash between two protocol steps);
* ``down``: connection refused, nothing sent.

A process can install rules from ``LM_FAULTS`` (JSON list of rule objects).

Example:
    >>> inj = FaultInjector(s3_client)                                            # doctest: +SKIP
    >>> inj.add(FaultRule(fault="409", operation="PutObject", key_contains="accepted/v1/"))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from botocore.httpsession import URLLib3Session

_ERRORS = {
    "403": (403, "AccessDenied", "Access Denied"),
    "409": (409, "ConditionalRequestConflict", "A conflicting conditional operation is in progress."),
    "412": (412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold"),
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "SlowDown", "Please reduce your request rate."),
}
FAULTS = (*_ERRORS, "timeout", "timeout_after_landing", "stall_after_landing", "down")


@dataclass
class FaultRule:
    """Inject ``fault`` into matching requests: skip the first ``after`` matches, then fire ``times``.

    ``every`` > 1 fires only on every Nth match after that (a steady fault rate for soaks,
    deterministic unlike a probability).
    """

    fault: str
    operation: str | None = None  # botocore operation name, e.g. "PutObject"
    key_contains: str | None = None  # substring of the decoded request URL
    #: substring of the request body: DynamoDB requests all go to one URL, their item key is in the JSON body
    body_contains: str | None = None
    times: int = 1  # -1 = forever
    after: int = 0
    every: int = 1
    stall_s: float = 30.0
    marker_file: str | None = None
    seen: int = field(default=0, compare=False)
    fired: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; one of {FAULTS}")
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {self.every}")


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_kwargs: Any):  # type: ignore[no-untyped-def]
        yield self._body


def _text(body: Any) -> str:
    """A request body as text to match on (a streamed S3 body matches nothing)."""
    if isinstance(body, bytes):
        return body.decode("utf-8", "replace")
    return body if isinstance(body, str) else ""


def _error_response(url: str, fault: str) -> AWSResponse:
    status, code, message = _ERRORS[fault]
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>{message}</Message><RequestId>injected</RequestId></Error>"
    ).encode()
    return AWSResponse(url, status, {"Content-Type": "application/xml"}, _Raw(body))


class FaultInjector:
    """Holds fault rules for one or more clients; thread-safe."""

    def __init__(self, *clients: Any) -> None:
        self.rules: list[FaultRule] = []
        self.log: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._http = URLLib3Session()
        for client in clients:
            self.attach(client)

    def attach(self, client: Any) -> None:
        # Registered last so request counters registered earlier still see the attempt.
        client.meta.events.register("before-send", self._before_send)

    def add(self, rule: FaultRule) -> FaultRule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _match(self, operation: str, url: str, body: Any = b"") -> FaultRule | None:
        with self._lock:
            for rule in self.rules:
                if rule.operation and rule.operation != operation:
                    continue
                if rule.key_contains and rule.key_contains not in url:
                    continue
                if rule.body_contains and rule.body_contains not in _text(body):
                    continue
                rule.seen += 1
                if rule.seen <= rule.after or (rule.times >= 0 and rule.fired >= rule.times):
                    continue
                if (rule.seen - rule.after) % rule.every:
                    continue
                rule.fired += 1
                self.log.append((operation, rule.fault, url))
                return rule
        return None

    def _before_send(self, request: Any, event_name: str = "", **_kwargs: Any) -> AWSResponse | None:
        operation = event_name.rsplit(".", 1)[-1]
        url = unquote(request.url)
        rule = self._match(operation, url, request.body)
        if rule is None:
            return None
        if rule.fault in _ERRORS:
            return _error_response(request.url, rule.fault)
        if rule.fault == "down":
            raise EndpointConnectionError(endpoint_url=request.url)
        if rule.fault == "timeout":
            raise ReadTimeoutError(endpoint_url=request.url)
        response = self._http.send(request)  # the request lands
        if rule.fault == "timeout_after_landing":
            raise ReadTimeoutError(endpoint_url=request.url)
        # stall_after_landing: tell the outside world, then hang (to be killed here).
        if rule.marker_file:
            Path(rule.marker_file).write_text(url)
        time.sleep(rule.stall_s)
        return response


def install_from_env(client: Any, env: dict[str, str] | None = None) -> FaultInjector | None:
    """Install the rules in ``LM_FAULTS`` (a JSON list of FaultRule fields), if set."""
    raw = (env if env is not None else os.environ).get("LM_FAULTS")
    if not raw:
        return None
    injector = FaultInjector(client)
    for spec in json.loads(raw):
        injector.add(FaultRule(**spec))
    return injector
