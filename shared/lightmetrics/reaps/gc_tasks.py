"""The reap's GC task (docs/reaps.md): one page per task through the mark-and-settle pipeline
(:mod:`lightmetrics.reaps.mark_settle`) — mark (prove a page of candidates, record the intent, place
delete markers, record the marks and move the cursor) or settle (after the grace: purge or restore
recorded marks). The pages live in the summary checkpoint (:class:`SummaryPages`); the candidates
come from GC's sources (:mod:`lightmetrics.reaps.gc_sources`) or, for a retention hour's blobs
(phase ``blobs``, proof "hour tombstoned"), from the source the reap is composed with
(``candidates``: :meth:`lightmetrics.reaps.steps.Reaper.candidates`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lightmetrics.protocol.control_store import Op
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.gc_marks import (
    Mark,
    MarksItem,
    decode_marks_item,
    page_items,
    page_of,
    page_prefix,
    pending_keys,
)
from lightmetrics.reaps.gc_sources import GcSources
from lightmetrics.reaps.mark_settle import CandidatePage, MarkSettle, Points
from lightmetrics.reaps.params import CHECKPOINT_PK, DEFAULT_MAX_PAGES, source_cursor_sk
from lightmetrics.reaps.reap_job import CP_INTENT, CP_PAGE_DONE, CP_SETTLE_RECORDED, NS, ReapJob
from lightmetrics.reaps.state import (
    CheckpointChange,
    MarkState,
    PageOutcome,
    PendingPage,
    ReapCheckpoint,
    ReapPhase,
    ReapRun,
)

Job = dict[str, Any]  # a task's event and answer as Step Functions carries them, and an update's values


class SummaryPages:
    """GC's pages in the summary checkpoint: the page number and cursor, the source's durable
    cursor (G-B1), the pages this run recorded and has not settled (``pending``: their prefixes,
    parts and times, so neither a page's record nor its settle reads another page's marks), and
    when they reach ``max_pending_pages`` or the listing ends, the settle phase after the grace.
    ``change`` is what the last write changed (the task routes on it)."""

    points = Points(CP_INTENT, CP_PAGE_DONE, CP_SETTLE_RECORDED)

    def __init__(self, tasks: GcTasks, reap: ReapRun, cp: ReapCheckpoint) -> None:
        self.tasks, self.reap, self.cp = tasks, reap, cp
        self.change = CheckpointChange()

    def page_prefix(self) -> str:
        return page_prefix(self.reap["epoch"], self.cp.page)

    def item_fields(self, state: MarkState, outcome: PageOutcome, at_ns: int) -> MarksItem:
        base = MarksItem(state, epoch=int(self.reap["epoch"]), owner=self.reap["owner"])
        if state is MarkState.MARKED:
            return replace(base, marked_at_ns=at_ns)
        # A GC page's intent carries its outcome: the summary moves on only when the page is recorded.
        return replace(base, outcome=outcome, created_at_ns=at_ns)

    @staticmethod
    def outcome_of(intent_item: MarksItem) -> PageOutcome:
        if intent_item.outcome is None:
            raise InvalidReapInput(f"the intent {intent_item.sk} records no outcome")
        return intent_item.outcome

    def write_intent(self, prefix: str, ops: list[Op], outcome: PageOutcome, now_ns: int) -> None:
        self.tasks.job.commit(self.reap, ops=ops)

    def record(self, outcome: PageOutcome, marks: list[Mark], prefix: str, ops: list[Op]) -> None:
        """The page's marks (replacing its intent items) and the cursor, in one transaction."""
        cp, reap = self.cp, self.reap
        page = cp.page
        # Rule G-B1: a GC run marks at most max_pages pages, then settles and ends.
        exhausted = cp.mode == "gc" and outcome.more and page + 1 >= (cp.max_pages or DEFAULT_MAX_PAGES)
        more = outcome.more and not exhausted
        # Rule G-I10: the pages this run recorded are listed in the summary (no read of any marks);
        # marks a failed reap left are the settle's to find, and bound nothing here (DR2).
        pending = [p for p in cp.pending if p.prefix != prefix]
        if marks:
            parts = sum(1 for op in ops if op.kind == "Put")
            pending.append(PendingPage(prefix, parts, max(m.marked_at_ns for m in marks)))
        change = CheckpointChange(after=outcome.cursor, page=page + 1, through=outcome.through or None,
                                  budget_exhausted=True if exhausted else None, pending=pending)
        ops = ops + self.tasks._source_cursor_ops(cp, outcome.cursor, outcome.through, not outcome.more)
        # A dry run marks nothing, so a failed reap's pending pages never cut its count short (DR2).
        if not more or (not cp.dry_run and len(pending) >= cp.max_pending_pages):
            if cp.dry_run:
                blobs = cp.phase is ReapPhase.BLOBS and cp.mode == "retention"
                change = replace(change, listing_done=not more, phase=ReapPhase.DERIVED if blobs else ReapPhase.DONE)
            else:
                latest = max([p.marked_at_ns for p in pending] + [0])
                change = replace(change, listing_done=not more, phase=ReapPhase.SETTLE,
                                 wait_until_ns=latest + int(self.tasks.settings.gc_grace_s) * NS if latest else 0)
        self.tasks.job.commit(reap, change, add={**outcome.counts, "c_marked": len(marks)}, ops=ops)
        self.change = change

    def settled(self, prefix: str, counts: dict[str, int], ops: list[Op]) -> None:
        pending = [p for p in self.cp.pending if p.prefix != prefix]
        change = CheckpointChange(pending=pending) if len(pending) != len(self.cp.pending) else None
        self.tasks.job.commit(self.reap, change, add=counts, ops=ops)


