"""The reap's GC task (docs/reaps.md): one page per task — mark (prove a page of candidates, record
the intent, place delete markers, record the marks and move the cursor) or settle (after the grace:
purge or restore recorded marks); also the blobs of a retention hour, with the proof "hour tombstoned"."""

from __future__ import annotations

import json
from contextlib import closing
from typing import Any

from lightmetrics.protocol.control_store import Op
from lightmetrics.protocol.errors import KeyLayoutError
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.gc import BlobCollector
from lightmetrics.reaps.gc_marks import page_of, page_ops, page_prefix
from lightmetrics.reaps.params import (
    CHECKPOINT_PK,
    DEFAULT_MAX_PAGES,
    source_cursor_sk,
)
from lightmetrics.reaps.reaper_base import (
    CP_INTENT,
    CP_PAGE_DONE,
    CP_SETTLE_RECORDED,
    NS,
    ReaperBase,
)
from lightmetrics.reaps.report import proof_counts, settle_counts
from lightmetrics.reaps.retention import HourRetention
from lightmetrics.reaps.retention_ranges import (
    RangeTask,
)
from lightmetrics.work import crashpoints


class GcTasks(ReaperBase):
    """The ``gc`` task of :class:`~lightmetrics.reaps.steps.Reaper`."""

    def gc(self, event: dict[str, Any]) -> dict[str, Any]:
        if "range" in event:  # an iteration of the Ranges Map: one key range's blobs (reap.ranges)
            return RangeTask(self, event).gc()
        return self._counted(self._gc(event))

    def _gc(self, event: dict[str, Any]) -> dict[str, Any]:
        reap = event["reap"]
        cp = self.summary(reap)
        if self._task_of(cp["phase"]) != "gc":
            return self._route(reap, cp)  # a retried task whose step already committed: just route
        collector = BlobCollector(self.ctx, self.settings, concurrency=int(cp["concurrency"]), fence=self.fence(reap))
        try:
            if cp["phase"] == "settle":
                return self._settle(reap, cp, collector)
            if cp["phase"] in ("mark", "blobs"):
                return self._mark_page(reap, cp, collector)
            raise InvalidReapInput(f"reap-gc cannot run phase {cp['phase']!r}")
        finally:
            collector.close()

    def _candidates(self, cp: dict[str, Any]) -> tuple[list[str], str, bool, dict[str, Any]]:
        """One page of candidate blob keys after the cursor: ``(blob keys, new cursor, more, counts)``
        (counts by kept reason, and ``through``: the first hour not yet proven)."""
        limit, after = int(cp["page_size"]), cp.get("after") or None
        if cp["phase"] == "blobs":  # retention: the blobs of the hour's accepted manifests
            hr = HourRetention(self.ctx, UtcHour.parse(cp["hours"][int(cp["hour_index"])]),
                               concurrency=int(cp["concurrency"]))
            keys, more = hr.page(after or "", limit)
            page = hr.records(keys)  # an unreadable record blocks its entry, not the page
            self.records_read = {self.codec.accepted(m.identity): m for m in page.records.values()}
            counts = {"kept#blocked": len(page.blocked)} if page.blocked else {}
            return page.blob_keys, (keys[-1] if keys else after or ""), more, counts
        if cp["source"] == "audit":
            return (*self._audit_candidates(cp), {})
        if cp["source"] == "by-time":  # raw-blobs-by-time hours older than the retry horizon
            root = self.codec.root(KeyKind.RAW_BLOBS_BY_TIME)
            prefix = self.codec.raw_blobs_by_time_hour(UtcHour.parse(cp["hour"])) if cp.get("hour") else root
            listing = self.ctx.store.list_page(prefix, max_keys=limit, start_after=after)
            horizon = UtcHour.of_unix_ns(self.now() - int(self.settings.retry_horizon_s) * NS)
            out, last = [], after or ""
            for key in listing.keys:
                try:
                    parsed = self.codec.parse(key)
                except KeyLayoutError:
                    out.append(key)  # not ours: GC opens its blocker and goes on (rule D4)
                    last = key
                    continue
                if parsed.hour is not None and parsed.hour >= horizon:
                    # Keys are in hour order: the rest are too young. Every due hour is proven.
                    return out, last, False, {"through": str(horizon)}
                out.append(self.codec.raw_blob(parsed.sha256 or ""))
                last = key
            if not listing.truncated:
                return out, last, False, {"through": str(horizon)}
            # Hours before the last key's are proven (rule G-B1: the first hour not yet proven).
            try:
                through = self.codec.parse(last).hour
            except KeyLayoutError:
                through = None
            return out, last, True, {"through": str(through)} if through else {}
        listing = self.ctx.store.list_page(self.codec.root(KeyKind.RAW_BLOB), max_keys=limit, start_after=after)
        return listing.keys, (listing.keys[-1] if listing.keys else after or ""), listing.truncated, {}

    def _audit_candidates(self, cp: dict[str, Any]) -> tuple[list[str], str, bool]:
        """The Spark audit's confirmed orphan candidates, ``page_size`` lines a page whatever the
        size of its part files. The cursor is ``<part key>#<byte offset>`` inside a part, or the
        last finished part's key; a page reads its lines with one ranged GET from the offset."""
        run = self.codec.audit_run(cp["audit_run"])
        if self.ctx.store.head(f"{run}summary.json") is None:
            raise InvalidReapInput(f"audit run {cp['audit_run']} is not committed (no summary.json)")
        parts_prefix = f"{run}orphan-blob-candidates/"
        after = cp.get("after") or ""
        part, _, offset = after.rpartition("#")
        if not (part.startswith(parts_prefix) and offset.isdigit()):
            listing = self.ctx.store.list_page(parts_prefix, max_keys=1, start_after=after or None)
            if not listing.keys:
                return [], after, False
            part, offset = listing.keys[0], "0"
        keys, end, finished = self._audit_lines(part, int(offset), int(cp["page_size"]))
        if not finished:
            return keys, f"{part}#{end}", True
        following = self.ctx.store.list_page(parts_prefix, max_keys=1, start_after=part)
        return keys, part, bool(following.keys)

    def _audit_lines(self, part: str, offset: int, limit: int) -> tuple[list[str], int, bool]:
        """Up to ``limit`` blob keys of the part file from byte ``offset``: ``(keys, offset after
        them, whether the file ended)``; reads only as far as it needs."""
        keys: list[str] = []
        with closing(self.ctx.store.lines_from(part, offset)) as lines:
            for line in lines:
                if len(keys) >= limit:
                    return keys, offset, False
                start, offset = offset, offset + len(line)
                if line.strip():
                    try:
                        keys.append(str(json.loads(line)["blob_key"]))
                    except (ValueError, KeyError, TypeError):
                        keys.append(f"{part}#{start}")  # not a blob key: GC blocks it and goes on
        return keys, offset, True

    def _mark_page(self, reap: dict[str, Any], cp: dict[str, Any], collector: BlobCollector) -> dict[str, Any]:
        page = int(cp["page"])
        prefix = page_prefix(reap["epoch"], page)
        intent = [i for i in self.marks_items() if str(i["sk"]).startswith(prefix) and i.get("state") == "intent"]
        if intent:
            # A crash after the intent: some markers may be placed; find them, place the others —
            # once the run that recorded the intent cannot be placing them any more (rule L3).
            until = max(self._writer_may_run_until(i, reap, cp) for i in intent)
            if until > self.now():
                return self._wait(reap, cp, until)
            first = intent[0]
            marks = collector.recover([m for i in intent for m in i["marks"]])
            return self._record_page(reap, cp, marks, first["cursor"], bool(first["more"]), first.get("counts") or {},
                                     replaces=[i["sk"] for i in intent])
        self.records_read = {}
        keys, cursor, more, counts = self._candidates(cp)
        collector.records_read.update(self.records_read)  # retention: each record read once (rule G-R1)
        now = self.now()
        proofs = collector.prove_all(keys, now_ns=now)
        deletable, proven = proof_counts(proofs, retention=cp["phase"] == "blobs")
        counts.update(proven)
        intents = [collector.intent(p, now) for p in deletable]
        if cp["dry_run"] or not intents:
            return self._record_page(reap, cp, [], cursor, more, counts, write_marks=False)
        # The intent is durable before the first marker: a crash in between is recoverable.
        ops = page_ops(reap["epoch"], page, intents, {"epoch": reap["epoch"], "owner": reap["owner"], "state": "intent",
                                                   "cursor": cursor, "more": more, "counts": counts,
                                                   "created_at_ns": now}, [])
        self._commit(reap, ops=ops)
        crashpoints.point(CP_INTENT)
        marks = collector.mark(intents)
        return self._record_page(reap, cp, marks, cursor, more, counts, replaces=[op.sk for op in ops])

    def _record_page(self, reap: dict[str, Any], cp: dict[str, Any], marks: list[dict[str, Any]], cursor: str,
                     more: bool, counts: dict[str, Any], *, write_marks: bool = True,
                     replaces: list[str] | None = None) -> dict[str, Any]:
        """The page's marks (replacing its intent items) and the cursor, in one transaction."""
        page = int(cp["page"])
        replaces = replaces or []
        counts = dict(counts)
        through: str | None = counts.pop("through", None)
        # Rule G-B1: a GC run marks at most max_pages pages, then settles and ends.
        exhausted = (cp["mode"] == "gc" and more
                     and page + 1 >= int(cp.get("max_pages") or DEFAULT_MAX_PAGES))
        ended = not more
        more = more and not exhausted
        if write_marks and marks:
            ops = page_ops(reap["epoch"], page, marks, {"epoch": reap["epoch"], "owner": reap["owner"], "state": "marked",
                                                     # the marks' own time (decode_mark gives it back to each)
                                                     "marked_at_ns": max(int(m["marked_at_ns"]) for m in marks)},
                                  replaces)
        else:  # nothing marked (a dry run, or every captured version was gone): no items left
            ops = [Op("Delete", CHECKPOINT_PK, sk) for sk in replaces]
        items = self.marks_items()
        pages = {page_of(str(i["sk"])) for i in items if str(i["sk"]) not in replaces}
        pending = len(pages | ({page_prefix(reap["epoch"], page)} if write_marks and marks else set()))
        set_: dict[str, Any] = {"after": cursor, "page": page + 1}
        if through:
            set_["through"] = through
        if exhausted:
            set_["budget_exhausted"] = True
        ops += self._source_cursor_ops(cp, cursor, through, ended)
        # A dry run marks nothing, so a failed reap's pending pages never cut its count short (DR2).
        if not more or (not cp["dry_run"] and pending >= int(cp["max_pending_pages"])):
            set_["listing_done"] = not more
            if cp["dry_run"]:
                set_["phase"] = self._after_blobs(cp) if cp["phase"] == "blobs" else "done"
            else:
                set_["phase"] = "settle"
                latest = max([int(m["marked_at_ns"]) for i in items if str(i["sk"]) not in replaces for m in i["marks"]]
                             + [int(m["marked_at_ns"]) for m in marks] + [0])
                set_["wait_until_ns"] = latest + int(self.settings.gc_grace_s) * NS if latest else 0
        self._commit(reap, set_=set_, add={**counts, "c_marked": len(marks)}, ops=ops)
        crashpoints.point(CP_PAGE_DONE)
        return self._route(reap, {**cp, **set_})

    def _source_cursor_ops(self, cp: dict[str, Any], cursor: str, through: str | None, ended: bool) -> list[Op]:
        """Rule G-B1: the source's durable cursor moves with the page that proved the keys up to it,
        in the page's transaction (marks recorded first, so they are settled whatever happens next).
        ``by-time`` keeps its cursor (new hours come after it) and never moves it back; ``scan`` and
        an audit start their next pass from the beginning once a pass has ended."""
        sk = cp.get("source_cursor")
        if not sk or cp["dry_run"] or cp["phase"] != "mark":
            return []
        by_time = sk == source_cursor_sk("by-time")
        names = {"#a": "after", "#u": "updated_at_ns", "#ep": "epoch", "#end": "ended"}
        # ``ended``: the pass reached the source's end (G-B3: a scheduled audit GC proves a run once)
        values: dict[str, Any] = {":a": cursor if by_time or not ended else "", ":u": self.now(), ":ep": cp["epoch"],
                                  ":end": bool(ended)}
        expr = "SET #a = :a, #u = :u, #ep = :ep, #end = :end"
        if through:
            names["#t"], values[":t"] = "through", through
            expr += ", #t = :t"
        return [Op("Update", CHECKPOINT_PK, sk, expr, names, values,
                   "attribute_not_exists(#a) OR #a <= :a" if by_time else None)]

    def _after_blobs(self, cp: dict[str, Any]) -> str:
        return "derived" if cp["phase"] in ("blobs", "settle") and cp["mode"] == "retention" else "done"

    def _settle(self, reap: dict[str, Any], cp: dict[str, Any], collector: BlobCollector) -> dict[str, Any]:
        items = self.marks_items()
        now = self.now()
        if items:
            item = items[0]
            until = self._writer_may_run_until(item, reap, cp)
            if until > now:  # its markers may still be on their way: settle once they cannot be
                return self._wait(reap, cp, until)
            marks = item["marks"]
            not_due = [int(m["marked_at_ns"]) for m in marks if not collector.due(m, now)]
            if not_due:
                return self._wait(reap, cp, max(not_due) + int(self.settings.gc_grace_s) * NS)
            add = settle_counts(collector.settle(marks, now_ns=now))
            self._commit(reap, add=add, ops=[Op("Delete", CHECKPOINT_PK, item["sk"])])
            crashpoints.point(CP_SETTLE_RECORDED)
            if len(items) > 1:
                return {"reap": reap, "next": "gc"}
        # Every recorded mark is settled: continue marking, or move on (a closing settle ends the reap).
        if cp.get("closing"):
            set_ = {"phase": "done", "wait_until_ns": 0}
        elif cp["mode"] == "gc":
            set_ = {"phase": "done" if cp.get("listing_done") else "mark", "wait_until_ns": 0}
        else:
            set_ = {"phase": "derived" if cp.get("listing_done") else "blobs", "wait_until_ns": 0}
            if cp.get("listing_done"):
                set_["after"] = ""
        self._commit(reap, set_=set_)
        return self._route(reap, {**cp, **set_})

    # -- the retention task ------------------------------------------------------------------------
