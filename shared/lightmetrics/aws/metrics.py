"""Powertools metrics that really switch off when ``POWERTOOLS_METRICS_DISABLED`` is set.

Powertools' ``Metrics`` skips printing at flush when metrics are disabled, but it keeps the
values and prints them anyway once 100 accumulate — in a long local run (the demo, the
embedded runtime) that interleaves EMF lines with ``--json`` output and grows memory.
:class:`SwitchableMetrics` checks the switch at every call and otherwise *is* Powertools
``Metrics`` (same ``add_metric`` and ``log_metrics``), so Lambda behaviour is unchanged.

Example:
    >>> metrics = SwitchableMetrics(namespace="Lightmetrics", service="ingest")
    >>> metrics.add_metric(name="Accepted", unit="Count", value=1)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics.functions import is_metrics_disabled


class SwitchableMetrics:
    def __init__(self, *, namespace: str, service: str) -> None:
        self._metrics = Metrics(namespace=namespace, service=service)

    def add_metric(self, name: str, unit: Any, value: float, **kwargs: Any) -> None:
        if not is_metrics_disabled():
            self._metrics.add_metric(name=name, unit=unit, value=value, **kwargs)

    def log_metrics(self, handler: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
        if handler is None:
            return functools.partial(self.log_metrics, **kwargs)
        decorated = self._metrics.log_metrics(handler, **kwargs)

        @functools.wraps(handler)
        def wrapper(event: Any, context: Any) -> Any:
            if is_metrics_disabled():
                return handler(event, context)
            return decorated(event, context)

        return wrapper
