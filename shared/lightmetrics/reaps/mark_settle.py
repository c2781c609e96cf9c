"""The mark-and-settle pipeline: how a page of candidate blobs becomes deleted, the one way for GC's
pages and for retention's key ranges (docs/protocol.md §15, the delete-marker handshake; §13 L3).

A page goes **intent → markers → record → settle**:

1. prove the page's candidates (:meth:`~lightmetrics.reaps.gc.BlobCollector.prove_all`); nothing
   deletable (or a dry run): the page is recorded as it is, no item written;
2. record the **intent** (the page's ``marks#`` items, state ``intent``) durably, *before* the
   first delete marker: a crash in between is recoverable (:meth:`MarkSettle.recover`, once the
   writer cannot be running any more, :func:`writer_may_run_until`);
3. place the delete markers (:meth:`~lightmetrics.reaps.gc.BlobCollector.mark`);
4. **record** the marks (the items rewritten, state ``marked``) and the page's cursor and counters;
5. after the grace, **settle**: purge or restore each mark, and delete its items in the write that
   counts them.

Where a page's state lives is the :class:`PageHome`'s: GC's summary checkpoint
(:class:`~lightmetrics.reaps.gc_tasks.SummaryPages`) or a key range's item
(:class:`~lightmetrics.reaps.retention_ranges.RangePages`). The pipeline writes only through it, and
passes each home's crash points.

Example::

    >>> writer_may_run_until(10, "a", "a", owned_since_ns=0, longest_ns=5)
    15
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from lightmetrics.protocol.control_store import Op
from lightmetrics.protocol.manifests import AcceptedBatchManifest
from lightmetrics.reaps.gc import BlobCollector
from lightmetrics.reaps.gc_marks import Mark, MarksItem, MarksKey, page_ops
from lightmetrics.reaps.report import proof_counts, settle_counts
from lightmetrics.reaps.state import MarkState, PageOutcome
from lightmetrics.work import crashpoints
from lightmetrics.work.units import WorkContext


@dataclass(frozen=True)
class CandidatePage:
    """One page of a candidate source: the blob keys to prove, the source's cursor after them,
    whether more follow, counters the source already has (``kept#blocked``), GC's ``through`` (the
    first hour not yet proven), and the acceptance records the source read (retention: rule G-R1,
    each record read once)."""

    keys: list[str]
    cursor: str
    more: bool
    counts: dict[str, int] = field(default_factory=dict)
    through: str | None = None
    records_read: dict[str, AcceptedBatchManifest] = field(default_factory=dict)


@dataclass(frozen=True)
class Points:
    """A home's crash points: intent recorded, page recorded, settle recorded."""

    intent: str
    page: str
    settled: str


class PageHome(Protocol):
    """Where a page's state lives (its cursor, pending pages, counters), and the writes that move it."""

    points: Points

    def page_prefix(self) -> str:
        """The sort-key prefix of the next page's ``marks#`` items."""

    def item_fields(self, state: MarkState, outcome: PageOutcome, at_ns: int) -> MarksItem:
        """The page's ``marks#`` items as they all are, besides their sort keys and marks."""

    def write_intent(self, prefix: str, ops: list[Op], outcome: PageOutcome, now_ns: int) -> None:
        """Write the intent items ``ops`` (and whatever the home records with them), in one write."""

    def record(self, outcome: PageOutcome, marks: list[Mark], prefix: str, ops: list[Op]) -> None:
        """Record a page: its marks items ``ops`` (none if nothing was marked), cursor and counters."""

    def settled(self, prefix: str, counts: dict[str, int], ops: list[Op]) -> None:
        """Record the settled page ``prefix``'s counters and delete its items (``ops``), in one write."""


def writer_may_run_until(created_at_ns: int, writer: str, owner: str, *, owned_since_ns: int, longest_ns: int) -> int:
    """Rule L3: until when an invocation that recorded an intent at ``created_at_ns`` may still be
    placing its delete markers. Any invocation — a Step Functions retry of the same task may run
    beside the one it replaces — started before it wrote the intent and runs at most the longest
    reap task (``longest_ns``); an intent of another owner (``writer`` is not this run's ``owner``)
    is also bounded by the time this run took the lease. Recovering waits until then, so every
    marker that will ever land has landed and is found."""
    until = int(created_at_ns) + longest_ns
    if writer != owner:
        until = max(until, int(owned_since_ns) + longest_ns)
    return until


