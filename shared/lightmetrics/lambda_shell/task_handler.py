"""The Lambda handler shape shared by every Step Functions task (the walk's and the reap's).

A task handler builds its worker (a :class:`~lightmetrics.derived.walk.Walker`, a
:class:`~lightmetrics.reaps.Reaper`) once per Lambda container, calls the worker's method for its
step with the state machine's input, and maps errors for the ASL ``Retry``/``Catch`` clauses:
the worker's own typed errors pass through under their class names, transient AWS errors become
one ``<Machine>Transient`` error that the state machine retries with backoff. A configured bucket
or table that does not exist (``ResourceAccessError``) is not transient: it fails the task under
its own name at once (docs/protocol.md §18 S1), and no retry hides it.

Example:
    >>> handler = task_handler("walk", "plan", {"plan": "plan"}, build=lambda metrics: walker,   # doctest: +SKIP
    ...                        passthrough=(WalkError,), transient=WalkTransient)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lightmetrics.lambda_shell.per_container import LambdaHandler, PerContainer
from lightmetrics.work.units import TRANSIENT


def task_handler(machine: str, step: str, steps: Mapping[str, str], *, build: Callable[[Any], Any],
                 passthrough: tuple[type[BaseException], ...], transient: type[Exception]
                 ) -> LambdaHandler:
    """``steps`` maps step names to worker methods; ``build(metrics)`` makes the worker (lazily)."""
    from aws_lambda_powertools import Logger

    from lightmetrics.aws.metrics import SwitchableMetrics

    if step not in steps:
        raise ValueError(f"unknown {machine} step {step!r}; one of {sorted(steps)}")
    logger = Logger(service=f"lightmetrics-{machine}-{step}")
    metrics = SwitchableMetrics(namespace="Lightmetrics", service=f"{machine}-{step}")
    worker = PerContainer(lambda: build(metrics))

    @metrics.log_metrics
    @logger.inject_lambda_context
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        w = worker()
        try:
            result: dict[str, Any] = getattr(w, steps[step])(event)
            return result
        except passthrough:
            raise
        except TRANSIENT as exc:
            raise transient(f"{type(exc).__name__}: {exc}") from exc

    return LambdaHandler(handler, worker)
