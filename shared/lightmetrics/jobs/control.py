"""The operator's side of a job (:class:`JobControl`): start an execution of its state machine and
wait until it holds the job's lease, or say why it did not start; whether the lease is live. The
walk's and the reap's controls (``lmctl walk``, ``lmctl reap``, the demo) are built on it; never
used inside a task.

Example::

    >>> control = JobControl(ctx, sfn_client, state_machine_arn, "reap")       # doctest: +SKIP
    >>> control.start_execution("reap-gc-1", {"mode": "gc", "dry_run": True}, refused=ValueError)  # doctest: +SKIP
    ('arn:aws:states:...:execution:Reap:reap-gc-1', {...})
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from lightmetrics.aws.step_functions import execution_history
from lightmetrics.jobs.kernel import JobKernel
from lightmetrics.protocol.executions import task_error
from lightmetrics.work.leases import LeaseHeld, LeaseItem
from lightmetrics.work.units import WorkContext

#: ``(the execution's description, the Begin task's error kind, its message) -> the error to raise``
Refusal = Callable[[dict[str, Any], str, str], Exception]


class JobControl:
    """Start and watch one job's executions through Step Functions."""

    def __init__(self, ctx: WorkContext, sfn_client: Any, state_machine_arn: str, name: str, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.ctx, self.sfn, self.arn, self.sleep = ctx, sfn_client, state_machine_arn, sleep
        self.kernel = JobKernel(ctx.table, name, ctx.clock)

    def lease(self) -> LeaseItem | None:
        return self.kernel.lease()

    def lease_live(self) -> LeaseItem | None:
        lease = self.lease()
        return lease if lease is not None and lease.is_live(self.ctx.clock.now_ns()) else None

    def history(self, arn: str) -> list[dict[str, Any]]:
        return execution_history(self.sfn, arn)

    def start_execution(self, name: str, inp: dict[str, Any], *, refused: Refusal, timeout_s: float = 60.0,
                        lease_name: str = "") -> tuple[str, LeaseItem]:
        """Start an execution ``name`` with ``inp`` and wait until it holds the lease: ``(its ARN, the
        lease)``. An execution that ended first was refused: :class:`LeaseHeld` if another run held
        the lease, else ``refused(description, kind, message)`` with the Begin task's own error (its
        message says what was wrong; the execution's cause is the catching state's, which says less)."""
        arn: str = self.sfn.start_execution(stateMachineArn=self.arn, name=name,
                                            input=json.dumps(inp, sort_keys=True))["executionArn"]
        deadline = time.monotonic() + timeout_s
        while True:
            lease = self.lease()
            if lease is not None and lease.execution == arn:
                return arn, lease
            d = self.sfn.describe_execution(executionArn=arn)
            if d["status"] != "RUNNING":
                if d.get("error") == "LeaseHeld":
                    raise LeaseHeld(f"refused: {d.get('cause', '')}")
                kind, message = task_error(self.history(arn))
                raise refused(d, kind, message)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{arn} did not take the {lease_name or 'lease'} within {timeout_s} s")
            self.sleep(0.1)


__all__ = ["JobControl", "Refusal"]
