"""What every reap task shares (:class:`ReapJob`), on the job kernel (the lease ``lease#reap``:
:class:`~lightmetrics.jobs.kernel.JobKernel`): the checkpoint summary, one owned transaction per write
(:meth:`ReapJob.commit`, which also renews the lease), routing to the next task, the task budget of
an execution, and fencing (docs/reaps.md; docs/protocol.md §13, L1-L3). The tasks are composed of
it: :mod:`lightmetrics.reaps.gc_tasks`, :mod:`lightmetrics.reaps.retention_tasks`, the key ranges'
:mod:`lightmetrics.reaps.retention_ranges`, and :class:`lightmetrics.reaps.steps.Reaper` (begin,
continue, end).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from lightmetrics.deployment.timeouts import longest_reap_task_s
from lightmetrics.jobs.kernel import JobKernel
from lightmetrics.protocol.control_store import ControlStore, Op, plain
from lightmetrics.reaps.dry_run import DryRunFence
from lightmetrics.reaps.gc_marks import MarksItem, any_marks_item, read_marks_items
from lightmetrics.reaps.mark_settle import writer_may_run_until
from lightmetrics.reaps.params import (
    CHECKPOINT_PK,
    CHECKPOINT_SK,
    map_visit_tasks,
    max_tasks_for,
)
from lightmetrics.reaps.state import CheckpointChange, ReapCheckpoint, ReapPhase, ReapRun
from lightmetrics.work import crashpoints
from lightmetrics.work.leases import OWNED, Fence, LeaseItem, LeaseLost
from lightmetrics.work.units import WorkContext

log = logging.getLogger(__name__)
NS = 1_000_000_000

#: The report lists at most this many blocked work keys (the blockers list has them all).
REPORT_BLOCKED_MAX = 100

CP_INTENT = crashpoints.register("reap.intent-recorded", "a page's intent recorded, no marker placed yet")
CP_PAGE_DONE = crashpoints.register("reap.page-recorded", "a page's marks and cursor recorded")
CP_SETTLE_RECORDED = crashpoints.register("reap.settle-recorded", "a settled page counted and its item deleted")
CP_STEP_DONE = crashpoints.register("reap.retention-step", "a retention step's checkpoint written")
CP_CONTINUED = crashpoints.register("reap.continued", "the next execution started and recorded, this one not ended")
CP_CONTINUATION_BEGUN = crashpoints.register("reap.continuation-begun",
                                             "a continuation took over the lease and checkpoint, nothing routed")


class ReapJob:
    """The state and plumbing the reap's Lambda tasks share over a :class:`WorkContext`."""

    def __init__(self, ctx: WorkContext, settings: Any) -> None:
        self.ctx, self.settings = ctx, settings
        self.table: ControlStore = ctx.table
        self.codec = ctx.codec
        self.kernel = JobKernel(self.table, "reap", ctx.clock)

    def now(self) -> int:
        return self.ctx.clock.now_ns()

    def lease(self) -> LeaseItem | None:
        return self.kernel.lease()

    def marks_items(self) -> list[MarksItem]:
        """The recorded pages' items, their marks decoded (:func:`~lightmetrics.reaps.gc_marks.read_marks_items`)."""
        return read_marks_items(self.table, self.codec)

    def summary(self, reap: ReapRun) -> ReapCheckpoint:
        item = self.table.get(CHECKPOINT_PK, CHECKPOINT_SK)
        if item is None or item.get("owner") != reap["owner"] or int(item.get("epoch", -1)) != int(reap["epoch"]):
            raise LeaseLost(f"reap epoch {reap['epoch']} no longer owns {CHECKPOINT_PK}")
        return ReapCheckpoint.of(plain(item))

    def commit(self, reap: ReapRun, change: CheckpointChange | None = None, *, add: Mapping[str, int] | None = None,
               remove: tuple[str, ...] = (), ops: list[Op] | None = None, lease: Op | None = None) -> None:
        """One transaction: the summary update (owned: ``change`` set, the counters ``add`` added), the
        lease renewal, and ``ops``."""
        names, values = JobKernel.owned(reap)
        now = self.now()
        sets, adds = ["#u = :now"], []
        names["#u"], values[":now"] = "updated_at_ns", now
        for i, (k, v) in enumerate((change or CheckpointChange()).stored().items()):
            names[f"#s{i}"], values[f":s{i}"] = k, v
            sets.append(f"#s{i} = :s{i}")
        for i, (k, v) in enumerate((add or {}).items()):
            if v:
                names[f"#a{i}"], values[f":a{i}"] = k, v
                adds.append(f"#a{i} :a{i}")
        expr = "SET " + ", ".join(sets) + (" ADD " + ", ".join(adds) if adds else "")
        if remove:
            for i, k in enumerate(remove):
                names[f"#r{i}"] = k
            expr += " REMOVE " + ", ".join(f"#r{i}" for i in range(len(remove)))
        lease = lease or self.kernel.renewal(reap, now)
        self.kernel.commit(reap, [Op("Update", CHECKPOINT_PK, CHECKPOINT_SK, expr, names, values, OWNED), lease,
                                  *(ops or [])], lost=f"reap epoch {reap['epoch']} lost the lease")

    def counted(self, out: dict[str, Any]) -> dict[str, Any]:
        """Rule G-B2: after ``max_tasks`` tasks this execution hands over to a new one. A visit of
        the ``Ranges`` Map counts as the tasks' worth of history it may take (params.map_visit_tasks)
        plus the hour's task that follows it; it runs only if that fits, or if this execution has
        done nothing else yet (a visit always fits an empty execution), so every execution progresses."""
        reap = out["reap"]
        reap["tasks"] = int(reap.get("tasks", 0)) + 1
        limit = int(reap.get("max_tasks") or max_tasks_for())
        if out["next"] == "ranges":
            visit = map_visit_tasks(len(out["ranges"]))
            if reap["tasks"] > 1 and reap["tasks"] + visit + 1 > limit:
                return {"reap": reap, "next": "continue"}
            reap["tasks"] += visit
            return out
        if out["next"] != "finish" and reap["tasks"] >= limit:
            return {"reap": reap, "next": "continue"}
        return out

    def route(self, reap: ReapRun, cp: ReapCheckpoint) -> dict[str, Any]:
        """Which task runs next, from the checkpoint's phase."""
        task = cp.phase.role
        if task == "finish":
            return {"reap": reap, "next": "finish"}
        wait_ns = cp.wait_until_ns - self.now()
        if wait_ns > 0:
            return {"reap": reap, "next": "wait", "wait_s": max(1, -(-wait_ns // NS)), "after": task}
        return {"reap": reap, "next": task}

    def finishing(self, dry_run: bool) -> CheckpointChange:
        """Rule G-I8, the one way a reap ends: what its last step sets. A dry run ends (it only
        reports). Any other reap with a ``marks#`` item left — its own, or a failed reap's of any
        mode, epoch or key range — first runs the settle phase in the GC role, which then ends it
        (``closing``); nothing left: it ends. A Query of the marks prefix per marks partition, up to
        the first item found (:func:`~lightmetrics.reaps.gc_marks.any_marks_item`)."""
        if dry_run or not any_marks_item(self.table):
            return CheckpointChange(phase=ReapPhase.DONE, wait_until_ns=0)
        return CheckpointChange(phase=ReapPhase.SETTLE, closing=True, listing_done=True, wait_until_ns=0)

    # -- fencing (docs/protocol.md §13, L2 and L3) --------------------------------------------------
    def fence(self, reap: ReapRun) -> Fence:
        """This task's fence: called right before every S3 delete and commit of the task. A dry
        run's refuses them all (rule DR1, :class:`~lightmetrics.reaps.dry_run.DryRunFence`)."""
        return self.kernel.fence(reap, DryRunFence if reap.get("dry_run") else Fence)

    def writer_may_run_until(self, item: MarksItem, reap: ReapRun, cp: ReapCheckpoint) -> int:
        """Rule L3 for a ``marks#`` item (:func:`~lightmetrics.reaps.mark_settle.writer_may_run_until`):
        until when the invocation that recorded it may still be placing its delete markers; 0 for
        recorded marks, which need no wait here: the grace is at least as long (rule H2, checked at start)."""
        if not item.intent:
            return 0
        return self.intent_writer_until(int(item.created_at_ns or 0), str(item.owner), reap,
                                        owned_since_ns=cp.owned_since_ns)

    def intent_writer_until(self, created_at_ns: int, writer: str, reap: ReapRun, *, owned_since_ns: int) -> int:
        """Rule L3 for an intent recorded at ``created_at_ns`` by owner ``writer``, this run being ``reap``."""
        return writer_may_run_until(created_at_ns, writer, reap["owner"], owned_since_ns=owned_since_ns,
                                    longest_ns=longest_reap_task_s() * NS)

    def wait(self, reap: ReapRun, cp: ReapCheckpoint, until_ns: int) -> dict[str, Any]:
        wait = CheckpointChange(wait_until_ns=until_ns)
        self.commit(reap, wait)
        return self.route(reap, cp.with_changes(wait))
