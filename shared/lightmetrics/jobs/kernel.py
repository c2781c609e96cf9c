"""The job kernel (:class:`JobKernel`): one job of Lambda tasks that runs alone under the lease
``lease#<name>`` and checkpoints in the control table (docs/protocol.md §13; docs/control-table.md).

A run is the state Step Functions carries from task to task (:data:`Run`: at least ``owner``,
``epoch``, ``lease_seconds``, ``executions``, ``state_machine_arn``). The kernel writes for it:

* **take** — refused while another run holds the lease (:class:`~lightmetrics.work.leases.LeaseHeld`);
* **owned writes** — every checkpoint write is conditional on the run's ``owner`` and ``epoch``
  (:meth:`JobKernel.owned_update`) and sent in one transaction with the lease's renewal
  (:meth:`JobKernel.commit`), so a run that lost the lease moves nothing (LeaseLost);
* **fence** — a renewal right before every destructive request (rule L2, :meth:`JobKernel.fence`);
* **continuation** — a run that nears Step Functions' history budget starts the next execution
  with the same lease, epoch and owner, under a deterministic name (a retried task finds the
  execution it already started: :meth:`JobKernel.continue_in`).

Example::

    >>> JobKernel(None, "walk", None).continuation_name({"epoch": 3, "owner": "0123456789ab", "executions": 1})
    'walk-e3-01234567-0002'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from lightmetrics.protocol.control_store import ConditionFailed, ControlStore, Op, TransactionCancelled
from lightmetrics.protocol.executions import Executions
from lightmetrics.work import leases
from lightmetrics.work.leases import OWNED, Fence, Holder, LeaseHeld, LeaseItem, LeaseLost

#: A run as Step Functions carries it between tasks (plain JSON values: the execution's state; the
#: walk's :class:`~lightmetrics.derived.walk.state.WalkRun`, the reap's :class:`~lightmetrics.reaps.state.ReapRun`).
Run = Mapping[str, Any]


class JobStatus(StrEnum):
    """A job's status in its checkpoint summary (stored as its string)."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"  # a retention run that stopped without its End task (R9)


