"""The reap's Lambda tasks: each is one method of :class:`Reaper` (docs/reaps.md). The state machine
``infra/statemachines/reap.asl.json`` loops over them; every task returns ``{"reap": ..., "next": ...}``
and the state machine routes on ``next``:

``begin``      (reap-begin) validate the input (``mode`` and an explicit ``dry_run``), take the
               lease ``lease#reap`` with a new epoch (or ``resume`` the last one) — refused while
               another reap holds it (:class:`LeaseHeld`, the CLI exits 5).
``gc``         (reap-gc, the GC role) one page: mark (prove a page of candidates, record the
               intent, place delete markers, record the marks and move the cursor) or settle
               (after the grace: purge or restore recorded marks). Also the blobs of a
               retention hour, with the proof "hour tombstoned", and the settle every reap
               that is not a dry run runs before it ends while marks are left (G-I8).
``retention``  (reap-retention, the retention role) one step of an hour (lightmetrics.reaps.retention):
               commit the tombstone, delete derived entries, the hour's ``accepted-by-time``
               entries, verify empty, write the ``reaped`` marker.
``ranges``     the ``Ranges`` Map: an hour whose range plan has R > 1 key ranges runs its blobs and
               derived phases per range, one bounded task per range with work (``gc`` and
               ``retention`` called with ``range``: :mod:`lightmetrics.reaps.retention_ranges`), then the
               hour's ``retention`` task again (phase ``ranges``: the next visit, a wait, or verify).
``wait``       a Wait state (``wait_s``): the GC grace, or the tombstone settle time.
``continue``   (reap-continue) this execution ran ``max_tasks_per_execution`` tasks: start the next
               execution of the state machine with the same lease, epoch and owner (input
               ``{"continuation": ...}``), so no execution nears Step Functions' history limit.
``end``        (reap-end) the final report (examined, marked, purged, restored, kept and why);
               releases the lease.

Checkpoints (docs/control-table.md): the summary ``checkpoint#reap``/``current`` holds the
epoch, owner, phase, cursor and counters; each marked page has its own ``marks#`` items
(:mod:`lightmetrics.reaps.gc_marks`). GC's candidate sources keep a durable cursor across runs
(``checkpoint#reap``/``gc#<source>``, :func:`~lightmetrics.reaps.params.source_cursor_sk`): the
incremental ``by-time`` source proves each ``raw-blobs-by-time`` entry once, when its hour passes
the retry horizon, and a GC run stops after ``max_pages`` pages (the next run goes on from the
cursor), so GC never holds the one reap lease long enough to starve retention. Every write is one
transaction conditional on the summary's owner and epoch, which also renews the lease. A task that
crashes is retried by Step Functions with the same input and finds its page's intent, so nothing is
marked twice or forgotten.

Fencing (docs/protocol.md §13, L1-L3): ``lease_seconds`` must outlast the longest reap task plus a
margin (refused at ``begin`` otherwise); every S3 delete is sent right after a fence (a conditional
renewal of the lease, :class:`~lightmetrics.work.leases.Fence`), so a task that lost the lease deletes
nothing; and an intent another owner recorded is settled only once that owner cannot be running.

Example (the local runtime drives the tasks the same way)::

    >>> reaper = Reaper(ctx, settings)                                         # doctest: +SKIP
    >>> reaper.begin({"input": {"mode": "gc", "dry_run": True}})["next"]       # doctest: +SKIP
    'gc'
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any, cast

from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.control_store import Op, plain
from lightmetrics.protocol.executions import Executions
from lightmetrics.protocol.own_writes import put_own
from lightmetrics.reaps.dry_run import would_settle
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.gc_marks import MarksItem
from lightmetrics.reaps.gc_tasks import GcTasks
from lightmetrics.reaps.mark_settle import CandidatePage
from lightmetrics.reaps.params import (
    CHECKPOINT_PK,
    CHECKPOINT_SK,
    LATEST_AUDIT,
    ReapParams,
    check_resume,
    latest_audit_run,
    source_cursor_sk,
)
from lightmetrics.reaps.reap_job import CP_CONTINUATION_BEGUN, CP_CONTINUED, NS, ReapJob, log
from lightmetrics.reaps.report import report_of, retention_outcome
from lightmetrics.reaps.retention import expired_hours
from lightmetrics.reaps.retention_ranges import RangeTask
from lightmetrics.reaps.retention_tasks import RetentionTasks
from lightmetrics.reaps.state import CheckpointChange, ReapCheckpoint, ReapPhase, ReapRun
from lightmetrics.work import crashpoints
from lightmetrics.work.leases import LeaseItem, LeaseLost
from lightmetrics.work.units import WorkContext


class Reaper:
    """The reap's Lambda tasks over a :class:`WorkContext` (one method per task): ``begin``, ``gc``
    (:class:`GcTasks`), ``retention`` (:class:`RetentionTasks`), ``cont`` and ``end`` — composed of
    the reap's :class:`ReapJob` (its job kernel: the lease, owned writes, continuations) and the two
    roles' tasks."""

    def __init__(self, ctx: WorkContext, settings: Any, *, executions: Executions | None = None) -> None:
        self.job = ReapJob(ctx, settings)
        self.kernel, self.ctx, self.settings, self.table = self.job.kernel, ctx, settings, ctx.table
        self.executions = executions  # the continue task's: it starts the next execution
        self.retention_tasks = RetentionTasks(self.job)
        self.gc_tasks = GcTasks(self.job, candidates=lambda cp: self.candidates(cp))

    def now(self) -> int:
        return self.job.now()

    def lease(self) -> LeaseItem | None:
        """The reap lease's item, or None if no reap ever took it."""
        return self.kernel.lease()

    def marks_items(self) -> list[MarksItem]:
        """The recorded pages' ``marks#`` items, their marks decoded."""
        return self.job.marks_items()

    # -- gc: GC's pages, a retention hour's blobs, or a key range's (reap.retention_ranges) --------
    def gc(self, event: dict[str, Any]) -> dict[str, Any]:
        if "range" in event:  # an iteration of the Ranges Map: one key range's blobs
            return RangeTask(self.job, event).gc()
        return self.job.counted(self.gc_tasks.gc_page(event))

    def retention(self, event: dict[str, Any]) -> dict[str, Any]:
        return self.retention_tasks.retention(event)

    def candidates(self, cp: ReapCheckpoint) -> CandidatePage:
        """A page's candidates: a retention hour's blobs in phase ``blobs``, else GC's source's."""
        if cp.phase is ReapPhase.BLOBS:
            return self.retention_tasks.hour_blobs(cp)
        return self.gc_tasks.source_page(cp)

    # -- begin -----------------------------------------------------------------------------------
    def begin(self, event: dict[str, Any]) -> dict[str, Any]:
        inp = event.get("input") or {}
        if isinstance(inp, dict) and "continuation" in inp:
            return self._begin_continuation(inp["continuation"], event.get("execution_arn", ""))
        params = ReapParams.parse(inp)
        now = self.job.now()
        lease = self.kernel.lease()
        self.kernel.refuse_if_held(lease, now)
        stored = self.table.get(CHECKPOINT_PK, CHECKPOINT_SK)
        cp = ReapCheckpoint.of(plain(stored)) if stored else None
        hours = self._retention_hours(params, now) if not params.resume and params.mode == "retention" else []
        if params.resume:
            check_resume(params, cp)
            assert cp is not None
            epoch = cp.epoch
        else:
            epoch = (0 if lease is None else lease.epoch) + 1
        owner = uuid.uuid4().hex
        execution = event.get("execution_arn", "")
        self.kernel.take(lease, owner=owner, lease_seconds=params.lease_seconds, now_ns=now, epoch=epoch,
                         scope=params.mode, execution=execution)
        reap: ReapRun = {"epoch": epoch, "owner": owner, "mode": params.mode, "dry_run": params.dry_run,
                "lease_seconds": params.lease_seconds, "max_tasks": params.max_tasks_per_execution, "tasks": 0,
                "executions": 1, "state_machine_arn": event.get("state_machine_arn", "")}
        if params.resume:
            assert cp is not None
            self.table.update(CHECKPOINT_PK, CHECKPOINT_SK,
                              "SET #own = :own, #st = :run, #x = :x, #os = :now REMOVE #err",
                              names={"#own": "owner", "#st": "status", "#x": "execution", "#err": "error", "#ep": "epoch",
                                     "#os": "owned_since_ns"},
                              values={":own": owner, ":run": JobStatus.RUNNING.value, ":x": execution, ":ep": epoch, ":now": now},
                              condition="#ep = :ep")
            reap["executions"] = cp.executions  # mode and dry_run: check_resume
            return self.job.route(reap, ReapCheckpoint.of(plain(self.table.get(CHECKPOINT_PK, CHECKPOINT_SK))))
        if cp and cp.status == JobStatus.RUNNING:  # a retention run that stopped without End: say so (R9)
            stopped = retention_outcome(cp.with_changes(CheckpointChange(status=JobStatus.STOPPED,
                                                                         error="stopped without finishing")),
                                        CHECKPOINT_PK)
            if stopped:
                self.table.put(stopped)
        fresh = self._new_checkpoint(params, inp, epoch=epoch, owner=owner, execution=execution, now=now, hours=hours)
        put_own(self.table, fresh.to_item(), condition="attribute_not_exists(pk) OR epoch < :e",
                values_for_condition={":e": epoch})
        log.info("reap %s epoch %d begins (dry_run=%s)", params.mode, epoch, params.dry_run)
        return self.job.route(reap, fresh)

    def _retention_hours(self, params: ReapParams, now: int) -> list[str]:
        """The hours a retention reap deletes: the one asked for (refused unless expired), or every
        expired hour of its scope."""
        rollup = params.scope == "rollup"
        retention_s = int(self.settings.rollup_retention_s if rollup else self.settings.retention_s)
        if params.hour is None:
            return [str(h) for h in expired_hours(self.ctx, retention_s=retention_s, now_ns=now, scope=params.scope)]
        if params.hour.end_ns > now - retention_s * NS:
            raise InvalidReapInput(f"{params.hour} is not older than "
                                   f"{'LM_ROLLUP_RETENTION_S' if rollup else 'LM_RETENTION_S'} ({retention_s} s)")
        return [str(params.hour)]

    def _new_checkpoint(self, params: ReapParams, inp: dict[str, Any], *, epoch: int, owner: str, execution: str,
                        now: int, hours: list[str]) -> ReapCheckpoint:
        """A new reap's checkpoint: where GC starts (rules G-B1, G-B3) or the hours retention reaps."""
        cp = ReapCheckpoint(
            epoch=epoch, owner=owner, mode=params.mode, dry_run=params.dry_run, status=JobStatus.RUNNING.value,
            phase=ReapPhase.MARK if params.mode == "gc" else ReapPhase.COMMIT, started_at_ns=now, updated_at_ns=now,
            owned_since_ns=now, execution=execution, params={k: v for k, v in inp.items() if k != "resume"},
            scope=params.scope, source=params.source, audit_run=params.audit_run,
            hour=str(params.hour) if params.hour else None, page_size=params.page_size,
            concurrency=params.concurrency, max_pending_pages=params.max_pending_pages,
            tombstone_wait_s=params.tombstone_wait_s, verify_passes=params.verify_passes, hours=hours,
            max_pages=params.max_pages, range_parallelism=params.range_parallelism,
            extra={"pk": CHECKPOINT_PK, "sk": CHECKPOINT_SK})
        if params.mode == "gc" and params.source == "audit" and params.audit_run == LATEST_AUDIT:
            # Rule G-B3: the newest committed audit run, each run's candidates proven once.
            run = latest_audit_run(self.ctx.store, self.job.codec)
            cp = replace(cp, audit_run=run)
            if run is None:
                cp = replace(cp, phase=ReapPhase.DONE, note="no committed audit run yet: nothing to prove")
            elif (self.table.get(CHECKPOINT_PK, source_cursor_sk("audit", run)) or {}).get("ended"):
                cp = replace(cp, phase=ReapPhase.DONE, note=f"audit run {run}: every candidate already proven")
            if cp.phase is ReapPhase.DONE:
                cp = cp.with_changes(self.job.finishing(params.dry_run))  # a failed reap's marks: settled now (G-I8)
        if params.dry_run:  # rule DR1: marks a failed reap left are reported, never settled by a dry run
            cp = replace(cp, counters={"c_would_settle": would_settle(self.job.marks_items())})
        if params.mode == "gc" and cp.phase is not ReapPhase.DONE \
                and not (params.source == "by-time" and params.hour is not None):
            # Rule G-B1: GC goes on from where the last run of this source stopped.
            sk = source_cursor_sk(params.source, cp.audit_run)
            saved = self.table.get(CHECKPOINT_PK, sk) or {}
            through = saved.get("through")
            cp = replace(cp, source_cursor=sk, after=str(saved.get("after") or ""),
                         through=None if through is None else str(through))
        return cp

    CARRIED = ("epoch", "owner", "mode", "dry_run", "lease_seconds", "max_tasks", "executions", "state_machine_arn")

    def _begin_continuation(self, cont: Any, execution: str) -> dict[str, Any]:
        """The next execution of a running reap (rule G-B2): the same lease, epoch and owner; the
        lease is renewed and the checkpoint names this execution, in one owned transaction."""
        if not isinstance(cont, dict) or any(k not in cont for k in self.CARRIED):
            raise InvalidReapInput(f"continuation must carry {list(self.CARRIED)}")
        reap = cast(ReapRun, {k: cont[k] for k in self.CARRIED})
        reap["tasks"], reap["executions"] = 0, int(cont["executions"]) + 1
        self.job.commit(reap, CheckpointChange(execution=execution, executions=reap["executions"]))
        crashpoints.point(CP_CONTINUATION_BEGUN)
        log.info("reap %s epoch %s continues in execution %d", reap["mode"], reap["epoch"], reap["executions"])
        return self.job.route(reap, self.job.summary(reap))

    def continuation(self, reap: ReapRun) -> dict[str, Any]:
        """The input of the next execution: ``{"continuation": ...}``."""
        carried = dict(reap)
        return {"continuation": {k: carried[k] for k in self.CARRIED}}

    def cont(self, event: dict[str, Any]) -> dict[str, Any]:
        """The ``Continue`` task: start the next execution, record it in the checkpoint; this
        execution then ends (``Continued``) without releasing the lease."""
        reap = event["reap"]
        # LeaseLost: a run that lost the reap starts nothing
        arn = self.kernel.continue_in(self.executions, reap, self.continuation(reap)["continuation"],
                                      before=lambda: self.job.summary(reap))
        self.job.commit(reap, CheckpointChange(next_execution=arn))
        crashpoints.point(CP_CONTINUED)
        return {"next_execution": arn}

    # -- end ---------------------------------------------------------------------------------------
    def end(self, event: dict[str, Any]) -> dict[str, Any]:
        reap, outcome = event["reap"], event.get("outcome", "failed")
        try:
            cp = self.job.summary(reap)
        except LeaseLost:
            return {"status": "lease-lost", "epoch": reap.get("epoch")}
        now = self.job.now()
        finished = outcome == "finished"
        change = CheckpointChange(status=JobStatus.FINISHED if finished else JobStatus.FAILED, finished_at_ns=now,
                                  error=None if finished else json.dumps(event.get("error"), sort_keys=True,
                                                                         default=str)[:2000])
        ended = cp.with_changes(change)
        # A retention run's outcome, kept where GC's next checkpoint does not replace it (R9).
        last = retention_outcome(ended, CHECKPOINT_PK)
        self.job.commit(reap, change, lease=self.kernel.release(reap, now),
                        ops=[Op("Put", CHECKPOINT_PK, last["sk"], item=last)] if last else [])
        report = report_of(ended)
        for name, value in (("purged", report.purged), ("restored", report.restored), ("marked", report.marked)):
            if value:
                self.ctx.metrics.add_metric(name=f"Reap{name.capitalize()}", unit="Count", value=value)
        log.info("reap %s epoch %s %s: %s", reap["mode"], reap["epoch"], ended.status, report.to_json())
        return report.to_json()  # the execution's output


__all__ = ["Reaper"]
