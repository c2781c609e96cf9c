"""Latency and concurrency injection in front of S3, at the boto3 client.

moto answers in well under a millisecond, so a protocol that makes its round trips one after
another looks as fast as one that overlaps them. Real S3 costs tens of milliseconds per round
trip and throttles a connection pool. :class:`LatencyInjector` makes that visible: every request
that really goes out waits for one of ``max_inflight`` slots, then sleeps ``delay_s`` (the
injected round-trip time), then is sent while still holding its slot.

It wraps the endpoint's send step, the one botocore calls only when no ``before-send`` handler
answered, so it composes with :mod:`lightmetrics.harness.testing.faults`: a fault answered locally costs
no injected latency, and request counters (``before-send``) still see every attempt.

A process picks it up from ``LM_INJECT_LATENCY_MS`` and ``LM_INJECT_MAX_INFLIGHT`` (one injector
per process, so the cap holds across all of that process's S3 clients) — collectors and other
child processes inherit them through their environment.

Example:
    >>> inj = LatencyInjector(delay_s=0.020, max_inflight=8)
    >>> inj.attach(s3_client)                                      # doctest: +SKIP
    >>> s3_client.head_bucket(Bucket="b"); inj.requests, inj.peak_inflight   # doctest: +SKIP
    (1, 1)
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

ENV_LATENCY_MS = "LM_INJECT_LATENCY_MS"
ENV_MAX_INFLIGHT = "LM_INJECT_MAX_INFLIGHT"
DEFAULT_MAX_INFLIGHT = 8


class LatencyInjector:
    """A per-request delay and a cap on in-flight requests for any number of boto3 clients.

    ``sleep`` is injectable so tests can observe (and steer) the ordering without timing it.
    Counters: ``requests`` (sent through the injector), ``peak_inflight`` (most slots ever held at
    once), ``inflight`` (held now), ``delays`` (sleeps applied).
    """

    def __init__(self, delay_s: float, max_inflight: int = DEFAULT_MAX_INFLIGHT,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if delay_s < 0:
            raise ValueError("delay_s must be >= 0")
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self.delay_s = delay_s
        self.max_inflight = max_inflight
        self._sleep = sleep
        self._slots = threading.BoundedSemaphore(max_inflight)
        self._lock = threading.Lock()
        self.requests = 0
        self.inflight = 0
        self.peak_inflight = 0
        self.delays = 0
        self._windows: list[dict[str, int]] = []

    def attach(self, client: Any) -> Any:
        """Route ``client``'s outgoing requests through this injector (idempotent per client)."""
        # botocore runs every before-send handler and uses the first response, so a handler that
        # sent the request itself would also send requests a fault injector meant to refuse.
        # The endpoint's _send runs only when no handler answered: wrap that instead.
        endpoint = client._endpoint
        if getattr(endpoint, "_lm_latency", None) is self:
            return client
        original = endpoint._send

        def send(request: Any) -> Any:
            return self.through(lambda: original(request))

        endpoint._send = send
        endpoint._lm_latency = self
        return client

    def through(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` (one round trip) inside a slot, after the injected delay."""
        with self._slots:
            with self._lock:
                self.requests += 1
                self.inflight += 1
                self.peak_inflight = max(self.peak_inflight, self.inflight)
                for window in self._windows:
                    window["peak_inflight"] = max(window["peak_inflight"], self.inflight)
                    window["requests"] += 1
            try:
                if self.delay_s:
                    self._sleep(self.delay_s)
                    with self._lock:
                        self.delays += 1
                return call()
            finally:
                with self._lock:
                    self.inflight -= 1

    @contextmanager
    def window(self) -> Iterator[dict[str, int]]:
        """Count what goes through inside the block: yields a dict whose ``requests`` and
        ``peak_inflight`` (the most requests in flight at once, counted from the block's start) grow
        while it runs. Whether a job overlaps its round trips is then a count, not a timing.

        Example:
            >>> with inj.window() as seen:                                  # doctest: +SKIP
            ...     run_job()
            >>> seen["peak_inflight"] > 1                                   # doctest: +SKIP
            True
        """
        seen = {"requests": 0, "peak_inflight": 0}
        with self._lock:
            self._windows.append(seen)
        try:
            yield seen
        finally:
            with self._lock:
                self._windows = [w for w in self._windows if w is not seen]  # by identity: equal dicts may differ

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"delay_ms": self.delay_s * 1000, "max_inflight": self.max_inflight, "requests": self.requests,
                    "peak_inflight": self.peak_inflight, "delays": self.delays}


_PROCESS: dict[tuple[float, int], LatencyInjector] = {}
_PROCESS_LOCK = threading.Lock()


def settings_from_env(env: Mapping[str, str] | None = None) -> tuple[float, int] | None:
    """``(delay_s, max_inflight)`` from ``LM_INJECT_LATENCY_MS`` / ``LM_INJECT_MAX_INFLIGHT``, or None."""
    env = os.environ if env is None else env
    raw_ms = env.get(ENV_LATENCY_MS, "").strip()
    raw_cap = env.get(ENV_MAX_INFLIGHT, "").strip()
    if not raw_ms and not raw_cap:
        return None
    try:
        delay_ms = float(raw_ms or 0)
        cap = int(raw_cap or DEFAULT_MAX_INFLIGHT)
    except ValueError:
        raise ValueError(f"{ENV_LATENCY_MS}/{ENV_MAX_INFLIGHT} must be numbers, got {raw_ms!r}/{raw_cap!r}") from None
    if delay_ms < 0 or cap < 1:
        raise ValueError(f"{ENV_LATENCY_MS} must be >= 0 and {ENV_MAX_INFLIGHT} >= 1")
    return delay_ms / 1000.0, cap


def process_injector(delay_s: float, max_inflight: int) -> LatencyInjector:
    """The one injector of this process for these settings (shared by all its clients)."""
    with _PROCESS_LOCK:
        key = (delay_s, max_inflight)
        if key not in _PROCESS:
            _PROCESS[key] = LatencyInjector(delay_s, max_inflight)
        return _PROCESS[key]


def install_from_env(client: Any, env: Mapping[str, str] | None = None) -> LatencyInjector | None:
    """Attach the process's injector to ``client`` if ``LM_INJECT_*`` is set (else a no-op)."""
    parsed = settings_from_env(env)
    if parsed is None:
        return None
    injector = process_injector(*parsed)
    injector.attach(client)
    return injector
