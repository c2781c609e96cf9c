"""The local ingest endpoint: the ingest Lambda's Function URL, served over HTTP by this process.

:class:`IngestHTTPServer` parses each request into the Function URL's event (payload 2.0) and calls
the ingest handler with it, as the Function URL would; ``lmctl local up`` and the collector
processes of the demo and the soak serve the real handler through it.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl

from lightmetrics.local.function_host import Handler, LambdaContext
from lightmetrics.local.server import DEFAULT_PORT
from lightmetrics.local.sockets import ConnectionTracking, listen

__all__ = ["DEFAULT_MAX_BODY_BYTES", "IngestHTTPServer"]

LOG = logging.getLogger(__name__)

#: Lambda's synchronous request payload limit; the real limit is ``LM_MAX_FRAME_BYTES``.
DEFAULT_MAX_BODY_BYTES = 6 * 1024 * 1024



class _IngestServer(ConnectionTracking, ThreadingHTTPServer):
    def __init__(self, sock: socket.socket, owner: IngestHTTPServer) -> None:
        self._init_tracking()
        self.owner = owner
        self.address_family = sock.family
        super().__init__(sock.getsockname()[:2], _IngestRequestHandler, bind_and_activate=False)
        self.socket.close()  # replace the unbound socket TCPServer made with ours
        self.socket = sock
        self.server_address = sock.getsockname()
        self.server_name, self.server_port = "localhost", self.server_address[1]

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up or stalled past the timeout is routine, not a server error.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            LOG.debug("ingest connection from %s dropped: %s", client_address, exc)
        else:
            LOG.error("ingest connection from %s failed", client_address, exc_info=exc)


class _IngestRequestHandler(BaseHTTPRequestHandler):
    """One HTTP request -> one Function URL (payload format 2.0) event -> the handler."""

    server: _IngestServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(
            self.server.owner.request_timeout_s
        )  # a stalled client cannot pin a thread

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("ingest %s - " + format, self.address_string(), *args)

    # Every method goes through the same path; the handler decides what it accepts.
    def do_POST(self) -> None:
        self._dispatch()

    do_GET = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_POST

    def handle_expect_100(self) -> bool:
        # Refuse an oversized body before the client is invited to send it.
        if self._content_length() is None:
            return False
        return super().handle_expect_100()

    def _content_length(self) -> int | None:
        """The validated body length (0 if none), or None after sending 400/411/413."""
        values = self.headers.get_all("Content-Length") or []
        if self.headers.get("Transfer-Encoding"):
            self._refuse(411, "chunked bodies are not supported; send Content-Length")
            return None
        if not values:
            return 0  # neither header: the body is empty (RFC 9112 §6.3), as a Function URL reads it
        if len({v.strip() for v in values}) != 1 or not values[0].strip().isdigit():
            self._refuse(400, "malformed Content-Length")
            return None
        length = int(values[0].strip())
        limit = self.server.owner.max_body_bytes
        if length > limit:
            self._refuse(413, f"body of {length} bytes exceeds the limit of {limit} bytes")
            return None
        return length

    def _refuse(self, status: int, reason: str) -> None:
        """Answer without reading the body, then close: the unread body makes the stream unusable."""
        self.close_connection = True
        self._write(
            status,
            {"Content-Type": "application/json"},
            json.dumps({"status": "invalid", "duplicate": False, "reason": reason}).encode(),
        )
        self._linger()

    def _linger(self) -> None:
        """Half-close, then discard (never buffer) a bounded amount of what the client still sends.

        Closing a socket with unread input makes the kernel send RST, and a client still
        uploading can lose our already-sent response to it (the usual "lingering close").
        """
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(0.5)
            budget = 1 << 20
            while budget > 0:
                chunk = self.connection.recv(min(65536, budget))
                if not chunk:
                    break
                budget -= len(chunk)
        except OSError:
            pass

    def _write(
        self, status: int, headers: Mapping[str, str], body: bytes, cookies: Sequence[str] = ()
    ) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, str(value))
        for cookie in cookies:
            self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _dispatch(self) -> None:
        length = self._content_length()
        if length is None:
            return
        body = self.rfile.read(length) if length else b""
        if len(body) != length:
            self.close_connection = True
            self._write(
                400,
                {"Content-Type": "application/json"},
                b'{"status":"invalid","duplicate":false,"reason":"body shorter than Content-Length"}',
            )
            return
        owner = self.server.owner
        event = self._event(body)
        context = LambdaContext(owner.function_name)
        try:
            result = owner.handler(event, context)
        except Exception:
            LOG.exception("ingest handler failed")
            # As a Function URL answers a crashed function; collectors treat it as retryable.
            self._write(
                502,
                {"Content-Type": "application/json"},
                b'{"status":"unavailable","duplicate":false,"reason":"internal error"}',
            )
            return
        self._write_result(result)

    def _write_result(self, result: Any) -> None:
        if not (isinstance(result, dict) and "statusCode" in result):
            # A Function URL serializes any other return value as a 200 JSON body.
            self._write(200, {"Content-Type": "application/json"}, json.dumps(result).encode())
            return
        raw = result.get("body") or ""
        if result.get("isBase64Encoded"):
            payload = base64.b64decode(raw)
        else:
            payload = raw.encode() if isinstance(raw, str) else json.dumps(raw).encode()
        headers = {str(k): str(v) for k, v in (result.get("headers") or {}).items()}
        if not any(k.lower() == "content-type" for k in headers):  # one header, whatever its case
            headers["Content-Type"] = "application/json"
        self._write(int(result["statusCode"]), headers, payload, list(result.get("cookies") or []))

    def _event(self, body: bytes) -> dict[str, Any]:
        """The Lambda Function URL event, payload format 2.0."""
        raw_path, _, raw_query = self.path.partition("?")
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]},{value}" if key in headers else value
        cookies = [c.strip() for c in headers.pop("cookie", "").split(";") if c.strip()]
        query: dict[str, str] = {}
        for name, value in parse_qsl(raw_query, keep_blank_values=True):
            query[name] = f"{query[name]},{value}" if name in query else value
        now = time.time()
        host = headers.get("host", f"localhost:{self.server.server_port}")
        event: dict[str, Any] = {
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": raw_path,
            "rawQueryString": raw_query,
            "headers": headers,
            "requestContext": {
                "accountId": "anonymous",
                "apiId": "local",
                "domainName": host,
                "domainPrefix": host.split(".", 1)[0],
                "http": {
                    "method": self.command,
                    "path": raw_path,
                    "protocol": self.request_version,
                    "sourceIp": self.client_address[0],
                    "userAgent": headers.get("user-agent", ""),
                },
                "requestId": str(uuid.uuid4()),
                "routeKey": "$default",
                "stage": "$default",
                "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
                "timeEpoch": int(now * 1000),
            },
            "isBase64Encoded": False,
        }
        if cookies:
            event["cookies"] = cookies
        if query:
            event["queryStringParameters"] = query
        if body:
            # Always base64: frames are binary, and handlers must decode either way.
            event["body"] = base64.b64encode(body).decode("ascii")
            event["isBase64Encoded"] = True
        return event


class IngestHTTPServer:
    """The local ingest endpoint: HTTP requests become Function URL events for ``handler``.

    Content-Length is checked against ``max_body_bytes`` before anything of the body is read:
    413 if over, 400 if malformed, 411 for a chunked body, each with a JSON body
    ``{"status": "invalid", "duplicate": false, "reason": ...}`` (the documented response shape);
    a request with neither Content-Length nor Transfer-Encoding has an empty body and reaches the
    handler, as it does through a Function URL.

    Example::

        >>> srv = IngestHTTPServer(ingest_handler, port=rt.ingest_port,           # doctest: +SKIP
        ...                        max_body_bytes=1 << 20).start()
        >>> srv.url                                                                # doctest: +SKIP
        'http://127.0.0.1:4567'
        >>> srv.stop()                                                             # doctest: +SKIP
    """

    def __init__(
        self,
        handler: Handler,
        *,
        port: int = DEFAULT_PORT + 1,
        host: str = "127.0.0.1",
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        function_name: str = "ingest",
        request_timeout_s: float = 30.0,
    ) -> None:
        self.handler = handler
        self.host = host
        self.port = port  # 0 picks a free port at start()
        self.max_body_bytes = max_body_bytes
        self.function_name = function_name
        self.request_timeout_s = request_timeout_s
        self._server: _IngestServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError("IngestHTTPServer already started")
        sock = listen(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._server = _IngestServer(sock, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            daemon=True,
            name="lm-local-ingest",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.close_connections()
            server.server_close()
        if thread is not None:
            thread.join(5.0)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