class GcTasks:
    """The ``gc`` task of :class:`~lightmetrics.reaps.steps.Reaper` (its summary's pages), over its
    :class:`ReapJob`; ``candidates`` gives a page's candidates (GC's source's: :meth:`source_page`)."""

    def __init__(self, job: ReapJob, candidates: Callable[[ReapCheckpoint], CandidatePage] | None = None) -> None:
        self.job, self.ctx, self.settings = job, job.ctx, job.settings
        self.candidates = candidates or self.source_page

    def gc_page(self, event: Job) -> Job:
        reap = event["reap"]
        cp = self.job.summary(reap)
        phase = cp.phase
        if phase.role != "gc":
            return self.job.route(reap, cp)  # a retried task whose step already committed: just route
        home = SummaryPages(self, reap, cp)
        pipeline = MarkSettle.open(self.ctx, self.settings, home, epoch=reap["epoch"], retention=phase is ReapPhase.BLOBS,
                                   concurrency=cp.concurrency, fence=self.job.fence(reap))
        try:
            if phase is ReapPhase.SETTLE:
                return self._settle(reap, cp, pipeline)
            if phase in (ReapPhase.MARK, ReapPhase.BLOBS):
                return self._mark_page(reap, cp, home, pipeline)
            raise InvalidReapInput(f"reap-gc cannot run phase {phase.value!r}")
        finally:
            pipeline.close()

    def source_page(self, cp: ReapCheckpoint) -> CandidatePage:
        """One page of candidate blob keys after the summary's cursor, from GC's source."""
        return GcSources(self.ctx, self.settings).page(
            cp.source, after=cp.after, limit=cp.page_size, hour=cp.hour, audit_run=cp.audit_run)

    def _mark_page(self, reap: ReapRun, cp: ReapCheckpoint, home: SummaryPages, pipeline: MarkSettle) -> Job:
        prefix = home.page_prefix()
        intent = [i for i in page_items(self.job.table, self.job.codec, prefix) if i.intent]
        if intent:
            # A crash after the intent: some markers may be placed; find them, place the others —
            # once the run that recorded the intent cannot be placing them any more (rule L3).
            until = max(self.job.writer_may_run_until(i, reap, cp) for i in intent)
            if until > self.job.now():
                return self.job.wait(reap, cp, until)
            pipeline.recover([m for i in intent for m in i.marks], home.outcome_of(intent[0]), prefix,
                             [i.key for i in intent])
        else:
            page = self.candidates(cp)
            pipeline.mark(page, self.job.now(), dry_run=cp.dry_run)
        return self.job.route(reap, cp.with_changes(home.change))

    def _source_cursor_ops(self, cp: ReapCheckpoint, cursor: str, through: str | None, ended: bool) -> list[Op]:
        """Rule G-B1: the source's durable cursor moves with the page that proved the keys up to it,
        in the page's transaction (marks recorded first, so they are settled whatever happens next).
        ``by-time`` keeps its cursor (new hours come after it) and never moves it back; ``scan`` and
        an audit start their next pass from the beginning once a pass has ended."""
        sk = cp.source_cursor
        if not sk or cp.dry_run or cp.phase is not ReapPhase.MARK:
            return []
        by_time = sk == source_cursor_sk("by-time")
        names = {"#a": "after", "#u": "updated_at_ns", "#ep": "epoch", "#end": "ended"}
        # ``ended``: the pass reached the source's end (G-B3: a scheduled audit GC proves a run once)
        values: Job = {":a": cursor if by_time or not ended else "", ":u": self.job.now(), ":ep": cp.epoch,
                       ":end": bool(ended)}
        expr = "SET #a = :a, #u = :u, #ep = :ep, #end = :end"
        if through:
            names["#t"], values[":t"] = "through", through
            expr += ", #t = :t"
        return [Op("Update", CHECKPOINT_PK, sk, expr, names, values,
                   "attribute_not_exists(#a) OR #a <= :a" if by_time else None)]

    def _settle(self, reap: ReapRun, cp: ReapCheckpoint, pipeline: MarkSettle) -> Job:
        now = self.job.now()
        settled_own = False
        if cp.pending:
            # This run's own pages, oldest first, each read by key: no other page's marks (G-I10).
            page = cp.pending[0]
            if not pipeline.due(page.marked_at_ns, now):
                return self.job.wait(reap, cp, page.marked_at_ns + int(self.settings.gc_grace_s) * NS)
            keys = pending_keys(page)
            found = [decode_marks_item(i, self.job.codec) for i in (self.job.table.get(*key) for key in keys) if i]
            pipeline.settle(page.prefix, [m for i in found for m in i.marks], keys, now)
            if len(cp.pending) > 1:
                return {"reap": reap, "next": "gc"}
            settled_own = True
        if cp.closing or (cp.mode == "gc" and cp.listing_done):
            # The settle that ends the reap (G-I8) also settles every marks item left — a failed
            # reap's, of any epoch or range, or an old writer's (§17 E8): one read of every marks
            # partition (G-I10), one item a task. A retention's ends through the finishing step.
            items = self.job.marks_items()
            if items and settled_own:
                return {"reap": reap, "next": "gc"}
            if items:
                item = items[0]
                until = self.job.writer_may_run_until(item, reap, cp)
                if until > now:  # its markers may still be on their way: settle once they cannot be
                    return self.job.wait(reap, cp, until)
                marks = list(item.marks)
                not_due = [m.marked_at_ns for m in marks if not pipeline.due(m.marked_at_ns, now)]
                if not_due:
                    return self.job.wait(reap, cp, max(not_due) + int(self.settings.gc_grace_s) * NS)
                pipeline.settle(page_of(item.sk), marks, [item.key], now)
                if len(items) > 1:
                    return {"reap": reap, "next": "gc"}
        # Every recorded mark is settled: continue marking, or move on (a closing settle ends the reap).
        done = cp.listing_done
        if cp.closing:
            change = CheckpointChange(phase=ReapPhase.DONE, wait_until_ns=0)
        elif cp.mode == "gc":
            change = CheckpointChange(phase=ReapPhase.DONE if done else ReapPhase.MARK, wait_until_ns=0)
        else:
            change = CheckpointChange(phase=ReapPhase.DERIVED if done else ReapPhase.BLOBS, wait_until_ns=0,
                                      after="" if done else None)
        self.job.commit(reap, change)
        return self.job.route(reap, cp.with_changes(change))


__all__ = ["GcTasks", "SummaryPages"]
