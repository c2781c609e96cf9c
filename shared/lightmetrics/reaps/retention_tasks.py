"""The reap's retention task (docs/reaps.md; docs/protocol.md §16): one step of an expired hour per
task (:mod:`lightmetrics.reaps.retention`), and the hour's visits of the ``Ranges`` Map when its range
plan has R > 1 key ranges (:mod:`lightmetrics.reaps.retention_ranges`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lightmetrics.protocol.control_store import Op
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps.dry_run import count_keys
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.mark_settle import CandidatePage
from lightmetrics.reaps.params import (
    DEFAULT_RANGE_PARALLELISM,
)
from lightmetrics.reaps.reap_job import CP_STEP_DONE, NS, REPORT_BLOCKED_MAX, ReapJob
from lightmetrics.reaps.report import hour_unfinished
from lightmetrics.reaps.retention import KIND_RETENTION, HourRetention, WatermarkBehind
from lightmetrics.reaps.retention_ranges import (
    CP_RANGES_FOLDED,
    FOLD_DELETES_PER_TRANSACTION,
    RANGE_PK,
    RangeTask,
    blob_page,
    folded,
    plan_visit,
    range_sk,
    read_ranges,
)
from lightmetrics.reaps.state import CheckpointChange, ReapCheckpoint, ReapPhase, ReapRun
from lightmetrics.work import crashpoints
from lightmetrics.work.units import work_key


class RetentionTasks:
    """The ``retention`` task of :class:`~lightmetrics.reaps.steps.Reaper`, over its :class:`ReapJob`."""

    def __init__(self, job: ReapJob) -> None:
        self.job, self.ctx, self.settings, self.codec, self.table = job, job.ctx, job.settings, job.codec, job.table

    def retention(self, event: dict[str, Any]) -> dict[str, Any]:
        if "range" in event:  # an iteration of the Ranges Map: one key range's derived entries (reap.ranges)
            return RangeTask(self.job, event).derived()
        return self.job.counted(self._retention(event))

    def hour_blobs(self, cp: ReapCheckpoint) -> CandidatePage:
        """The candidates of phase ``blobs`` (run by the GC role): the blobs of a page of the current
        hour's ``accepted-by-time`` entries after the summary's cursor."""
        hr = HourRetention(self.ctx, UtcHour.parse(cp.current_hour),
                           concurrency=cp.concurrency)
        return blob_page(hr, cp.after, cp.page_size)

    def _retention(self, event: dict[str, Any]) -> dict[str, Any]:
        reap = event["reap"]
        cp = self.job.summary(reap)
        if cp.phase.role != "retention":
            return self.job.route(reap, cp)  # a retried task whose step already committed: just route
        if cp.hour_index >= len(cp.hours):
            ended = self.job.finishing(cp.dry_run)
            self.job.commit(reap, ended)
            return self.job.route(reap, cp.with_changes(ended))
        hour = cp.current_hour
        scope = cp.scope
        fence = self.job.fence(reap)
        hr = HourRetention(self.ctx, UtcHour.parse(hour), scope, fence=fence, concurrency=cp.concurrency)
        phase, now = cp.phase, self.job.now()
        # What follows the tombstone (and a verify pass): the hour's key ranges in parallel when its
        # plan has more than one (reap.ranges), else its blobs (rollups: its chunks).
        first = ReapPhase.CHUNKS if scope == "rollup" else ReapPhase.RANGES if cp.ranges > 1 else ReapPhase.BLOBS
        add: dict[str, int] = {}
        if phase is ReapPhase.COMMIT:
            change, add = self._tombstone_step(reap, cp, hr, hour, fence, first, now)
        elif phase is ReapPhase.RANGES:
            return self._ranges(reap, cp, hour)
        elif phase in (ReapPhase.CHUNKS, ReapPhase.MANIFESTS):  # rollup scope: chunks and index first, manifests last
            chunks = phase is ReapPhase.CHUNKS
            prefixes = hr.chunk_prefixes() if chunks else [self.codec.rollup_manifest_hour(hr.hour)]
            deleted, more = hr.delete_rollup_page(prefixes, cp.page_size)
            add = {"c_examined": deleted, "c_purged": deleted}
            change = CheckpointChange(phase=None if more else ReapPhase.MANIFESTS if chunks else ReapPhase.VERIFY)
        elif phase in (ReapPhase.DERIVED, ReapPhase.BY_TIME):  # "by-time": a checkpoint of a version that ran it apart
            # Steps 3 and 4 on one listing (rule R-I8): a page's accepted-by-blob entries, then its
            # accepted-by-time entries — only those this listing returned. Entries kept for an open
            # blocker stay: hence the cursor.
            keys, more = hr.page(cp.after, cp.page_size)
            hr.delete_page(keys)
            change = CheckpointChange(after=keys[-1] if keys else cp.after)
            if not more:
                change = CheckpointChange(phase=ReapPhase.VERIFY, after="")
        elif phase is ReapPhase.VERIFY:
            change = self._verify_step(reap, cp, hr, hour, fence, first, now)
        else:
            raise InvalidReapInput(f"reap-retention cannot run phase {phase.value!r}")
        self.job.commit(reap, change, add=add)
        crashpoints.point(CP_STEP_DONE)
        return self.job.route(reap, cp.with_changes(change))

    def _tombstone_step(self, reap: ReapRun, cp: ReapCheckpoint, hr: HourRetention, hour: str, fence: Any,
                        first: ReapPhase, now: int) -> tuple[CheckpointChange, dict[str, int]]:
        """Phase ``commit``: the hour's tombstone (a dry run only counts what would go); then ``first``,
        or the hour's key ranges in parallel when its plan has more than one."""
        scope = cp.scope
        change: CheckpointChange
        add: dict[str, int] = {}
        if cp.dry_run:  # rule DR2: every key of the hour, counted over as many tasks as it takes
            prefixes = [hr.by_time_prefix] if scope == "raw" else \
                hr.chunk_prefixes() + [self.codec.rollup_manifest_hour(hr.hour)]
            counted, after, more = count_keys(self.ctx.store, prefixes, cp.after)
            add = {"c_examined": counted, "c_deletable": counted}
            change = CheckpointChange(after=after) if more else self._next_hour(cp, hour, "would-reap")
        else:
            retention_s = self.settings.rollup_retention_s if scope == "rollup" else self.settings.retention_s
            try:
                fence()
                hr.commit(epoch=int(reap["epoch"]), retention_s=int(retention_s), now_ns=now)
            except WatermarkBehind:
                change = self._next_hour(cp, hour, "skipped: watermark does not cover the hour")
            else:
                change = CheckpointChange(phase=first, after="", listing_done=False,
                                          wait_until_ns=now + cp.tombstone_wait_s * NS)
                plan = hr.plan() if scope == "raw" else None
                if plan is not None and plan.ranges > 1:
                    change = replace(change, phase=ReapPhase.RANGES, ranges=plan.ranges)
        return change, add

    def _verify_step(self, reap: ReapRun, cp: ReapCheckpoint, hr: HourRetention, hour: str, fence: Any,
                     first: ReapPhase, now: int) -> CheckpointChange:
        """Phase ``verify``: the hour is reaped, gets another pass (late writes), or is left with a reason."""
        scope = cp.scope
        late, blocked = hr.leftovers() if scope == "raw" else ([] if hr.rollup_empty() else ["?"], [])
        if not late and not blocked:
            fence()
            hr.mark_reaped(epoch=int(reap["epoch"]), passes=cp.passes, now_ns=now)
            return self._next_hour(cp, hour, "reaped")
        if late and cp.passes < cp.verify_passes:
            # Late writes: another pass over the hour (its blobs, then its derived entries).
            return CheckpointChange(phase=first, after="", listing_done=False, passes=cp.passes + 1)
        if late:
            return self._next_hour(cp, hour, "skipped: entries kept appearing")
        # tombstoned, not reaped: a later run finishes it once the blockers are resumed or skipped
        known = list(cp.blocked)
        return replace(self._next_hour(cp, hour, f"blocked: {len(blocked)} entries have an open {KIND_RETENTION} "
                                                 "blocker (lmctl blockers list)"),
                       blocked=(known + [work_key(KIND_RETENTION, k) for k in blocked
                                         if work_key(KIND_RETENTION, k) not in known])[:REPORT_BLOCKED_MAX])

    def _next_hour(self, cp: ReapCheckpoint, hour: str, status: str) -> CheckpointChange:
        if hour_unfinished(status):  # the hour cannot finish yet: alarm RetentionUnfinished (R9)
            self.ctx.metrics.add_metric(name="RetentionHoursUnfinished", unit="Count", value=1)
        statuses = dict(cp.hour_status)
        statuses[hour] = status
        last = cp.hour_index + 1 >= len(cp.hours)
        out = CheckpointChange(hour_status=statuses, hour_index=cp.hour_index + 1, passes=1, after="",
                               listing_done=False, wait_until_ns=0, phase=ReapPhase.COMMIT)
        if last:
            out = out.then(self.job.finishing(cp.dry_run))
        if cp.ranges > 1:
            out = replace(out, ranges=1)  # the next hour's commit reads its own plan
        return out

    # -- an hour in key ranges (reap.ranges; docs/protocol.md §16) -------------------------------------
    def _ranges(self, reap: ReapRun, cp: ReapCheckpoint, hour: str) -> dict[str, Any]:
        """The hour's task between visits of the Ranges Map: the ranges with work now go to the next
        visit; if every range waits (a grace, rule L3), the execution waits for the first; once every
        range is done, their counters are folded into the summary, their items deleted, and the hour
        goes on to verify."""
        epoch, passes, ranges = int(reap["epoch"]), cp.passes, cp.ranges
        items = read_ranges(self.table, epoch, hour, passes)
        ready, waits = plan_visit(items, ranges, self.job.now())
        if ready:
            job = {"hour": hour, "passes": passes, "ranges": ranges, "page_size": cp.page_size,
                   "concurrency": cp.concurrency, "max_pending_pages": cp.max_pending_pages,
                   "owned_since_ns": cp.owned_since_ns}
            return {"reap": reap, "next": "ranges", "ranges": ready, "range_job": job,
                    "range_parallelism": cp.range_parallelism or DEFAULT_RANGE_PARALLELISM}
        if waits:
            return self.job.wait(reap, cp, min(waits))  # recorded: a continuation's Begin waits too
        change = CheckpointChange(phase=ReapPhase.VERIFY, after="", wait_until_ns=0)
        deletes = [Op("Delete", RANGE_PK, range_sk(epoch, hour, passes, r)) for r in items]
        n = FOLD_DELETES_PER_TRANSACTION
        self.job.commit(reap, change, add=folded(items), ops=deletes[:n])
        crashpoints.point(CP_RANGES_FOLDED)
        for i in range(n, len(deletes), n):  # a crash here leaves items of a finished pass: never read again
            self.job.commit(reap, ops=deletes[i:i + n])
        return self.job.route(reap, cp.with_changes(change))
