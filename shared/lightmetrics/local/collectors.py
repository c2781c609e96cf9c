"""Collector processes: the real ingest handler served over HTTP, one OS process each.

The demo and the soak run collectors as separate processes so that "a collector killed
mid-accept" is a real ``SIGKILL``: no cleanup, no response, whatever S3 request was in flight
either landed or did not. Each collector is ``lmctl local collector --port P`` configured only by
``LM_*`` variables, like the Lambda; ``LM_FAULTS`` puts client-side faults into its S3 client.

Example:
    >>> fleet = CollectorFleet(3, env)                       # doctest: +SKIP
    >>> fleet.endpoints()                                     # doctest: +SKIP
    ['http://127.0.0.1:40211', 'http://127.0.0.1:40213', 'http://127.0.0.1:40215']
    >>> fleet.kill(1); fleet.restart(1)                       # doctest: +SKIP
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def collector_environment(system: object) -> dict[str, str]:
    """This process's environment pointed at ``system`` (a LocalSystem), minus any ``LM_FAULTS``:
    collectors get faults only when a caller adds them per collector."""
    env = dict(os.environ)
    env.pop("LM_FAULTS", None)
    env.pop("AWS_SESSION_TOKEN", None)
    env.update(system.environment())  # type: ignore[attr-defined]
    # a collector runs the ingest function: as its role, as a Lambda runtime's environment would say
    credentials = system.principal_session("ingest").credentials  # type: ignore[attr-defined]
    if credentials:
        from lightmetrics.local.principals import session_environment

        env.update(session_environment(credentials))
    return env


class CollectorStartError(RuntimeError):
    """A collector process exited or did not listen in time."""


class CollectorFleet:
    """``n`` collector processes; ``urls[i]`` (``host:port``) is None while collector i is down.

    ``env`` is the environment of every collector; ``extra_env[i]`` is added for collector i
    (fault rules, for example). A restarted collector keeps its port, so agents that remember
    endpoints find it again.
    """

    def __init__(self, n: int, env: Mapping[str, str], extra_env: Mapping[int, Mapping[str, str]] | None = None,
                 *, ready_timeout_s: float = 60.0) -> None:
        self.env = dict(env)
        self.extra_env = {i: dict(e) for i, e in (extra_env or {}).items()}
        self.ports = [free_port() for _ in range(n)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self.urls: list[str | None] = [None] * n
        self.kills = 0
        self._lock = threading.Lock()
        for i in range(n):
            self._spawn(i)
        for i in range(n):
            self._wait_ready(i, ready_timeout_s)

    def __len__(self) -> int:
        return len(self.ports)

    def endpoints(self) -> list[str]:
        """Every collector's base URL, down or not (an agent's configured endpoint list)."""
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def _spawn(self, i: int) -> None:
        env = dict(self.env, LM_COLLECTOR_ID=f"collector-{i + 1}", **self.extra_env.get(i, {}))
        cmd = [sys.executable, "-m", "lightmetrics.cli.main", "local", "collector", "--port", str(self.ports[i])]
        self.procs[i] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def _wait_ready(self, i: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        proc = self.procs[i]
        assert proc is not None
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise CollectorStartError(f"collector-{i + 1} exited at start: {err[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.ports[i]), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise CollectorStartError(f"collector-{i + 1} did not listen within {timeout_s} s") from None
                time.sleep(0.1)
        with self._lock:
            self.urls[i] = f"127.0.0.1:{self.ports[i]}"

    def alive(self) -> list[int]:
        with self._lock:
            return [i for i, u in enumerate(self.urls) if u is not None]

    def kill(self, i: int) -> None:
        """SIGKILL collector i (no cleanup, no response to requests in flight)."""
        with self._lock:
            self.urls[i] = None
            proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
            self.kills += 1

    def restart(self, i: int, *, timeout_s: float = 60.0) -> None:
        self.kill(i)
        self._spawn(i)
        self._wait_ready(i, timeout_s)

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in self.procs:
            if p is None:
                continue
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
