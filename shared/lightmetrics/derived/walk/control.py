"""The operator side of walks: start, status, follow (``lmctl walk``, the demo; never inside a task).

Example (what ``lmctl walk start --wait`` does)::

    >>> control = WalkControl(ctx, executions, state_machine_arn)              # doctest: +SKIP
    >>> started = control.start(page_size=500)                                 # doctest: +SKIP
    >>> control.follow(started).status                                         # doctest: +SKIP
    'finished'
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightmetrics.derived.walk.errors import InvalidWalkInput, NothingToResume, NothingToWalk
from lightmetrics.derived.walk.params import WalkParams
from lightmetrics.derived.walk.state import WalkSummary, checkpoint_pk, describe_lease, read_walk, summarize
from lightmetrics.jobs.control import JobControl, Observed
from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.control_store import ControlStore
from lightmetrics.protocol.executions import ExecutionDescription, Executions
from lightmetrics.protocol.identity import id_to_hex
from lightmetrics.work.leases import LeaseHeld, LeaseItem
from lightmetrics.work.units import WorkContext


@dataclass
class Started:
    execution_arn: str
    epoch: int
    checkpoint_pk: str
    scope: str


@dataclass
class Followed:
    """How a followed walk ended: ``finished`` or ``failed``, its last summary (None: its checkpoint
    was never read), the executions it ran in, and why it failed."""

    status: str  # finished | failed
    summary: WalkSummary | None
    executions: list[str]
    detail: str = ""

    def summary_json(self) -> dict[str, Any]:
        """The summary as the CLI prints it (``{}`` if there is none)."""
        return {} if self.summary is None else self.summary.to_json()


class WalkControl:
    """Start and watch walks through Step Functions (the CLI and the demo; never inside a task), on the
    job's :class:`~lightmetrics.jobs.control.JobControl`."""

    def __init__(self, ctx: WorkContext, executions: Executions, state_machine_arn: str, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.ctx, self.executions, self.state_machine_arn = ctx, executions, state_machine_arn
        self.table: ControlStore = ctx.table
        self.sleep = sleep
        self.job = JobControl(ctx, executions, state_machine_arn, "walk", sleep=sleep)

    def lease(self) -> LeaseItem | None:
        return self.job.lease()

    def lease_live(self) -> LeaseItem | None:
        return self.job.lease_live()

    def checkpoint(self, agent: str | None = None) -> WalkSummary | None:
        """The walk summary of a scope, totals including the partitions in progress (None: never ran)."""
        cp, parts = read_walk(self.table, checkpoint_pk(None if agent is None else id_to_hex(agent)))
        if cp is None:
            return None
        return summarize(cp, parts, self.ctx.clock.now_ns())

    def start(self, *, agent: str | None = None, resume: bool = False, full: bool = False, page_size: int | None = None,
              parallelism: int | None = None, max_rounds: int | None = None, lease_seconds: int | None = None,
              timeout_s: float = 120.0) -> Started:
        """Start an execution and wait until it holds the lease; :class:`LeaseHeld` if refused,
        :class:`~lightmetrics.protocol.errors.ResourceAccessError` if the bucket is not there."""
        # The walk lists the acceptance records in Step Functions; a bucket that is not there must
        # stop the start here, not become a walk that finds nothing and sets the watermark.
        self.ctx.store.require_bucket(self.ctx.codec.accepted_root())
        live = self.lease_live()
        if live:
            raise LeaseHeld(self._held(live))
        inp: dict[str, Any] = {"agent": agent, "resume": resume}
        if full:
            inp["full"] = True
        for k, v in (("page_size", page_size), ("parallelism", parallelism),
                     ("max_rounds_per_execution", max_rounds), ("lease_seconds", lease_seconds)):
            if v is not None:
                inp[k] = v
        params = WalkParams.parse(inp)  # refuse bad input before starting anything
        if params.agent_hex is not None and not resume:
            prefixes = [self.ctx.codec.agent_prefix(root, params.agent_hex) for root in (self.ctx.codec.accepted_root(),
                                                                        self.ctx.codec.quarantine_root())]
            if not any(self.ctx.store.list_page(p, max_keys=1).keys for p in prefixes):
                raise NothingToWalk(f"agent {params.agent!r} has no acceptance records and no conflict evidence "
                                    f"(nothing under {' or '.join(prefixes)}): nothing to walk")
        if resume:
            cp = self.checkpoint(agent)
            if cp is None or cp.status is JobStatus.FINISHED:
                raise NothingToResume(f"no unfinished walk to resume for {checkpoint_pk(params.agent_hex)} "
                                      f"(last status: {cp.status if cp else 'never ran'})")
        name = f"lmctl-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        arn, lease = self.job.start_execution(name, inp, refused=self._refused, timeout_s=timeout_s)
        return Started(arn, lease.epoch, str(lease.checkpoint_pk), "all" if lease.scope is None else lease.scope)

    @staticmethod
    def _refused(d: ExecutionDescription, kind: str, detail: str) -> Exception:
        """Why the walk did not start, from the Begin task's own error (type, message)."""
        if kind == "NothingToResume":
            return NothingToResume(detail)
        return InvalidWalkInput(f"the walk did not start ({d.status} {d.error}): {detail or d.cause}")

    def _held(self, lease: LeaseItem) -> str:
        """Why a start is refused. A lease whose execution has ended (its release was lost, or the
        execution was stopped) is still the lease until it expires: say so, and when."""
        from lightmetrics.protocol.clock import utc_text

        text = describe_lease(lease, self.ctx.clock.now_ns())
        execution = lease.execution
        if not execution:
            return text
        try:
            status = self.executions.describe(execution).status
        except Exception:  # noqa: BLE001 - the refusal stands; only its explanation is missing
            return text
        if status == "RUNNING":
            return text
        return (f"{text}: that execution has ended ({status}) without releasing the lease, which "
                f"expires at {utc_text(lease.expires_at_ns)}; `lmctl walk start` succeeds then "
                f"(add --resume to continue an unfinished walk)")

    def history(self, arn: str) -> list[dict[str, Any]]:
        return self.job.history(arn)

    def follow(self, started: Started, *, on_progress: Callable[[WalkSummary], None] | None = None,
               poll_s: float = 0.5, timeout_s: float | None = None) -> Followed:
        """Watch the walk of ``started`` across its executions until it finishes or fails
        (:meth:`~lightmetrics.jobs.control.JobControl.follow`), its summary read at every poll."""
        run = self.job.follow(started.execution_arn, progress=lambda: self._progress(started), on_progress=on_progress,
                              poll_s=poll_s, timeout_s=timeout_s)
        return Followed(run.status, run.report, run.executions, run.detail)

    def _progress(self, started: Started) -> Observed[WalkSummary]:
        """The walk's summary, totals including the partitions in progress (one Query); a newer
        epoch's checkpoint is no longer this walk's, and an older one is not yet: Begin takes the
        lease before it writes its epoch's checkpoint, so the previous walk's is read until then."""
        found, parts = read_walk(self.table, started.checkpoint_pk)
        epoch = -1 if found is None or found.epoch is None else found.epoch
        if found is None or epoch < started.epoch:
            return Observed[WalkSummary]()
        summary = summarize(found, parts, self.ctx.clock.now_ns())
        replaced = "" if epoch == started.epoch else "a newer walk replaced this epoch's checkpoint"
        return Observed(summary, found.status, found.execution, found.error or "", replaced)


__all__ = ["Followed", "Started", "WalkControl"]
