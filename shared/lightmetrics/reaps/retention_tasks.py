"""The reap's retention task (docs/reaps.md; docs/protocol.md §16): one step of an expired hour per
task (:mod:`lightmetrics.reaps.retention`), and the hour's visits of the ``Ranges`` Map when its range
plan has R > 1 key ranges (:mod:`lightmetrics.reaps.retention_ranges`)."""

from __future__ import annotations

from typing import Any

from lightmetrics.protocol.control_store import Op
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps.dry_run import count_keys
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.params import (
    DEFAULT_RANGE_PARALLELISM,
)
from lightmetrics.reaps.reaper_base import CP_STEP_DONE, NS, REPORT_BLOCKED_MAX, ReaperBase
from lightmetrics.reaps.report import hour_unfinished
from lightmetrics.reaps.retention import KIND_RETENTION, HourRetention, WatermarkBehind
from lightmetrics.reaps.retention_ranges import (
    CP_RANGES_FOLDED,
    FOLD_DELETES_PER_TRANSACTION,
    RANGE_PK,
    RangeTask,
    folded,
    plan_visit,
    read_ranges,
)
from lightmetrics.work import crashpoints
from lightmetrics.work.units import work_key


class RetentionTasks(ReaperBase):
    """The ``retention`` task of :class:`~lightmetrics.reaps.steps.Reaper`."""

    def retention(self, event: dict[str, Any]) -> dict[str, Any]:
        if "range" in event:  # an iteration of the Ranges Map: one key range's derived entries (reap.ranges)
            return RangeTask(self, event).derived()
        return self._counted(self._retention(event))

    def _retention(self, event: dict[str, Any]) -> dict[str, Any]:
        reap = event["reap"]
        cp = self.summary(reap)
        if self._task_of(cp["phase"]) != "retention":
            return self._route(reap, cp)  # a retried task whose step already committed: just route
        index = int(cp["hour_index"])
        if index >= len(cp["hours"]):
            ended = self._finishing(cp)
            self._commit(reap, set_=ended)
            return self._route(reap, {**cp, **ended})
        hour = cp["hours"][index]
        scope = cp.get("scope") or "raw"
        fence = self.fence(reap)
        hr = HourRetention(self.ctx, UtcHour.parse(hour), scope, fence=fence, concurrency=int(cp["concurrency"]))
        phase, now = cp["phase"], self.now()
        # What follows the tombstone (and a verify pass): the hour's key ranges in parallel when its
        # plan has more than one (reap.ranges), else its blobs (rollups: its chunks).
        first = "chunks" if scope == "rollup" else "ranges" if int(cp.get("ranges") or 1) > 1 else "blobs"
        add: dict[str, int] = {}
        if phase == "commit":
            set_, add = self._tombstone_step(reap, cp, hr, hour, fence, first, now)
        elif phase == "ranges":
            return self._ranges(reap, cp, hour)
        elif phase in ("chunks", "manifests"):  # rollup scope: chunks and index first, manifests last
            prefixes = hr.chunk_prefixes() if phase == "chunks" else [self.codec.rollup_manifest_hour(hr.hour)]
            deleted, more = hr.delete_rollup_page(prefixes, int(cp["page_size"]))
            add = {"c_examined": deleted, "c_purged": deleted}
            set_ = {} if more else {"phase": "manifests" if phase == "chunks" else "verify"}
        elif phase in ("derived", "by-time"):  # "by-time": a checkpoint of a version that ran it apart
            # Steps 3 and 4 on one listing (rule R-I8): a page's accepted-by-blob entries, then its
            # accepted-by-time entries — only those this listing returned. Entries kept for an open
            # blocker stay: hence the cursor.
            keys, more = hr.page(cp.get("after") or "", int(cp["page_size"]))
            hr.delete_page(keys)
            set_ = {"after": keys[-1] if keys else cp.get("after") or ""}
            if not more:
                set_ = {"phase": "verify", "after": ""}
        elif phase == "verify":
            set_ = self._verify_step(reap, cp, hr, hour, fence, first, now)
        else:
            raise InvalidReapInput(f"reap-retention cannot run phase {phase!r}")
        self._commit(reap, set_=set_, add=add)
        crashpoints.point(CP_STEP_DONE)
        return self._route(reap, {**cp, **set_})

    def _tombstone_step(self, reap: dict[str, Any], cp: dict[str, Any], hr: HourRetention, hour: str, fence: Any,
                        first: str, now: int) -> tuple[dict[str, Any], dict[str, int]]:
        """Phase ``commit``: the hour's tombstone (a dry run only counts what would go); then ``first``,
        or the hour's key ranges in parallel when its plan has more than one."""
        scope = cp.get("scope") or "raw"
        set_: dict[str, Any]
        add: dict[str, int] = {}
        if cp["dry_run"]:  # rule DR2: every key of the hour, counted over as many tasks as it takes
            prefixes = [hr.by_time_prefix] if scope == "raw" else \
                hr.chunk_prefixes() + [self.codec.rollup_manifest_hour(hr.hour)]
            counted, after, more = count_keys(self.ctx.store, prefixes, cp.get("after") or "")
            add = {"c_examined": counted, "c_deletable": counted}
            set_ = {"after": after} if more else self._next_hour(cp, hour, "would-reap")
        else:
            retention_s = self.settings.rollup_retention_s if scope == "rollup" else self.settings.retention_s
            try:
                fence()
                hr.commit(epoch=int(reap["epoch"]), retention_s=int(retention_s), now_ns=now)
            except WatermarkBehind:
                set_ = self._next_hour(cp, hour, "skipped: watermark does not cover the hour")
            else:
                set_ = {"phase": first, "after": "", "listing_done": False,
                        "wait_until_ns": now + int(cp["tombstone_wait_s"]) * NS}
                plan = hr.plan() if scope == "raw" else None
                if plan is not None and plan.ranges > 1:
                    set_.update(phase="ranges", ranges=plan.ranges)
        return set_, add

    def _verify_step(self, reap: dict[str, Any], cp: dict[str, Any], hr: HourRetention, hour: str, fence: Any,
                     first: str, now: int) -> dict[str, Any]:
        """Phase ``verify``: the hour is reaped, gets another pass (late writes), or is left with a reason."""
        scope = cp.get("scope") or "raw"
        set_: dict[str, Any]
        late, blocked = hr.leftovers() if scope == "raw" else ([] if hr.rollup_empty() else ["?"], [])
        if not late and not blocked:
            fence()
            hr.mark_reaped(epoch=int(reap["epoch"]), passes=int(cp["passes"]), now_ns=now)
            set_ = self._next_hour(cp, hour, "reaped")
        elif late and int(cp["passes"]) < int(cp["verify_passes"]):
            # Late writes: another pass over the hour (its blobs, then its derived entries).
            set_ = {"phase": first, "after": "", "listing_done": False, "passes": int(cp["passes"]) + 1}
        elif late:
            set_ = self._next_hour(cp, hour, "skipped: entries kept appearing")
        else:  # tombstoned, not reaped: a later run finishes it once the blockers are resumed or skipped
            set_ = self._next_hour(cp, hour, f"blocked: {len(blocked)} entries have an open {KIND_RETENTION} "
                                             "blocker (lmctl blockers list)")
            known = list(cp.get("blocked") or [])
            set_["blocked"] = (known + [work_key(KIND_RETENTION, k) for k in blocked
                                        if work_key(KIND_RETENTION, k) not in known])[:REPORT_BLOCKED_MAX]
        return set_

    def _next_hour(self, cp: dict[str, Any], hour: str, status: str) -> dict[str, Any]:
        if hour_unfinished(status):  # the hour cannot finish yet: alarm RetentionUnfinished (R9)
            self.ctx.metrics.add_metric(name="RetentionHoursUnfinished", unit="Count", value=1)
        statuses = dict(cp.get("hour_status") or {})
        statuses[hour] = status
        last = int(cp["hour_index"]) + 1 >= len(cp["hours"])
        out = {"hour_status": statuses, "hour_index": int(cp["hour_index"]) + 1, "passes": 1, "after": "",
               "listing_done": False, "wait_until_ns": 0, "phase": "commit"}
        if last:
            out.update(self._finishing(cp))
        if int(cp.get("ranges") or 1) > 1:
            out["ranges"] = 1  # the next hour's commit reads its own plan
        return out

    # -- an hour in key ranges (reap.ranges; docs/protocol.md §16) -------------------------------------
    def _ranges(self, reap: dict[str, Any], cp: dict[str, Any], hour: str) -> dict[str, Any]:
        """The hour's task between visits of the Ranges Map: the ranges with work now go to the next
        visit; if every range waits (a grace, rule L3), the execution waits for the first; once every
        range is done, their counters are folded into the summary, their items deleted, and the hour
        goes on to verify."""
        epoch, passes, ranges = int(reap["epoch"]), int(cp["passes"]), int(cp["ranges"])
        items = read_ranges(self.table, epoch, hour, passes)
        ready, waits = plan_visit(items, ranges, self.now())
        if ready:
            job = {"hour": hour, "passes": passes, "ranges": ranges, "page_size": int(cp["page_size"]),
                   "concurrency": int(cp["concurrency"]), "max_pending_pages": int(cp["max_pending_pages"]),
                   "owned_since_ns": int(cp.get("owned_since_ns") or 0)}
            return {"reap": reap, "next": "ranges", "ranges": ready, "range_job": job,
                    "range_parallelism": int(cp.get("range_parallelism") or DEFAULT_RANGE_PARALLELISM)}
        if waits:
            return self._wait(reap, cp, min(waits))  # recorded: a continuation's Begin waits too
        set_ = {"phase": "verify", "after": "", "wait_until_ns": 0}
        deletes = [Op("Delete", RANGE_PK, str(i["sk"])) for i in items.values()]
        n = FOLD_DELETES_PER_TRANSACTION
        self._commit(reap, set_=set_, add=folded(items), ops=deletes[:n])
        crashpoints.point(CP_RANGES_FOLDED)
        for i in range(n, len(deletes), n):  # a crash here leaves items of a finished pass: never read again
            self._commit(reap, ops=deletes[i:i + n])
        return self._route(reap, {**cp, **set_})
