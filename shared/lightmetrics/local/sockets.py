"""Listening sockets and threaded servers that can close their connections: the local runtime's
moto server and the ingest endpoint share them."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from typing import Any

__all__ = ["ConnectionTracking", "listen"]


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening socket. Done here rather than by werkzeug, which calls sys.exit(1)
    on EADDRINUSE; this way a busy port is a plain OSError in the caller's thread."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


class ConnectionTracking(socketserver.BaseServer):
    """Threaded server mix-in that can close its open connections and join their threads.

    socketserver's daemon threads would otherwise linger after ``shutdown()`` on idle
    keep-alive connections (boto3 pools them), holding sockets until the client goes away.
    """

    def _init_tracking(self) -> None:
        self._conn_lock = threading.Lock()
        self._conns: dict[threading.Thread, socket.socket] = {}

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address), daemon=True, name="lm-local-conn"
        )
        with self._conn_lock:
            self._conns[thread] = request
        thread.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._conn_lock:
                self._conns.pop(threading.current_thread(), None)

    def close_connections(self, timeout_s: float = 5.0) -> None:
        """Shut down every open connection (unblocking its thread) and join the threads."""
        with self._conn_lock:
            conns = list(self._conns.items())
        for _, sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its thread
        deadline = time.monotonic() + timeout_s
        for thread, _ in conns:
            thread.join(max(0.0, deadline - time.monotonic()))
