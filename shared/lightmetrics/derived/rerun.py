"""A blocked unit of derived work run again (docs/protocol.md §11 O4): what a job does by itself for
the open blockers it meets (``recheck``, the reconciler's), and what an operator's ``retry`` runs
(:mod:`lightmetrics.admin.blocker_actions`). A success resolves the blocker.

Example:
    >>> results = recheck(ctx, ctx.blockers.list(status="open"), source="reconcile", seen_before_ns=now)  # doctest: +SKIP
"""

from __future__ import annotations

from lightmetrics.derived.indexing import RUNNERS
from lightmetrics.work.blockers import OPEN, Blocker
from lightmetrics.work.outcome import WorkResult
from lightmetrics.work.units import WorkContext, run_unit

#: open blockers one run checks again by itself (§11 O4), at most; the least recently seen first,
#: and a failed re-check sees it again, so refusals that persist never starve the others
RECHECK_PER_RUN = 100


def rerun(ctx: WorkContext, blocker: Blocker, *, source: str) -> WorkResult:
    """The blocker's unit, run again as one that failed before (a success resolves it, §11 O4)."""
    runner = RUNNERS[blocker.kind]
    return run_unit(ctx, kind=blocker.kind, object_key=blocker.object_key, source=source,
                    fn=lambda: runner(ctx, blocker.object_key), previously_failed=True)


def recheck(ctx: WorkContext, blockers: list[Blocker], *, source: str, seen_before_ns: int) -> list[WorkResult]:
    """§11 O4: run again the unit of each open blocker of ``blockers`` that a runner can run (a DLQ
    message's or an unparsable message's is redriven instead) and that was last seen before
    ``seen_before_ns`` (not one this run just checked), at most :data:`RECHECK_PER_RUN`, least
    recently seen first."""
    due = sorted((b for b in blockers if b.status == OPEN and b.kind in RUNNERS and b.last_seen_ns < seen_before_ns),
                 key=lambda b: b.last_seen_ns)
    return [rerun(ctx, b, source=source) for b in due[:RECHECK_PER_RUN]]


__all__ = ["RECHECK_PER_RUN", "recheck", "rerun"]
