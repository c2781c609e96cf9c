"""The operator side of reaps: start, status, follow (``lmctl reap``, the demo; never inside a task).

Example (what ``lmctl reap gc --execute --wait`` does)::

    >>> control = ReapControl(ctx, executions, state_machine_arn)            # doctest: +SKIP
    >>> control.follow(control.start(mode="gc", dry_run=False)).report       # doctest: +SKIP
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightmetrics.jobs.control import JobControl, Observed
from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.control_store import ControlStore, plain
from lightmetrics.protocol.executions import ExecutionDescription, Executions
from lightmetrics.protocol.keys import KeyKind
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.params import CHECKPOINT_PK, CHECKPOINT_SK, ReapParams, check_resume
from lightmetrics.reaps.report import ReapReport, report_of
from lightmetrics.reaps.state import ReapCheckpoint
from lightmetrics.work import leases
from lightmetrics.work.leases import LeaseHeld, LeaseItem
from lightmetrics.work.units import WorkContext


@dataclass
class Followed:
    status: str  # finished | failed
    report: ReapReport | None  # None: no reap checkpoint to report on
    execution_arn: str
    detail: str = ""


class ReapControl:
    """Start and watch reaps through Step Functions (the CLI and the demo), on the job's
    :class:`~lightmetrics.jobs.control.JobControl`."""

    def __init__(self, ctx: WorkContext, executions: Executions, state_machine_arn: str, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.ctx, self.executions, self.arn, self.sleep = ctx, executions, state_machine_arn, sleep
        self.table: ControlStore = ctx.table
        self.job = JobControl(ctx, executions, state_machine_arn, "reap", sleep=sleep)

    def lease_live(self) -> LeaseItem | None:
        return self.job.lease_live()

    def summary(self) -> ReapCheckpoint | None:
        """The reap's checkpoint summary, or None if no reap ever ran."""
        item = self.table.get(CHECKPOINT_PK, CHECKPOINT_SK)
        return ReapCheckpoint.of(plain(item)) if item else None

    def checkpoint(self) -> ReapReport | None:
        """The report of the reap's checkpoint summary, or None if no reap ever ran."""
        cp = self.summary()
        return report_of(cp) if cp else None

    def start(self, *, timeout_s: float = 60.0, **inp: Any) -> str:
        """Start an execution with ``inp`` (mode, dry_run, ...) and wait until it holds the lease;
        :class:`~lightmetrics.protocol.errors.ResourceAccessError` if the bucket is not there."""
        # A reap proves from reads whose 404 means "gone": against a bucket that is not there it
        # must not start at all. GC lists the raw blobs, retention the hour's accepted-by-time.
        self.ctx.store.require_bucket(self.ctx.codec.root(
            KeyKind.RAW_BLOB if inp.get("mode") == "gc" else KeyKind.ACCEPTED_BY_TIME))
        live = self.lease_live()
        if live:
            raise LeaseHeld(leases.describe(live, self.ctx.clock.now_ns(), "reap"))
        inp = {k: v for k, v in inp.items() if v is not None}
        params = ReapParams.parse(inp)
        if params.resume:  # refused here, before an execution starts, as Begin would refuse it
            check_resume(params, self.summary())
        name = f"reap-{inp['mode']}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        arn, _ = self.job.start_execution(name, inp, refused=self._refused, timeout_s=timeout_s, lease_name="reap lease")
        return arn

    @staticmethod
    def _refused(d: ExecutionDescription, kind: str, message: str) -> Exception:
        """Why the reap did not start: the Begin task's own message (e.g. "hour ... is not older than
        LM_RETENTION_S")."""
        return InvalidReapInput(f"the reap did not start ({d.status} {kind or d.error}): {message or d.cause}")

    def follow(self, arn: str, *, poll_s: float = 0.25, timeout_s: float | None = None,
               on_progress: Callable[[ReapReport], None] | None = None) -> Followed:
        """Wait for the reap started as ``arn`` to end, through every execution it continued into
        (:meth:`~lightmetrics.jobs.control.JobControl.follow`); ``on_progress`` gets the checkpoint's
        report whenever it changed (read at most every 2 s)."""
        run = self.job.follow(arn, progress=self._progress, on_progress=on_progress, poll_s=poll_s,
                              timeout_s=timeout_s, progress_every_s=2.0)
        return Followed(run.status, run.report, run.executions[-1], run.detail)

    def _progress(self) -> Observed[ReapReport]:
        """The reap's checkpoint summary (one GetItem): its report, status and the execution its
        Continue started."""
        cp = self.summary()
        if cp is None:
            return Observed[ReapReport]()
        return Observed(report_of(cp), JobStatus(cp.status) if cp.status else None, cp.next_execution, cp.error or "")


__all__ = ["Followed", "ReapControl"]
