"""An expired hour reaped in key ranges, in parallel (docs/protocol.md §16, "An hour in R ranges").

When the hour's range plan (:mod:`lightmetrics.derived.hour_ranges`) has R > 1 ranges, retention's steps 2-4
(the blobs through GC's handshake, then the derived entries page by page, rule R-I8) run on each
range apart, as iterations of the state machine's ``Ranges`` Map: one Lambda per range at a time,
at most ``range_parallelism`` at once. The hour's own task (``Reaper.retention`` in phase
``ranges``) plans each visit of the Map from the range items (:func:`plan_visit`); each iteration
runs one :class:`RangeTask`:

* in the GC role (function ``reap-gc``; range phase ``blobs``): settle the range's pages of marks
  whose grace is over, mark its next pages (intent recorded before the markers) while fewer than
  ``max_pending_pages`` wait, and recover an intent a crash left once its writer cannot be running
  (§13 L3) — at most :data:`~lightmetrics.reaps.params.RANGE_TASK_UNITS` such units a task;
* in the retention role (``reap-retention``; phase ``derived``): the range's pages of
  ``accepted-by-blob`` then ``accepted-by-time`` entries, each page on one listing (R-I8).

State (docs/control-table.md): one item per range and pass, ``checkpoint#reap#range`` /
``<epoch>#<hour>#<pass>#<range>`` — its bounds, cursor, phase, the pages of marks it has recorded
(``marks#<epoch>#r<range>.<pass>#<page>#<part>``, under its marks shard) and its counters. Only the range's own task
writes them. Every write follows a fence (a conditional renewal of the reap lease, §13 L2) and is
conditional on the item's owner and version, so a task that lost the lease changes nothing, and a
twin of a task (a Step Functions retry beside the invocation it replaced) stops at its first write
once the other moved the range on. Range tasks never put the lease or the summary in a transaction:
DynamoDB cancels concurrent transactions that share an item.

Example::

    >>> RangeTask(reaper, {"reap": reap, "job": job, "range": {"r": 2, "task": "gc"}}).gc()  # doctest: +SKIP
    {'r': 2, 'phase': 'blobs', 'wait_until_ns': 0}
"""

from __future__ import annotations

from typing import Any

from lightmetrics.protocol.control_store import ConditionFailed, ControlStore, Op, plain
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.own_writes import WrittenByOther, put_own
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.gc_marks import Mark, MarksItem, decode_marks_item, pending_keys, range_page_prefix
from lightmetrics.reaps.mark_settle import CandidatePage, MarkSettle, Points
from lightmetrics.reaps.params import RANGE_TASK_SECONDS, RANGE_TASK_UNITS
from lightmetrics.reaps.reap_job import ReapJob
from lightmetrics.reaps.retention import HourRetention
from lightmetrics.reaps.state import MarkState, PageOutcome, PendingPage, RangeIntent, RangeItem, RangePhase
from lightmetrics.work import crashpoints
from lightmetrics.work.leases import LeaseLost

_NS = 1_000_000_000
RANGE_PK = "checkpoint#reap#range"
#: A crashed epoch's range items are left to DynamoDB's TTL (``expires_at``; nothing relies on it).
RANGE_ITEM_TTL_S = 30 * 86400
#: Range items deleted per transaction when an hour's ranges are folded into the summary (the
#: transaction's other two items: the summary and the lease; DynamoDB allows 100).
FOLD_DELETES_PER_TRANSACTION = 98

CP_RANGE_INTENT = crashpoints.register("reap-range.intent-recorded", "a range page's intent recorded, no marker placed yet")
CP_RANGE_PAGE = crashpoints.register("reap-range.page-recorded", "a range page's marks and the range's cursor recorded")
CP_RANGE_SETTLED = crashpoints.register("reap-range.settle-recorded", "a range page's marks settled and their items deleted")
CP_RANGE_BLOBS_DONE = crashpoints.register("reap-range.blobs-done", "a range's blobs settled; its derived phase recorded")
CP_RANGE_DERIVED = crashpoints.register("reap-range.derived-recorded",
                                        "a range's page of derived entries deleted and its cursor recorded")
CP_RANGES_FOLDED = crashpoints.register("reap-range.folded",
                                        "every range done: counters in the summary, phase verify, items not all deleted")


class RangeStale(Exception):
    """A twin of this task (the same owner) moved the range on: this one stops, changing nothing."""


