"""The operator's report of a reap, from its checkpoint summary (``lmctl reap``, the End task).

Example::

    >>> report_of(ReapCheckpoint.of({"mode": "gc", "c_purged": 2, "kept#referenced": 1})).to_json()["kept"]
    {'referenced': 1}
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from lightmetrics.reaps.state import ReapCheckpoint, ReapPhase

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


def retention_outcome(cp: ReapCheckpoint, pk: str) -> dict[str, Any] | None:
    """The ``retention-last#<scope>`` item (as stored) for a retention checkpoint ``cp`` as it ends
    (its final status, error, finished_at_ns changed in); None for GC or a dry run (which deletes nothing)."""
    if cp.mode != "retention" or cp.dry_run:
        return None
    kept = {"epoch": cp.epoch, "status": cp.status, "hours": list(cp.hours), "hour_status": dict(cp.hour_status),
            "error": cp.error, "finished_at_ns": cp.finished_at_ns}
    return {"pk": pk, "sk": retention_last_sk(cp.scope), "scope": cp.scope,
            **{k: v for k, v in kept.items() if v is not None}}


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


@dataclass(frozen=True)
class ReapReport:
    """The operator's report of a reap (``lmctl reap``, the End task's output), from its checkpoint
    summary: :func:`report_of`. :meth:`to_json` is the form printed and returned.

    >>> report_of(ReapCheckpoint.of({"mode": "gc", "c_purged": 2, "kept#referenced": 1})).kept
    {'referenced': 1}
    """

    mode: str
    dry_run: bool
    epoch: int
    status: str
    phase: ReapPhase
    examined: int
    deletable: int
    marked: int
    purged: int
    restored: int
    would_settle: int  # a dry run's count of the blobs a failed reap marked (rule DR1)
    kept: dict[str, int]
    pages: int
    hours: list[str]
    hours_reaped: list[str]
    hours_skipped: dict[str, str]
    started_at_ns: int | None
    finished_at_ns: int | None
    execution: str | None
    error: str | None
    blocked: list[str]
    more: bool  # GC: the run stopped at its page budget (max_pages); the next run continues from the cursor
    executions: int
    source: str | None  # GC's candidate source (None for retention)
    through: str | None
    audit_run: str | None
    note: str | None

    def to_json(self) -> dict[str, Any]:
        """The report as printed (``lmctl reap --json``) and returned by the End task."""
        return {f.name: (self.phase.value if f.name == "phase" else getattr(self, f.name)) for f in fields(self)}


def report_of(cp: ReapCheckpoint) -> ReapReport:
    """The operator's report from a checkpoint summary."""
    return ReapReport(
        mode=cp.mode, dry_run=cp.dry_run, epoch=cp.epoch, status=cp.status, phase=cp.phase,
        **{c: cp.counters.get(f"c_{c}", 0) for c in COUNTERS},
        kept={k.removeprefix("kept#"): v for k, v in cp.counters.items() if k.startswith("kept#")},
        pages=cp.page, hours=list(cp.hours),
        hours_reaped=[h for h, s in cp.hour_status.items() if s == "reaped"],
        hours_skipped={h: s for h, s in cp.hour_status.items() if s != "reaped"},
        started_at_ns=cp.started_at_ns, finished_at_ns=cp.finished_at_ns, execution=cp.execution, error=cp.error,
        blocked=list(cp.blocked), more=cp.budget_exhausted, executions=cp.executions,
        source=cp.source if cp.mode == "gc" else None, through=cp.through, audit_run=cp.audit_run, note=cp.note)


__all__ = ["COUNTERS", "ReapReport", "hour_unfinished", "proof_counts", "report_of", "retention_last_sk", "retention_outcome",
           "settle_counts"]
