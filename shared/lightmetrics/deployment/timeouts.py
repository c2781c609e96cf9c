"""The deployed functions' timeouts as the timing rules' bounds (:mod:`lightmetrics.protocol.timing`):
the longest an accept or a job's task can run, read from the resource spec (the one source), so
validating settings imports no service (ingest starts cold).

Example:
    >>> longest_accept_s() < longest_reap_task_s()
    True
"""

from __future__ import annotations

from collections.abc import Iterable

from lightmetrics.protocol.timing import LEASE_MARGIN_S


def longest_accept_s() -> int:
    """The longest an accept can run: the ingest function's timeout (Lambda stops it there)."""
    from lightmetrics.deployment.resources import SPEC

    return SPEC.function("ingest").timeout_s


def longest_task_timeout_s(task_functions: Iterable[str]) -> int:
    """The longest Lambda timeout of these task functions, from the resource spec (the one source)."""
    from lightmetrics.deployment.resources import FUNCTIONS

    names = set(task_functions)
    return max(f.timeout_s for f in FUNCTIONS if f.name in names)


def min_lease_s(task_functions: Iterable[str]) -> int:
    """Rule L1 for a job of Lambda tasks: its longest task timeout plus ``LEASE_MARGIN_S``."""
    return longest_task_timeout_s(task_functions) + LEASE_MARGIN_S


def longest_reap_task_s() -> int:
    """The longest a reap task can run (its Lambda timeout) plus :data:`LEASE_MARGIN_S`: after that no
    invocation of it (nor a twin Step Functions started beside it) can still place a marker."""
    from lightmetrics.deployment.resources import FUNCTIONS

    return min_lease_s(f.name for f in FUNCTIONS if f.name.startswith("reap-"))


__all__ = ["longest_accept_s", "longest_reap_task_s", "longest_task_timeout_s", "min_lease_s"]