class MarkSettle:
    """The pipeline over one :class:`PageHome` and one task's collector. ``epoch`` names the
    pages' items; ``retention``: only blobs proven "hour tombstoned" are deletable."""

    def __init__(self, collector: BlobCollector, home: PageHome, *, epoch: int, retention: bool) -> None:
        self.collector, self.home, self.epoch, self.retention = collector, home, int(epoch), retention

    @classmethod
    def open(cls, ctx: WorkContext, settings: Any, home: PageHome, *, epoch: int, retention: bool, concurrency: int,
             fence: Callable[[], None]) -> MarkSettle:
        """The pipeline of one task, with its own collector (``fence``: before every delete, §13 L2);
        :meth:`close` it."""
        return cls(BlobCollector(ctx, settings, concurrency=concurrency, fence=fence), home, epoch=epoch,
                   retention=retention)

    def close(self) -> None:
        self.collector.close()

    def due(self, marked_at_ns: int, now_ns: int) -> bool:
        """Whether marks recorded at ``marked_at_ns`` are past the grace at ``now_ns``."""
        return self.collector.due(marked_at_ns, now_ns)

    def mark(self, page: CandidatePage, now_ns: int, *, dry_run: bool) -> None:
        """Steps 1-4 for one page of candidates."""
        self.collector.records_read = dict(page.records_read)  # rule G-R1: each record read once
        deletable, proven = proof_counts(self.collector.prove_all(page.keys, now_ns=now_ns), retention=self.retention)
        counts = {**page.counts, **{k: page.counts.get(k, 0) + v for k, v in proven.items()}}
        outcome = PageOutcome(page.cursor, page.more, counts, page.through)
        intents = [self.collector.intent(p, now_ns) for p in deletable]
        prefix = self.home.page_prefix()
        if dry_run or not intents:
            self._recorded(outcome, [], prefix, [])
            return
        ops = self._items(prefix, intents, self.home.item_fields(MarkState.INTENT, outcome, now_ns), [])
        # The intent is durable before the first marker: a crash in between is recoverable.
        self.home.write_intent(prefix, ops, outcome, now_ns)
        crashpoints.point(self.home.points.intent)
        self._recorded(outcome, self.collector.mark(intents), prefix, [(op.pk, op.sk) for op in ops])

    def recover(self, intents: list[Mark], outcome: PageOutcome, prefix: str, replaces: list[MarksKey]) -> None:
        """A crash after the intent: find the markers that were placed, place the others, record the
        page (its writer cannot be running any more: :func:`writer_may_run_until`)."""
        self._recorded(outcome, self.collector.recover(intents), prefix, replaces)

    def settle(self, prefix: str, marks: list[Mark], keys: list[MarksKey], now_ns: int) -> None:
        """Step 5 for the recorded page ``prefix`` whose marks are all due: purge or restore them; the
        home counts them and deletes the page's items ``keys`` in one write."""
        counts = settle_counts(self.collector.settle(marks, now_ns=now_ns))
        self.home.settled(prefix, counts, [Op("Delete", *key) for key in keys])
        crashpoints.point(self.home.points.settled)

    def _recorded(self, outcome: PageOutcome, marks: list[Mark], prefix: str, replaces: list[MarksKey]) -> None:
        if marks:
            at = max(m.marked_at_ns for m in marks)  # the marks' own time (Mark.of gives it back)
            ops = self._items(prefix, marks, self.home.item_fields(MarkState.MARKED, outcome, at), replaces)
        else:  # nothing marked (a dry run, or every captured version was gone): no items left
            ops = [Op("Delete", *key) for key in replaces]
        self.home.record(outcome, marks, prefix, ops)
        crashpoints.point(self.home.points.page)

    def _items(self, prefix: str, marks: list[Mark], fields: MarksItem, replaces: list[MarksKey]) -> list[Op]:
        return page_ops(self.epoch, 0, marks, fields, replaces, prefix=prefix)


__all__ = ["CandidatePage", "Mark", "MarkSettle", "PageHome", "Points", "writer_may_run_until"]
