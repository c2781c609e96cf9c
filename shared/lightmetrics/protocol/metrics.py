"""The metrics port: where a service counts what happened (accepts, blockers opened, invariant
violations). The Lambda shell hands in Powertools' ``Metrics`` (:mod:`lightmetrics.aws.metrics`);
everything else runs with :class:`NoMetrics`.

Example:
    >>> NoMetrics().add_metric(name="BlockersOpened", unit="Count", value=1)
"""

from __future__ import annotations

from typing import Any, Protocol


class MetricsSink(Protocol):
    """Anything with Powertools' ``add_metric`` (Powertools ``Metrics`` itself satisfies it)."""

    def add_metric(self, name: str, unit: Any, value: float) -> None: ...


class NoMetrics:
    def add_metric(self, name: str, unit: Any, value: float) -> None:
        return None


__all__ = ["MetricsSink", "NoMetrics"]
