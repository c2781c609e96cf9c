"""The operator's side of a job (:class:`JobControl`): start an execution of its state machine and
wait until it holds the job's lease, or say why it did not start; whether the lease is live; follow
a run across the executions it continues in until it ends (:meth:`JobControl.follow`). The walk's
and the reap's controls (``lmctl walk``, ``lmctl reap``, the demo) are built on it and keep only
what differs: which checkpoint they read as progress, and how a refusal is worded. Never used
inside a task.

Example::

    >>> control = JobControl(ctx, executions, state_machine_arn, "reap")       # doctest: +SKIP
    >>> control.start_execution("reap-gc-1", {"mode": "gc", "dry_run": True}, refused=ValueError)  # doctest: +SKIP
    ('arn:aws:states:...:execution:Reap:reap-gc-1', {...})
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lightmetrics.jobs.kernel import JobKernel, JobStatus
from lightmetrics.protocol.executions import ExecutionDescription, Executions, task_error
from lightmetrics.work.leases import LeaseHeld, LeaseItem
from lightmetrics.work.units import WorkContext

#: ``(the execution's description, the Begin task's error kind, its message) -> the error to raise``
Refusal = Callable[[ExecutionDescription, str, str], Exception]
#: How long a run whose execution ended while its checkpoint still says running may take to record
#: the execution it continued in (its next Begin does so within moments).
HANDOVER_S = 60.0
#: a job's report of its checkpoint (the walk's summary, the reap's report)
R = TypeVar("R")


@dataclass(frozen=True)
class Observed(Generic[R]):
    """One read of a followed run's checkpoint, as the job's control reads it.

    >>> Observed({"epoch": 3}, JobStatus.RUNNING, successor="arn:...:execution:walk:w-0002").status
    <JobStatus.RUNNING: 'running'>
    """

    #: what the operator is shown (``on_progress``) and given at the end (None before a checkpoint)
    report: R | None = None
    #: the recorded status (None before the run wrote its checkpoint)
    status: JobStatus | None = None
    #: the execution the checkpoint names as the run's latest (a continuation's, once it started)
    successor: str | None = None
    #: the error a failed run recorded
    error: str = ""
    #: why the checkpoint is no longer this run's ("" while it is)
    replaced: str = ""


@dataclass
class FollowedRun(Generic[R]):
    """How a followed run ended: ``finished`` or ``failed``, its last report, the executions it ran in
    (first to last) and, when it failed, why."""

    status: str
    report: R | None
    executions: list[str]
    detail: str = ""


class JobControl:
    """Start and watch one job's executions through Step Functions."""

    def __init__(self, ctx: WorkContext, executions: Executions, state_machine_arn: str, name: str, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.ctx, self.executions, self.arn, self.sleep = ctx, executions, state_machine_arn, sleep
        self.kernel = JobKernel(ctx.table, name, ctx.clock)

    def lease(self) -> LeaseItem | None:
        return self.kernel.lease()

    def lease_live(self) -> LeaseItem | None:
        lease = self.lease()
        return lease if lease is not None and lease.is_live(self.ctx.clock.now_ns()) else None

    def history(self, arn: str) -> list[dict[str, Any]]:
        return self.executions.history(arn)

    def start_execution(self, name: str, inp: dict[str, Any], *, refused: Refusal, timeout_s: float = 60.0,
                        lease_name: str = "") -> tuple[str, LeaseItem]:
        """Start an execution ``name`` with ``inp`` and wait until it holds the lease: ``(its ARN, the
        lease)``. An execution that ended first was refused: :class:`LeaseHeld` if another run held
        the lease, else ``refused(description, kind, message)`` with the Begin task's own error (its
        message says what was wrong; the execution's cause is the catching state's, which says less)."""
        arn = self.executions.start(self.arn, name, inp)
        deadline = time.monotonic() + timeout_s
        while True:
            lease = self.lease()
            if lease is not None and lease.execution == arn:
                return arn, lease
            d = self.executions.describe(arn)
            if not d.running:
                if d.error == "LeaseHeld":
                    raise LeaseHeld(f"refused: {d.cause}")
                kind, message = task_error(self.history(arn))
                raise refused(d, kind, message)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{arn} did not take the {lease_name or 'lease'} within {timeout_s} s")
            self.sleep(0.1)

    def follow(self, arn: str, *, progress: Callable[[], Observed[R]], on_progress: Callable[[R], None] | None = None,
               poll_s: float = 0.5, timeout_s: float | None = None, progress_every_s: float = 0.0) -> FollowedRun[R]:
        """Wait for the run started as ``arn`` to end, through every execution it continues in. The
        executions say when it ended; ``progress()`` reads its checkpoint (at most every
        ``progress_every_s``, and once more when an execution ended): its report, handed to
        ``on_progress`` whenever it changed, its status and its successor. It finished if its last
        execution succeeded and its checkpoint says finished."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        executions, observed, shown = [arn], Observed[R](), None
        next_read, ended_at = 0.0, None
        while True:
            if time.monotonic() >= next_read:
                next_read, observed = time.monotonic() + progress_every_s, progress()
                if on_progress is not None and observed.report is not None and observed.report != shown:
                    shown = observed.report
                    on_progress(observed.report)
            if observed.replaced:
                return FollowedRun("failed", observed.report, executions, observed.replaced)
            current = executions[-1]
            d = self.executions.describe(current)
            if not d.running:
                observed = progress()  # what its last task recorded
                if d.status == "SUCCEEDED" and observed.status == JobStatus.RUNNING:
                    if observed.successor not in (None, current):  # it continued in a new execution
                        executions.append(str(observed.successor))
                        ended_at = None
                        continue
                    ended_at = ended_at or time.monotonic()
                    if time.monotonic() - ended_at > HANDOVER_S:
                        return FollowedRun("failed", observed.report, executions, f"{current} ended without a successor")
                else:
                    ok = d.status == "SUCCEEDED" and observed.status == JobStatus.FINISHED
                    recorded = observed.error if observed.status == JobStatus.FAILED else ""
                    detail = "" if ok else recorded or f"execution {current} {d.status} {d.error} {d.cause}".strip()
                    return FollowedRun("finished" if ok else "failed", observed.report, executions, detail)
            if deadline is not None and time.monotonic() > deadline:
                return FollowedRun("failed", observed.report, executions, f"timed out following the {self.kernel.name}")
            self.sleep(poll_s)


__all__ = ["HANDOVER_S", "FollowedRun", "JobControl", "Observed", "Refusal"]
