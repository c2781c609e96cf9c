"""The operator side of reaps: start, status, follow (``lmctl reap``, the demo; never inside a task).

Example (what ``lmctl reap gc --execute --wait`` does)::

    >>> control = ReapControl(ctx, sfn_client, state_machine_arn)            # doctest: +SKIP
    >>> control.follow(control.start(mode="gc", dry_run=False)).report       # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightmetrics.aws.step_functions import execution_history
from lightmetrics.protocol.control_store import ControlStore, plain
from lightmetrics.protocol.executions import task_error
from lightmetrics.protocol.keys import KeyKind
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.params import CHECKPOINT_PK, CHECKPOINT_SK, ReapParams, check_resume, read_lease
from lightmetrics.reaps.report import report_of
from lightmetrics.work import leases
from lightmetrics.work.leases import LeaseHeld
from lightmetrics.work.units import WorkContext


@dataclass
class Followed:
    status: str  # finished | failed
    report: dict[str, Any]
    execution_arn: str
    detail: str = ""


class ReapControl:
    """Start and watch reaps through Step Functions (the CLI and the demo)."""

    def __init__(self, ctx: WorkContext, sfn_client: Any, state_machine_arn: str, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.ctx, self.sfn, self.arn, self.sleep = ctx, sfn_client, state_machine_arn, sleep
        self.table: ControlStore = ctx.table

    def lease_live(self) -> dict[str, Any] | None:
        lease = read_lease(self.table)
        return lease if lease and int(lease.get("expires_at_ns", 0)) > self.ctx.clock.now_ns() else None

    def checkpoint(self) -> dict[str, Any] | None:
        item = self.table.get(CHECKPOINT_PK, CHECKPOINT_SK)
        return report_of(item) if item else None

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
            check_resume(params, self.table.get(CHECKPOINT_PK, CHECKPOINT_SK))
        name = f"reap-{inp['mode']}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        arn: str = self.sfn.start_execution(stateMachineArn=self.arn, name=name,
                                            input=json.dumps(inp, sort_keys=True))["executionArn"]
        deadline = time.monotonic() + timeout_s
        while True:
            lease = read_lease(self.table)
            if lease and lease.get("execution") == arn:
                return arn
            d = self.sfn.describe_execution(executionArn=arn)
            if d["status"] != "RUNNING":
                if d.get("error") == "LeaseHeld":
                    raise LeaseHeld(f"refused: {d.get('cause', '')}")
                # The Begin task's own message says what was wrong (e.g. "hour ... is not older than
                # LM_RETENTION_S"); the execution's cause is the catching state's, which says less.
                kind, message = task_error(execution_history(self.sfn, arn))
                raise InvalidReapInput(f"the reap did not start ({d['status']} {kind or d.get('error', '')}): "
                                       f"{message or d.get('cause', '')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{arn} did not take the reap lease within {timeout_s} s")
            self.sleep(0.1)

    def follow(self, arn: str, *, poll_s: float = 0.25, timeout_s: float | None = None,
               on_progress: Callable[[dict[str, Any]], None] | None = None) -> Followed:
        """Wait for the reap started as ``arn`` to end, through every execution it continued into;
        ``on_progress`` gets the checkpoint's report whenever it changed (read at most every 2 s)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_report: dict[str, Any] | None = None
        next_read = 0.0
        while True:
            if on_progress is not None and time.monotonic() >= next_read:
                next_read = time.monotonic() + 2.0
                current = self.checkpoint()
                if current is not None and current != last_report:
                    last_report = current
                    on_progress(current)
            d = self.sfn.describe_execution(executionArn=arn)
            if d["status"] == "SUCCEEDED":
                item = plain(self.table.get(CHECKPOINT_PK, CHECKPOINT_SK) or {})
                if item.get("status") == "running" and item.get("next_execution") not in (None, arn):
                    arn = str(item["next_execution"])  # it handed over to the next execution (Continue)
                    continue
            if d["status"] != "RUNNING":
                report = self.checkpoint() or {}
                ok = d["status"] == "SUCCEEDED" and report.get("status") == "finished"
                return Followed("finished" if ok else "failed", report, arn,
                                "" if ok else f"{d['status']} {d.get('error', '')} {d.get('cause', '')}".strip())
            if deadline is not None and time.monotonic() > deadline:
                return Followed("failed", self.checkpoint() or {}, arn, "timed out following the reap")
            self.sleep(poll_s)


__all__ = ["Followed", "ReapControl"]
