"""The findings an inventory audit counts for its watermarks (docs/protocol.md §13 W6): confirmed
``missing-derived`` findings per index, counted in Spark. What they prove is decided in the layer's
core, :mod:`lightmetrics.operator_tools.audit_watermarks` (``plan_watermarks``, ``apply_watermarks``).

The counts come from one small Spark aggregation: at most four rows reach the driver.
"""

from __future__ import annotations

from typing import Any


def missing_by_index(findings: Any) -> dict[str, int]:
    """Confirmed ``missing-derived`` findings per derived index (a finding line's ``missing`` lists
    the indexes its record lacks), from the findings DataFrame; at most four rows are collected."""
    from pyspark.sql import functions as F

    from lightmetrics.operator_tools import invariants as inv

    rows = findings.where(F.col("rule") == inv.MISSING_DERIVED.name) \
        .select(F.explode(F.split(F.get_json_object("doc", "$.missing"), ",")).alias("index")) \
        .groupBy("index").count().collect()
    return {r["index"]: int(r["count"]) for r in rows}


__all__ = ["missing_by_index"]
