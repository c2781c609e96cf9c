"""The completeness watermarks an inventory audit proves (docs/protocol.md §13 W6): the rule, apart
from the Spark job that counts the findings (``lightmetrics_pipeline.audit.watermarks``).

An audit checks every acceptance record and quarantine manifest of its inventory for each derived
index — a candidate for every one the inventory shows without an entry, each confirmed live — so
when it finishes, every record that was in S3 when the inventory's scan began (``creationTimestamp``)
had its entries then, or is one of its confirmed ``missing-derived`` findings. An index without such
a finding is proven complete up to ``creationTimestamp − LM_SETTLE_S`` (a record accepted before
then had landed before the scan began: the walk's W3 argument, with the inventory's scan as the
listing), and its watermark moves there — after the run's summary is committed, never before. An
index with a finding keeps its W (``withheld``, with the count): a proof with a hole in it is none.
So does every index when a candidate record could not be read (a newer writer's, §17 E3, or
invalid): which entries it lacks is unknown, and retention must not enumerate its hour by them.

Cost: no request per record; each proven index costs one conditional ``UpdateItem`` — at most
four a run, whatever the history.

Example:
    >>> plan_watermarks({"creation_timestamp_ms": 1_764_000_000_000}, 900, {"accepted-by-blob": 1})["withheld"]
    {'accepted-by-blob': '1 confirmed missing-derived finding(s)'}
"""

from __future__ import annotations

from typing import Any

from lightmetrics.derived.walk import INDEXES, proven_before, set_watermark


def plan_watermarks(inventory_info: dict[str, Any], settle_s: int, missing: dict[str, int],
                    unreadable: dict[str, int] | None = None) -> dict[str, Any]:
    """``{"inventory_created_ns", "proved": {index: W}, "withheld": {index: why}}`` for a finished audit
    of the report ``inventory_info`` (:meth:`InventoryReport.to_json`) with ``missing`` findings per
    index and ``unreadable`` candidate records per rule (``unsupported-version``, ``invalid-manifest``)."""
    created_ms = inventory_info.get("creation_timestamp_ms")
    if created_ms is None:
        return {"inventory_created_ns": None, "proved": {},
                "withheld": {i: "the inventory report has no creationTimestamp" for i in INDEXES}}
    unread = [f"{n} record(s) this audit cannot read ({rule})" for rule, n in sorted((unreadable or {}).items()) if n]
    why = {i: "; ".join(([f"{missing[i]} confirmed missing-derived finding(s)"] if missing.get(i) else []) + unread)
           for i in INDEXES}
    w_ns = proven_before(int(created_ms) * 1_000_000, settle_s)
    return {"inventory_created_ns": int(created_ms) * 1_000_000,
            "proved": {i: w_ns for i in INDEXES if not why[i]},
            "withheld": {i: reason for i, reason in why.items() if reason}}


def apply_watermarks(table: Any, plan: dict[str, Any], *, now_ns: int, run_id: str) -> list[str]:
    """Raise the proven indexes' watermarks (monotonic: an older inventory never lowers one);
    the indexes that moved. Called only once the run's summary is committed: a crash before
    leaves every W where it was, and the next audit moves them."""
    return [index for index, w_ns in sorted(plan.get("proved", {}).items())
            if set_watermark(table, index, int(w_ns), epoch=0, now_ns=now_ns, set_by=f"audit run {run_id}")]


__all__ = ["apply_watermarks", "plan_watermarks"]
