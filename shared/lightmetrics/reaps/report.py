"""The operator's report of a reap, from its checkpoint summary (``lmctl reap``, the End task).

Example::

    >>> report_of({"mode": "gc", "c_purged": 2, "kept#referenced": 1})["kept"]
    {'referenced': 1}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lightmetrics.protocol.control_store import plain

#: ``would_settle``: a dry run's count of the blobs marked by a failed reap (rule DR1), which it leaves.
COUNTERS = ("examined", "deletable", "marked", "purged", "restored", "would_settle")


def hour_unfinished(status: str) -> bool:
    """Whether a retention hour's status (the report's ``hour_status``) leaves it to a later run:
    skipped (the watermark does not cover it, entries kept appearing) or blocked (an entry's open
    blocker). Such an hour is stuck for ``lmctl status`` and ``RetentionHoursUnfinished`` (R9).

    >>> hour_unfinished("blocked: 1 entries have an open reap-retention blocker"), hour_unfinished("reaped")
    (True, False)
    """
    return status.startswith(("skipped", "blocked"))


def retention_last_sk(scope: str) -> str:
    """``retention-last#<scope>`` (under ``checkpoint#reap``): the outcome of the last retention run
    of a scope, which GC's runs, replacing ``current``, leave alone (read by ``lmctl status``, R9)."""
    return f"retention-last#{scope}"


def retention_outcome(cp: dict[str, Any], pk: str, **set_: Any) -> dict[str, Any] | None:
    """The ``retention-last#<scope>`` item for a retention checkpoint ``cp`` as it ends (``set_``:
    its final status, error, finished_at_ns); None for GC or a dry run (which deletes nothing)."""
    cp = {**plain(cp), **set_}
    if cp.get("mode") != "retention" or cp.get("dry_run"):
        return None
    scope = cp.get("scope") or "raw"
    kept = ("epoch", "status", "hours", "hour_status", "error", "finished_at_ns")
    return {"pk": pk, "sk": retention_last_sk(scope), "scope": scope,
            **{k: cp[k] for k in kept if cp.get(k) is not None}}


def proof_counts(proofs: Iterable[Any], *, retention: bool) -> tuple[list[Any], dict[str, int]]:
    """A page's proofs (:class:`~lightmetrics.reaps.gc_proof.Proof`): the deletable ones (retention: only those
    proven "hour tombstoned") and the page's counters ``c_examined``, ``c_deletable``, ``kept#<reason>``.

    >>> from lightmetrics.reaps.gc_proof import Proof
    >>> proof_counts([Proof("k", "s", True, "unreferenced")], retention=True)[1]
    {'c_examined': 1, 'kept#hour-not-tombstoned': 1, 'c_deletable': 0}
    """
    from lightmetrics.reaps.gc_proof import DELETE_HOUR_TOMBSTONED, KEEP_NOT_TOMBSTONED

    proofs = list(proofs)
    counts: dict[str, int] = {"c_examined": len(proofs)}
    deletable = []
    for p in proofs:
        if p.deletable and (not retention or p.reason == DELETE_HOUR_TOMBSTONED):
            deletable.append(p)
        else:
            reason = p.reason if not p.deletable else KEEP_NOT_TOMBSTONED
            counts[f"kept#{reason}"] = counts.get(f"kept#{reason}", 0) + 1
    counts["c_deletable"] = len(deletable)
    return deletable, counts


def settle_counts(results: list[str]) -> dict[str, int]:
    """The counters of settled marks (:meth:`~lightmetrics.reaps.gc.BlobCollector.settle`'s results).

    >>> settle_counts(["purged", "restored", "kept:gone"])
    {'c_purged': 1, 'c_restored': 1, 'kept#gone': 1}
    """
    add = {"c_purged": results.count("purged"), "c_restored": results.count("restored")}
    for r in results:
        if r.startswith("kept:"):
            add[f"kept#{r[5:]}"] = add.get(f"kept#{r[5:]}", 0) + 1
    return add


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


__all__ = ["COUNTERS", "hour_unfinished", "proof_counts", "report_of", "retention_last_sk", "retention_outcome",
           "settle_counts"]
