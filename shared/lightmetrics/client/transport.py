"""HTTP to one ingest endpoint: POST a frame, get ``(status, JSON body, Retry-After)`` or a
:class:`TransportError` (connection refused, reset, timeout) that the client treats as retryable.

One persistent HTTP/1.1 connection per endpoint. A request that fails on a *reused* connection
before any answer arrived is tried once more on a fresh one: the server may simply have closed
an idle keep-alive connection, which is not an outage (and resending is safe — ingest is
idempotent by content).

Example:
    >>> Endpoint.parse("127.0.0.1:4567").url
    'http://127.0.0.1:4567/'
    >>> Endpoint.parse("https://abc.lambda-url.us-east-1.on.aws").port
    443
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from lightmetrics.client.errors import ClientError


class TransportError(ClientError):
    """No HTTP answer: ``kind`` is ``refused``, ``timeout`` or ``network``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Endpoint:
    """An ingest URL (``http://host:port/path``; a bare ``host:port`` means http)."""

    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> "Endpoint":
        raw = url.strip()
        if "://" not in raw:
            raw = "http://" + raw
        parts = urlsplit(raw)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint {url!r} must be http(s)://host[:port][/path]")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"endpoint {url!r} has an invalid port") from None
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.scheme, parts.hostname, port, path)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.path}"


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: dict[str, Any]
    retry_after_s: float | None = None

    @property
    def status_word(self) -> str:
        """The body's ``status`` (``accepted``, ...), else ``http-<code>`` (e.g. Lambda's 429)."""
        word = self.body.get("status")
        return word if isinstance(word, str) and word else f"http-{self.status}"


class Transport(Protocol):
    def post(self, endpoint: Endpoint, headers: dict[str, str], body: bytes) -> HttpAnswer: ...

    def close(self) -> None: ...


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {"raw": raw[:500].decode("utf-8", "replace")}
    return value if isinstance(value, dict) else {"raw": value}


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: ignored, the backoff applies


class HttpTransport:
    """``http.client`` with a keep-alive connection per endpoint and one timeout per request."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self._conns: dict[Endpoint, tuple[http.client.HTTPConnection, bool]] = {}

    def _conn(self, ep: Endpoint) -> tuple[http.client.HTTPConnection, bool]:
        held = self._conns.get(ep)
        if held is not None:
            return held[0], True
        cls = http.client.HTTPSConnection if ep.scheme == "https" else http.client.HTTPConnection
        conn = cls(ep.host, ep.port, timeout=self.timeout_s)
        self._conns[ep] = (conn, False)
        return conn, False

    def _drop(self, ep: Endpoint) -> None:
        held = self._conns.pop(ep, None)
        if held is not None:
            held[0].close()

    def post(self, endpoint: Endpoint, headers: dict[str, str], body: bytes) -> HttpAnswer:
        for _ in range(2):
            conn, reused = self._conn(endpoint)
            try:
                conn.request("POST", endpoint.path, body=body, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._drop(endpoint)
                if reused:
                    continue  # a stale keep-alive connection: once more on a fresh one
                raise TransportError(f"{endpoint.url}: connection lost: {exc}", "network") from None
            except ConnectionRefusedError as exc:
                self._drop(endpoint)
                raise TransportError(f"{endpoint.url}: connection refused: {exc}", "refused") from None
            except (TimeoutError, socket.timeout) as exc:
                self._drop(endpoint)
                raise TransportError(f"{endpoint.url}: timed out after {self.timeout_s} s: {exc}", "timeout") from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop(endpoint)
                raise TransportError(f"{endpoint.url}: {type(exc).__name__}: {exc}", "network") from None
            self._conns[endpoint] = (conn, True)
            if resp.will_close:
                self._drop(endpoint)
            return HttpAnswer(resp.status, _parse_body(raw), _retry_after(resp.getheader("Retry-After")))
        raise TransportError(f"{endpoint.url}: connection lost twice", "network")  # pragma: no cover

    def close(self) -> None:
        for ep in list(self._conns):
            self._drop(ep)
