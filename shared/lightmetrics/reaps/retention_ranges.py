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
(``marks#<epoch>#r<range>.<pass>#<page>#<part>``) and its counters. Only the range's own task
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

from typing import Any, cast

from lightmetrics.protocol.control_store import ConditionFailed, ControlStore, Op, plain
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.own_writes import WrittenByOther, put_own
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.gc import BlobCollector
from lightmetrics.reaps.gc_marks import decode_marks_item, page_ops, range_page_prefix
from lightmetrics.reaps.params import CHECKPOINT_PK, RANGE_TASK_SECONDS, RANGE_TASK_UNITS
from lightmetrics.reaps.report import proof_counts, settle_counts
from lightmetrics.reaps.retention import HourRetention
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


def read_ranges(table: ControlStore, epoch: int, hour: str, passes: int) -> dict[int, dict[str, Any]]:
    """This pass's range items by range number: one Query of their sort-key prefix, so the items a
    crashed epoch or pass left (until their TTL) are never read."""
    return {int(i["range"]): plain(i) for i in table.query(RANGE_PK, sk_prefix=range_prefix(epoch, hour, passes))}


def plan_visit(items: dict[int, dict[str, Any]], ranges: int, now_ns: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The next visit of the Map: the ranges with work now (``{"r", "task"}``: ``gc`` or
    ``retention``, the role their phase needs) and the times the others wait for; a range without
    an item has not begun. Both empty: every range is done.

    >>> plan_visit({0: {"phase": "done"}, 1: {"phase": "derived"}, 2: {"phase": "blobs", "wait_until_ns": 9}}, 4, 5)
    ([{'r': 1, 'task': 'retention'}, {'r': 3, 'task': 'gc'}], [9])
    """
    ready, waits = [], []
    for r in range(ranges):
        item = items.get(r)
        if item is not None and item["phase"] == "done":
            continue
        if item is not None and int(item.get("wait_until_ns") or 0) > now_ns:
            waits.append(int(item["wait_until_ns"]))
        else:
            ready.append({"r": r, "task": "retention" if item is not None and item["phase"] == "derived" else "gc"})
    return ready, waits


def folded(items: dict[int, dict[str, Any]]) -> dict[str, int]:
    """The ranges' counters summed, and their pages as ``page``: what the summary adds."""
    out: dict[str, int] = {}
    for item in items.values():
        for k, v in {**(item.get("counts") or {}), "page": item.get("page", 0)}.items():
            out[k] = out.get(k, 0) + int(v)
    return out


class RangeTask:
    """One Map iteration: a bounded piece of one range's work (module docstring). ``reaper`` is the
    task's :class:`~lightmetrics.reaps.Reaper` (its context, fence and clock; nothing of it is shared
    with the other ranges' tasks of the same process). ``event``: ``reap`` (the execution's),
    ``job`` (the hour, pass, range count and page parameters the hour's task planned with) and
    ``range`` (``{"r": ..., "task": ...}``)."""

    def __init__(self, reaper: Any, event: dict[str, Any]) -> None:
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
    def _load(self) -> dict[str, Any]:
        found = self.table.get(RANGE_PK, self.sk)
        if found is not None:
            return cast(dict[str, Any], plain(found))
        plan = self.hr.plan()  # the first task of this range and pass: its bounds
        if plan.ranges != int(self.job["ranges"]) or not 0 <= self.r < plan.ranges:
            raise InvalidReapInput(f"range {self.r} of {self.job['ranges']}: the plan of {self.job['hour']} "
                                   f"has {plan.ranges} ranges")
        start_after, end_at = plan.key_bounds(self.hr.by_time_prefix, self.r)
        return {"epoch": int(self.reap["epoch"]), "owner": self.reap["owner"], "hour": self.job["hour"],
                "pass": self.passes, "range": self.r, "start_after": start_after or "", "end_at": end_at or "",
                "phase": "blobs", "after": start_after or "", "listing_done": False, "page": 0, "pending": [],
                "wait_until_ns": 0, "version": 0, "counts": {}}

    def _save(self, ops: list[Op] | None = None) -> None:
        """Write the range item (with ``ops``: in one transaction): after a fence, conditional on the
        owner and version this task read. Another owner's item is taken over by the lease's holder
        (a ``resume``); a twin that moved the range on makes this task stop (:class:`RangeStale`)."""
        self.fence.renew()  # rule L2: right before the write; LeaseLost if the reap lost its lease
        read, now = self.item, self.reaper.now()
        item = {**read, "pk": RANGE_PK, "sk": self.sk, "owner": self.reap["owner"], "version": int(read["version"]) + 1,
                "updated_at_ns": now, "expires_at": now // _NS + RANGE_ITEM_TTL_S}
        if int(read["version"]) == 0:
            cond, names, values = "attribute_not_exists(pk)", {}, {}
        else:
            cond = "#v = :v AND #own = :own"
            names, values = {"#v": "version", "#own": "owner"}, {":v": int(read["version"]), ":own": read["owner"]}
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
        self.item = item

    def _add(self, counts: dict[str, int]) -> None:
        mine = dict(self.item.get("counts") or {})
        for k, v in counts.items():
            if v:
                mine[k] = int(mine.get(k, 0)) + int(v)
        self.item["counts"] = mine

    def _result(self) -> dict[str, Any]:
        return {"r": self.r, "phase": self.item["phase"], "wait_until_ns": int(self.item.get("wait_until_ns") or 0)}

    def _budget_left(self, units: int) -> bool:
        return units < RANGE_TASK_UNITS and self.reaper.now() - self.started_ns < RANGE_TASK_SECONDS * _NS

    def _wait_until(self, until_ns: int) -> bool:
        if int(self.item.get("wait_until_ns") or 0) != until_ns:
            self.item["wait_until_ns"] = until_ns
            self._save()
        return False

    # -- the GC role: marks and settles ------------------------------------------------------------
    def gc(self) -> dict[str, Any]:
        """Up to RANGE_TASK_UNITS units of the range's blobs phase; ``phase``/``wait_until_ns`` say
        what the range needs next."""
        if self.item["phase"] != "blobs":
            return self._result()  # a retried task whose range moved on
        collector = BlobCollector(self.ctx, self.settings, concurrency=int(self.job["concurrency"]), fence=self.fence)
        try:
            units = 0
            while self.item["phase"] == "blobs" and self._budget_left(units) and self._blobs_unit(collector):
                units += 1
        except RangeStale:
            return {**self._result(), "stale": True}
        finally:
            collector.close()
        return self._result()

    def _blobs_unit(self, collector: BlobCollector) -> bool:
        """One unit of the blobs phase; False when the range has nothing to do now."""
        now, item = self.reaper.now(), self.item
        intent = item.get("intent")
        if intent:
            # A crash after the intent: find or place its markers once its writer cannot be placing them (L3).
            until = self.reaper._writer_may_run_until(
                {"state": "intent", "created_at_ns": intent["t"], "owner": intent["owner"]}, self.reap,
                {"owned_since_ns": self.job.get("owned_since_ns", 0)})
            if until > now:
                return self._wait_until(until)
            stored = self._read_marks(intent["p"], int(intent["n"]))
            self._record(collector.recover([m for i in stored for m in i["marks"]]), intent,
                         [f"{intent['p']}{k:03d}" for k in range(int(intent["n"]))])
            return True
        due = [p for p in item["pending"] if collector.due({"marked_at_ns": p["t"]}, now)]
        if due:
            self._settle(collector, due[0], now)
            return True
        if not item["listing_done"] and len(item["pending"]) < int(self.job["max_pending_pages"]):
            self._mark(collector, now)
            return True
        if item["listing_done"] and not item["pending"]:
            item.update(phase="derived", after=item["start_after"], wait_until_ns=0)
            self._save()
            crashpoints.point(CP_RANGE_BLOBS_DONE)
            return False
        return self._wait_until(min(int(p["t"]) for p in item["pending"]) + int(self.settings.gc_grace_s) * _NS)

    def _mark(self, collector: BlobCollector, now: int) -> None:
        item = self.item
        keys, more = self.hr.page(item["after"], int(self.job["page_size"]), end_at=item["end_at"] or None)
        page = self.hr.records(keys)  # an unreadable record blocks its entry, not the page
        collector.records_read = {self.codec.accepted(m.identity): m for m in page.records.values()}  # rule G-R1
        deletable, counts = proof_counts(collector.prove_all(page.blob_keys, now_ns=now), retention=True)
        if page.blocked:
            counts["kept#blocked"] = len(page.blocked)
        cursor = keys[-1] if keys else item["after"]
        if not deletable:
            self._record([], {"after": cursor, "more": more, "counts": counts}, [])
            return
        intents = [collector.intent(p, now) for p in deletable]
        prefix = range_page_prefix(self.reap["epoch"], self.r, self.passes, int(item["page"]))
        ops = page_ops(self.reap["epoch"], 0, intents, {"epoch": self.reap["epoch"], "owner": self.reap["owner"],
                                                        "state": "intent", "created_at_ns": now}, [], prefix=prefix)
        # The intent is durable (in the range item and its marks items) before the first marker.
        item["intent"] = {"p": prefix, "n": len(ops), "t": now, "owner": self.reap["owner"], "after": cursor,
                          "more": more, "counts": counts}
        self._save(ops)
        crashpoints.point(CP_RANGE_INTENT)
        self._record(collector.mark(intents), item["intent"], [op.sk for op in ops])

    def _record(self, marks: list[dict[str, Any]], page: dict[str, Any], replaces: list[str]) -> None:
        """A page done: its marks (replacing its intent items) pending settle, the cursor, the counts."""
        item = self.item
        if marks:
            marked_at = max(int(m["marked_at_ns"]) for m in marks)
            ops = page_ops(self.reap["epoch"], 0, marks, {"epoch": self.reap["epoch"], "owner": self.reap["owner"],
                                                          "state": "marked", "marked_at_ns": marked_at},
                           replaces, prefix=page["p"])
            parts = sum(1 for op in ops if op.kind == "Put")
            item["pending"] = [*item["pending"], {"p": page["p"], "n": parts, "t": marked_at}]
        else:  # nothing marked (nothing deletable, or every captured version was gone): no items left
            ops = [Op("Delete", CHECKPOINT_PK, sk) for sk in replaces]
        item.update(after=page["after"], listing_done=not page["more"], page=int(item["page"]) + 1)
        item.pop("intent", None)
        self._add({**page["counts"], "c_marked": len(marks)})
        self._save(ops)
        crashpoints.point(CP_RANGE_PAGE)

    def _read_marks(self, prefix: str, parts: int) -> list[dict[str, Any]]:
        found = (self.table.get(CHECKPOINT_PK, f"{prefix}{k:03d}") for k in range(parts))
        return [decode_marks_item(i, self.codec) for i in found if i is not None]

    def _settle(self, collector: BlobCollector, pending: dict[str, Any], now: int) -> None:
        """Purge or restore one recorded page's marks; its items go in the transaction that counts them."""
        stored = self._read_marks(pending["p"], int(pending["n"]))
        self._add(settle_counts(collector.settle([m for i in stored for m in i["marks"]], now_ns=now)))
        self.item["pending"] = [p for p in self.item["pending"] if p["p"] != pending["p"]]
        self._save([Op("Delete", CHECKPOINT_PK, f"{pending['p']}{k:03d}") for k in range(int(pending["n"]))])
        crashpoints.point(CP_RANGE_SETTLED)

    # -- the retention role: derived entries -------------------------------------------------------
    def derived(self) -> dict[str, Any]:
        """Up to RANGE_TASK_UNITS pages of the range's derived entries: each page's
        ``accepted-by-blob`` entries, then its ``accepted-by-time`` entries, on one listing (R-I8)."""
        units = 0
        try:
            while self.item["phase"] == "derived" and self._budget_left(units):
                item = self.item
                keys, more = self.hr.page(item["after"], int(self.job["page_size"]), end_at=item["end_at"] or None)
                self.hr.delete_page(keys)
                item["after"] = keys[-1] if keys else item["after"]
                if not more:
                    item["phase"] = "done"
                self._save()
                crashpoints.point(CP_RANGE_DERIVED)
                units += 1
        except RangeStale:
            return {**self._result(), "stale": True}
        return self._result()


__all__ = ["CP_RANGES_FOLDED", "CP_RANGE_BLOBS_DONE", "CP_RANGE_DERIVED", "CP_RANGE_INTENT", "CP_RANGE_PAGE",
           "CP_RANGE_SETTLED", "FOLD_DELETES_PER_TRANSACTION", "RANGE_ITEM_TTL_S", "RANGE_PK", "RangeStale",
           "RangeTask", "folded", "plan_visit", "range_prefix", "range_sk", "read_ranges"]
