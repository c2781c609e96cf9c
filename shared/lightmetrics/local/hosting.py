"""The local runtime as its functions' host: the test switches a local process takes from its
environment, and nothing else does.

* ``LM_FAULTS`` — fault rules (:mod:`lightmetrics.harness.testing.faults`) on every S3 client;
* ``LM_INJECT_LATENCY_MS`` / ``LM_INJECT_MAX_INFLIGHT`` — latency and a concurrency cap
  (:mod:`lightmetrics.harness.testing.latency`), one injector per process;
* ``LM_CLOCK_OFFSET_S`` — the process's clock runs this many seconds ahead (``lmctl demo``
  makes fresh orphans look older than the retry horizon to its reap tasks this way).

A local host also leaves the deployment timing rules (docs/protocol.md §18) unenforced: one
machine, one clock, and the deliberately short waits of the demo, the soak and the tests. Each
local process installs it at start — :class:`~lightmetrics.local.server.LocalRuntime` when it
starts, ``lmctl local collector`` before it imports the ingest function — so the functions it
hosts get it from :mod:`lightmetrics.protocol.hosting`, never by reading these variables themselves.

Example:
    >>> host = host_from_env({"LM_CLOCK_OFFSET_S": "600"})
    >>> host.clock.offset_ns, host.timing_rules
    (600000000000, False)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock, OffsetClock
from lightmetrics.protocol.hosting import Host, install

FAULTS_ENV = "LM_FAULTS"
CLOCK_OFFSET_ENV = "LM_CLOCK_OFFSET_S"


def host_from_env(env: Mapping[str, str] | None = None) -> Host:
    """The local host the switches in ``env`` (default: this process's environment) describe."""
    from lightmetrics.harness.testing import faults, latency

    env = dict(os.environ if env is None else env)
    hooks: list[Callable[[Any], object]] = []
    if env.get(FAULTS_ENV):
        json.loads(env[FAULTS_ENV])  # malformed rules fail the process at start, not its first request
        hooks.append(lambda client: faults.install_from_env(client, env))
    if latency.settings_from_env(env) is not None:  # validates the values now too
        hooks.append(lambda client: latency.install_from_env(client, env))
    clock: Clock = DEFAULT_CLOCK
    if env.get(CLOCK_OFFSET_ENV):
        try:
            clock = OffsetClock(int(float(env[CLOCK_OFFSET_ENV]) * 1_000_000_000))
        except ValueError:
            raise ValueError(f"{CLOCK_OFFSET_ENV} must be a number of seconds, got {env[CLOCK_OFFSET_ENV]!r}") from None
    return Host(clock=clock, s3_client_hooks=tuple(hooks), timing_rules=False)


def install_from_env(env: Mapping[str, str] | None = None) -> Host:
    """Make this process a local host configured by ``env``; returns the previous host."""
    return install(host_from_env(env))


__all__ = ["CLOCK_OFFSET_ENV", "FAULTS_ENV", "host_from_env", "install_from_env"]