@dataclass(frozen=True)
class JobKernel:
    """The lease, owned writes and continuations of the job ``name`` (``walk``, ``reap``)."""

    table: ControlStore
    name: str
    clock: Any

    @property
    def lease_pk(self) -> str:
        return leases.lease_pk(self.name)

    # -- the lease --------------------------------------------------------------------------------
    def lease(self) -> LeaseItem | None:
        """The lease's item, or None if no run ever took it."""
        return leases.read(self.table, self.lease_pk)

    def describe(self, lease: LeaseItem, now_ns: int) -> str:
        return leases.describe(lease, now_ns, self.name)

    def refuse_if_held(self, lease: LeaseItem | None, now_ns: int) -> None:
        if lease is not None and lease.is_live(now_ns):
            raise LeaseHeld(self.describe(lease, now_ns))

    def take(self, lease: LeaseItem | None, *, owner: str, lease_seconds: int, now_ns: int,
             epoch: int | None = None, **attributes: str) -> LeaseItem:
        """Take the lease read as ``lease`` for epoch ``epoch`` (by default one more than any before;
        :func:`~lightmetrics.work.leases.take`)."""
        return leases.take(self.table, self.lease_pk, lease, owner=owner, lease_seconds=lease_seconds, now_ns=now_ns,
                           what=self.name, epoch=epoch, **attributes)

    def renewal(self, run: Run, now_ns: int, **extra: Any) -> Op:
        return leases.renewal_of(self.lease_pk, Holder.of(run), now_ns, **extra)

    def release(self, run: Run, now_ns: int) -> Op:
        return leases.release(self.lease_pk, run["owner"], run["epoch"], now_ns)

    def fence(self, run: Run, kind: type[Fence] = Fence) -> Fence:
        """Rule L2: the run's fence, called right before every destructive request."""
        return kind(self.table, self.lease_pk, Holder.of(run), self.clock, LeaseLost)

    # -- owned writes -------------------------------------------------------------------------------
    @staticmethod
    def owned(run: Run) -> tuple[dict[str, str], dict[str, Any]]:
        """The names and values of :data:`~lightmetrics.work.leases.OWNED`, the condition of every owned write."""
        return {"#own": "owner", "#ep": "epoch"}, {":own": run["owner"], ":ep": run["epoch"]}

    def owned_update(self, run: Run, pk: str, sk: str, expression: str, names: dict[str, str],
                     values: dict[str, Any]) -> Op:
        """An update of ``pk``/``sk`` conditional on the run's owner and epoch."""
        own_names, own_values = self.owned(run)
        return Op("Update", pk, sk, expression, {**own_names, **names}, {**own_values, **values}, OWNED)

    def commit(self, run: Run, ops: list[Op], *, lost: str = "") -> None:
        """``ops`` in one transaction; a cancellation (the run lost its lease or its checkpoint) is
        :class:`~lightmetrics.work.leases.LeaseLost`."""
        try:
            self.table.transact(ops)
        except TransactionCancelled:
            raise LeaseLost(lost or f"{self.name} epoch {run['epoch']} lost the lease") from None

    # -- continuation (the history budget) --------------------------------------------------------------
    def continuation_name(self, run: Run) -> str:
        """The next execution's name: deterministic, so a retried task finds the one it started."""
        return f"{self.name}-e{run['epoch']}-{str(run['owner'])[:8]}-{int(run['executions']) + 1:04d}"

    def continue_in(self, executions: Executions | None, run: Run, carried: dict[str, Any], *,
                    before: Callable[[], object] = lambda: None) -> str:
        """Start the run's next execution with input ``{"continuation": carried}``; its ARN.
        ``before``: a check that raises if the run may not continue (it lost the job)."""
        if executions is None:
            raise RuntimeError(f"{self.name}-continue needs the executions port (Step Functions)")
        before()
        return executions.continue_as(str(run["state_machine_arn"]), self.continuation_name(run),
                                      {"continuation": carried})


@dataclass
class Lease:
    """A job's lease held by one process (the rollup, :mod:`lightmetrics_pipeline.rollup.lease`):
    :meth:`acquire`, :meth:`renew`, :meth:`release` by the kernel's rules, outside Step Functions.

    Example:
        >>> lease = Lease(table, "rollup", owner="run-1", clock=clock, duration_s=900)   # doctest: +SKIP
        >>> lease.acquire().epoch                                                         # doctest: +SKIP
        1
    """

    table: ControlStore
    name: str
    owner: str
    clock: Any
    duration_s: int = 900
    epoch: int = 0

    @property
    def kernel(self) -> JobKernel:
        return JobKernel(self.table, self.name, self.clock)

    @property
    def run(self) -> Run:
        return {"owner": self.owner, "epoch": self.epoch, "lease_seconds": self.duration_s}

    def current(self) -> LeaseItem | None:
        """The lease's item, or None."""
        return self.kernel.lease()

    def acquire(self) -> Lease:
        kernel = self.kernel
        item = kernel.take(kernel.lease(), owner=self.owner, lease_seconds=self.duration_s, now_ns=self.clock.now_ns())
        self.epoch = item.epoch
        return self

    def renew(self) -> None:
        try:
            self.kernel.renewal(self.run, self.clock.now_ns()).apply(self.table)
        except ConditionFailed:
            raise LeaseLost(f"owner {self.owner} lost the {self.name} lease (epoch {self.epoch})") from None

    def release(self) -> None:
        try:
            self.kernel.release(self.run, self.clock.now_ns()).apply(self.table)
        except ConditionFailed:
            pass  # somebody took it over after it expired: nothing of ours to release


__all__ = ["JobKernel", "JobStatus", "Lease", "Run"]