def range_prefix(epoch: int, hour: str, passes: int) -> str:
    """The sort-key prefix of one pass's range items.

    >>> range_prefix(3, "2026-08-01T13", 1)
    '000003#2026-08-01T13#01#'
    """
    return f"{int(epoch):06d}#{hour}#{int(passes):02d}#"


def range_sk(epoch: int, hour: str, passes: int, r: int) -> str:
    return f"{range_prefix(epoch, hour, passes)}{int(r):04d}"


def read_ranges(table: ControlStore, epoch: int, hour: str, passes: int) -> dict[int, RangeItem]:
    """This pass's range items by range number: one Query of their sort-key prefix, so the items a
    crashed epoch or pass left (until their TTL) are never read."""
    return {int(i["range"]): RangeItem.of(plain(i))
            for i in table.query(RANGE_PK, sk_prefix=range_prefix(epoch, hour, passes))}


def plan_visit(items: dict[int, RangeItem], ranges: int, now_ns: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The next visit of the Map: the ranges with work now (``{"r", "task"}``: ``gc`` or
    ``retention``, the role their phase needs) and the times the others wait for; a range without
    an item has not begun. Both empty: every range is done.

    >>> item = lambda r, phase, wait=0: RangeItem(1, "o", "h", 1, r, phase=RangePhase(phase), wait_until_ns=wait)
    >>> plan_visit({0: item(0, "done"), 1: item(1, "derived"), 2: item(2, "blobs", 9)}, 4, 5)
    ([{'r': 1, 'task': 'retention'}, {'r': 3, 'task': 'gc'}], [9])
    """
    ready, waits = [], []
    for r in range(ranges):
        item = items.get(r)
        if item is not None and item.phase is RangePhase.DONE:
            continue
        if item is not None and item.wait_until_ns > now_ns:
            waits.append(item.wait_until_ns)
        else:
            ready.append({"r": r, "task": item.phase.role if item is not None else "gc"})
    return ready, waits


def folded(items: dict[int, RangeItem]) -> dict[str, int]:
    """The ranges' counters summed, and their pages as ``page``: what the summary adds."""
    out: dict[str, int] = {}
    for item in items.values():
        for k, v in {**item.counts, "page": item.page}.items():
            out[k] = out.get(k, 0) + int(v)
    return out


def blob_page(hr: HourRetention, after: str, limit: int, *, end_at: str | None = None) -> CandidatePage:
    """The blobs of one page of the hour's ``accepted-by-time`` entries after ``after`` (up to
    ``end_at``: a key range's bound): the candidates retention proves "hour tombstoned", with the
    records read to find them (rule G-R1: each read once). An unreadable record blocks its entry,
    not the page."""
    keys, more = hr.page(after, limit) if end_at is None else hr.page(after, limit, end_at=end_at)
    page = hr.records(keys)
    counts = {"kept#blocked": len(page.blocked)} if page.blocked else {}
    return CandidatePage(page.blob_keys, keys[-1] if keys else after, more, counts,
                         records_read={hr.codec.accepted(m.identity): m for m in page.records.values()})


class RangePages:
    """A key range's pages in its range item (:class:`~lightmetrics.reaps.state.RangeItem`): the
    intent in the item, recorded pages pending their grace, the cursor and counters; every write
    is the range task's :meth:`RangeTask.save`."""

    points = Points(CP_RANGE_INTENT, CP_RANGE_PAGE, CP_RANGE_SETTLED)

    def __init__(self, task: RangeTask) -> None:
        self.task = task

    def page_prefix(self) -> str:
        t = self.task
        return range_page_prefix(t.reap["epoch"], t.r, t.passes, t.item.page)

    def item_fields(self, state: MarkState, outcome: PageOutcome, at_ns: int) -> MarksItem:
        # A range's intent keeps its outcome in the range item (RangeIntent), not in its marks items.
        intent = state is MarkState.INTENT
        return MarksItem(state, epoch=int(self.task.reap["epoch"]), owner=self.task.reap["owner"],
                         created_at_ns=at_ns if intent else None, marked_at_ns=None if intent else at_ns)

    def write_intent(self, prefix: str, ops: list[Op], outcome: PageOutcome, now_ns: int) -> None:
        # The intent is durable (in the range item and its marks items) before the first marker.
        self.task.item.intent = RangeIntent(PendingPage(prefix, len(ops), now_ns), self.task.reap["owner"], outcome)
        self.task.save(ops)

    def record(self, outcome: PageOutcome, marks: list[Mark], prefix: str, ops: list[Op]) -> None:
        """A page done: its marks (replacing its intent items) pending settle, the cursor, the counts."""
        item = self.task.item
        if marks:
            parts = sum(1 for op in ops if op.kind == "Put")
            item.pending = [*item.pending, PendingPage(prefix, parts, max(m.marked_at_ns for m in marks))]
        item.after, item.listing_done, item.page, item.intent = outcome.cursor, not outcome.more, item.page + 1, None
        item.add({**outcome.counts, "c_marked": len(marks)})
        self.task.save(ops)

    def settled(self, prefix: str, counts: dict[str, int], ops: list[Op]) -> None:
        item = self.task.item
        item.add(counts)
        item.pending = [p for p in item.pending if p.prefix != prefix]
        self.task.save(ops)


class RangeTask:
    """One Map iteration: a bounded piece of one range's work (module docstring). ``reaper`` is the
    task's reap (its context, fence and clock; nothing of it is shared with the other ranges' tasks
    of the same process). ``event``: ``reap`` (the execution's), ``job`` (the hour, pass, range
    count and page parameters the hour's task planned with) and ``range`` (``{"r": ..., "task": ...}``)."""

    def __init__(self, reaper: ReapJob, event: dict[str, Any]) -> None:
        self.reaper, self.reap, self.job = reaper, event["reap"], event["job"]
        self.r = int(event["range"]["r"])
        self.ctx, self.settings, self.codec = reaper.ctx, reaper.settings, reaper.codec
        self.table: ControlStore = reaper.table
        self.passes = int(self.job["passes"])
        self.started_ns = reaper.now()
        self.fence = reaper.fence(self.reap)
        self.hr = HourRetention(self.ctx, UtcHour.parse(self.job["hour"]), fence=self.fence,
                                concurrency=int(self.job["concurrency"]))
        self.sk = range_sk(self.reap["epoch"], self.job["hour"], self.passes, self.r)
        self.item = self._load()

    # -- the range item ------------------------------------------------------------------------------
    def _load(self) -> RangeItem:
        found = self.table.get(RANGE_PK, self.sk)
        if found is not None:
            return RangeItem.of(plain(found))
        plan = self.hr.plan()  # the first task of this range and pass: its bounds
        if plan.ranges != int(self.job["ranges"]) or not 0 <= self.r < plan.ranges:
            raise InvalidReapInput(f"range {self.r} of {self.job['ranges']}: the plan of {self.job['hour']} "
                                   f"has {plan.ranges} ranges")
        start_after, end_at = plan.key_bounds(self.hr.by_time_prefix, self.r)
        return RangeItem(epoch=int(self.reap["epoch"]), owner=self.reap["owner"], hour=self.job["hour"],
                         passes=self.passes, r=self.r, start_after=start_after or "", end_at=end_at or "",
                         after=start_after or "")

    def save(self, ops: list[Op] | None = None) -> None:
        """Write the range item (with ``ops``: in one transaction): after a fence, conditional on the
        owner and version this task read. Another owner's item is taken over by the lease's holder
        (a ``resume``); a twin that moved the range on makes this task stop (:class:`RangeStale`)."""
        self.fence.renew()  # rule L2: right before the write; LeaseLost if the reap lost its lease
        read, now = self.item, self.reaper.now()
        item = {**read.stored(), "pk": RANGE_PK, "sk": self.sk, "owner": self.reap["owner"], "version": read.version + 1,
                "updated_at_ns": now, "expires_at": now // _NS + RANGE_ITEM_TTL_S}
        if read.version == 0:
            cond, names, values = "attribute_not_exists(pk)", {}, {}
        else:
            cond = "#v = :v AND #own = :own"
            names, values = {"#v": "version", "#own": "owner"}, {":v": read.version, ":own": read.owner}
        try:
            if ops:
                self.table.transact([Op("Put", RANGE_PK, self.sk, names=names, values=values, condition=cond,
                                        item=item), *ops])
            else:
                item = put_own(self.table, item, condition=cond, names=names or None,
                               values_for_condition=values or None)
        except ConditionFailed as lost:  # put_own read it back already; a transaction did not
            current = lost.current if isinstance(lost, WrittenByOther) else self.table.get(RANGE_PK, self.sk)
            if current is not None and current.get("owner") != self.reap["owner"]:
                raise LeaseLost(f"range {self.r} of {self.job['hour']} is another owner's") from None
            raise RangeStale(f"range {self.r} of {self.job['hour']} moved on (a twin of this task)") from None
        self.item = RangeItem.of(item)

    def _result(self) -> dict[str, Any]:
        return {"r": self.r, "phase": self.item.phase.value, "wait_until_ns": self.item.wait_until_ns}

    def _budget_left(self, units: int) -> bool:
        return units < RANGE_TASK_UNITS and self.reaper.now() - self.started_ns < RANGE_TASK_SECONDS * _NS

    def _wait_until(self, until_ns: int) -> bool:
        if self.item.wait_until_ns != until_ns:
            self.item.wait_until_ns = until_ns
            self.save()
        return False

    # -- the GC role: marks and settles ------------------------------------------------------------
    def gc(self) -> dict[str, Any]:
        """Up to RANGE_TASK_UNITS units of the range's blobs phase; ``phase``/``wait_until_ns`` say
        what the range needs next."""
        if self.item.phase is not RangePhase.BLOBS:
            return self._result()  # a retried task whose range moved on
        pipeline = MarkSettle.open(self.ctx, self.settings, RangePages(self), epoch=self.reap["epoch"], retention=True,
                                   concurrency=int(self.job["concurrency"]), fence=self.fence)
        try:
            units = 0
            while self.item.phase is RangePhase.BLOBS and self._budget_left(units) and self._blobs_unit(pipeline):
                units += 1
        except RangeStale:
            return {**self._result(), "stale": True}
        finally:
            pipeline.close()
        return self._result()

    def _blobs_unit(self, pipeline: MarkSettle) -> bool:
        """One unit of the blobs phase; False when the range has nothing to do now."""
        now, item = self.reaper.now(), self.item
        if item.intent is not None:
            # A crash after the intent: find or place its markers once its writer cannot be placing them (L3).
            intent = item.intent
            until = self.reaper.intent_writer_until(intent.page.marked_at_ns, intent.owner, self.reap,
                                                    owned_since_ns=int(self.job.get("owned_since_ns", 0)))
            if until > now:
                return self._wait_until(until)
            stored = self._read_marks(intent.page)
            pipeline.recover([m for i in stored for m in i.marks], intent.outcome, intent.page.prefix,
                             pending_keys(intent.page))
            return True
        due = [p for p in item.pending if pipeline.due(p.marked_at_ns, now)]
        if due:
            pipeline.settle(due[0].prefix, [m for i in self._read_marks(due[0]) for m in i.marks], pending_keys(due[0]), now)
            return True
        if not item.listing_done and len(item.pending) < int(self.job["max_pending_pages"]):
            page = blob_page(self.hr, item.after, int(self.job["page_size"]), end_at=item.end_at or None)
            pipeline.mark(page, now, dry_run=False)
            return True
        if item.listing_done and not item.pending:
            item.phase, item.after, item.wait_until_ns = RangePhase.DERIVED, item.start_after, 0
            self.save()
            crashpoints.point(CP_RANGE_BLOBS_DONE)
            return False
        return self._wait_until(min(p.marked_at_ns for p in item.pending) + int(self.settings.gc_grace_s) * _NS)

    def _read_marks(self, page: PendingPage) -> list[MarksItem]:
        # By key, the due page's only (a page an old writer recorded: where it put it, §17)
        found = (self.table.get(pk, sk) for pk, sk in pending_keys(page))
        return [decode_marks_item(i, self.codec) for i in found if i is not None]

    # -- the retention role: derived entries -------------------------------------------------------
    def derived(self) -> dict[str, Any]:
        """Up to RANGE_TASK_UNITS pages of the range's derived entries: each page's
        ``accepted-by-blob`` entries, then its ``accepted-by-time`` entries, on one listing (R-I8)."""
        units = 0
        try:
            while self.item.phase is RangePhase.DERIVED and self._budget_left(units):
                item = self.item
                keys, more = self.hr.page(item.after, int(self.job["page_size"]), end_at=item.end_at or None)
                self.hr.delete_page(keys)
                item.after = keys[-1] if keys else item.after
                if not more:
                    item.phase = RangePhase.DONE
                self.save()
                crashpoints.point(CP_RANGE_DERIVED)
                units += 1
        except RangeStale:
            return {**self._result(), "stale": True}
        return self._result()


__all__ = ["CP_RANGES_FOLDED", "CP_RANGE_BLOBS_DONE", "CP_RANGE_DERIVED", "CP_RANGE_INTENT", "CP_RANGE_PAGE",
           "CP_RANGE_SETTLED", "FOLD_DELETES_PER_TRANSACTION", "RANGE_ITEM_TTL_S", "RANGE_PK", "RangePages", "RangeStale",
           "RangeTask", "blob_page", "folded", "plan_visit", "range_prefix", "range_sk", "read_ranges"]
