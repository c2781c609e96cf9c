"""What the process hosting the functions supplies: the clock, hooks on every S3 client, and
whether the deployment's timing rules (docs/protocol.md §18) are enforced.

On AWS the Lambda runtime is the host and supplies nothing: the system clock, plain clients,
every rule enforced — :data:`DEPLOYED`, the default. Nothing here reads the environment, so no
variable set on a deployed function can change it. The local runtime installs a host of its own
(:mod:`lightmetrics.local.hosting`: fault and latency injection at the client, a shifted clock,
the short waits of a laptop run), and so do benchmarks and tests; a deployed function never does.

Example:
    >>> from lightmetrics.protocol.clock import FrozenClock
    >>> with hosted(Host(clock=FrozenClock(7))):
    ...     current().clock.now_ns()
    7
    >>> current() is DEPLOYED
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock


@dataclass(frozen=True)
class Host:
    """``clock``: what "now" is for contexts built without an explicit clock. ``s3_client_hooks``:
    called with every S3 client :mod:`lightmetrics.composition.services` builds. ``timing_rules``: whether
    configuration read from the environment must satisfy the timing rules (H1, D1).
    ``aws_credentials``: what the hosted code's AWS clients sign with (botocore's argument names), None
    for the default chain — the local function host runs each function as its own role this way; on AWS
    the Lambda runtime puts the role's credentials in the environment."""

    clock: Clock = DEFAULT_CLOCK
    s3_client_hooks: tuple[Callable[[Any], object], ...] = ()
    timing_rules: bool = True
    aws_credentials: Mapping[str, str] | None = None


#: The host of a deployed function: the Lambda runtime, which adds nothing.
DEPLOYED = Host()

_process_host: Host = DEPLOYED
_lock = threading.Lock()
_override: ContextVar[Host | None] = ContextVar("lightmetrics_host", default=None)


def current() -> Host:
    """The host of the running code: a :func:`hosted` block's, else the process's."""
    return _override.get() or _process_host


def install(host: Host) -> Host:
    """Make ``host`` the whole process's host (a local runtime process does, at start); returns
    the previous one, to put back."""
    global _process_host
    with _lock:
        previous, _process_host = _process_host, host
    return previous


@contextmanager
def hosted(host: Host) -> Iterator[Host]:
    """Run the block (and what it runs in copied contexts) under ``host``."""
    token = _override.set(host)
    try:
        yield host
    finally:
        _override.reset(token)


__all__ = ["DEPLOYED", "Host", "current", "hosted", "install"]
