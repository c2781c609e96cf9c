"""The operator's report of a reap, from its checkpoint summary (``lmctl reap``, the End task).

Example::

    >>> report_of({"mode": "gc", "c_purged": 2, "kept#referenced": 1})["kept"]
    {'referenced': 1}
"""

from __future__ import annotations

from typing import Any

from lightmetrics.control_table import plain

COUNTERS = ("examined", "deletable", "marked", "purged", "restored")


def report_of(cp: dict[str, Any]) -> dict[str, Any]:
    """The operator's report from a checkpoint summary."""
    cp = plain(cp)
    kept = {k.removeprefix("kept#"): int(v) for k, v in cp.items() if k.startswith("kept#")}
    return {
        "mode": cp.get("mode"), "dry_run": cp.get("dry_run"), "epoch": cp.get("epoch"), "status": cp.get("status"),
        "phase": cp.get("phase"), **{c: int(cp.get(f"c_{c}", 0)) for c in COUNTERS}, "kept": kept,
        "pages": int(cp.get("page", 0)), "hours": cp.get("hours", []),
        "hours_reaped": [h for h, s in (cp.get("hour_status") or {}).items() if s == "reaped"],
        "hours_skipped": {h: s for h, s in (cp.get("hour_status") or {}).items() if s != "reaped"},
        "started_at_ns": cp.get("started_at_ns"), "finished_at_ns": cp.get("finished_at_ns"),
        "execution": cp.get("execution"), "error": cp.get("error"), "blocked": list(cp.get("blocked") or []),
        # GC: the run stopped at its page budget (max_pages); the next run continues from the cursor.
        "more": bool(cp.get("budget_exhausted")), "executions": int(cp.get("executions", 1)),
        "source": cp.get("source") if cp.get("mode") == "gc" else None, "through": cp.get("through"),
        "audit_run": cp.get("audit_run"), "note": cp.get("note"),
    }


__all__ = ["COUNTERS", "report_of"]
