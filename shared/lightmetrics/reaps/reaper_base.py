"""What every reap task shares (:class:`ReaperBase`): the checkpoint summary, one owned transaction
per write (:meth:`ReaperBase._commit`, which also renews the lease), routing to the next task, the
task budget of an execution, and fencing (docs/reaps.md; docs/protocol.md §13, L1-L3). The tasks
themselves: :mod:`lightmetrics.reaps.gc_tasks`, :mod:`lightmetrics.reaps.retention_tasks`, and
:class:`lightmetrics.reaps.steps.Reaper` (begin, continue, end).
"""

from __future__ import annotations

import logging
from typing import Any, cast

from lightmetrics.deployment.timeouts import longest_reap_task_s
from lightmetrics.protocol.control_store import ControlStore, Op, TransactionCancelled, plain
from lightmetrics.reaps.dry_run import DryRunFence
from lightmetrics.reaps.gc_marks import MARKS_PREFIX, read_marks_items
from lightmetrics.reaps.params import (
    CHECKPOINT_PK,
    CHECKPOINT_SK,
    LEASE_PK,
    map_visit_tasks,
    max_tasks_for,
    read_lease,
)
from lightmetrics.work import crashpoints, leases
from lightmetrics.work.leases import OWNED, Fence, LeaseLost
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


def owned(reap: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    return {"#own": "owner", "#ep": "epoch"}, {":own": reap["owner"], ":ep": reap["epoch"]}


class ReaperBase:
    """The state and plumbing of the reap's Lambda tasks over a :class:`WorkContext`."""

    def __init__(self, ctx: WorkContext, settings: Any, *, sfn_client: Any = None) -> None:
        self.ctx, self.settings, self._sfn = ctx, settings, sfn_client
        self.table: ControlStore = ctx.table
        self.codec = ctx.codec
        #: the acceptance records the current retention page read (record key -> record), for its proof
        self.records_read: dict[str, Any] = {}

    def now(self) -> int:
        return self.ctx.clock.now_ns()

    def lease(self) -> dict[str, Any] | None:
        return read_lease(self.table)

    def marks_items(self) -> list[dict[str, Any]]:
        """The recorded pages' items, their marks decoded (:func:`~lightmetrics.reaps.gc_marks.read_marks_items`)."""
        return read_marks_items(self.table, self.codec)

    def summary(self, reap: dict[str, Any]) -> dict[str, Any]:
        cp = self.table.get(CHECKPOINT_PK, CHECKPOINT_SK)
        if cp is None or cp.get("owner") != reap["owner"] or int(cp.get("epoch", -1)) != int(reap["epoch"]):
            raise LeaseLost(f"reap epoch {reap['epoch']} no longer owns {CHECKPOINT_PK}")
        return cast(dict[str, Any], plain(cp))

    def _commit(self, reap: dict[str, Any], *, set_: dict[str, Any] | None = None, add: dict[str, int] | None = None,
                remove: tuple[str, ...] = (), ops: list[Op] | None = None, lease: Op | None = None) -> None:
        """One transaction: the summary update (owned), the lease renewal, and ``ops``."""
        names, values = owned(reap)
        now = self.now()
        sets, adds = ["#u = :now"], []
        names["#u"], values[":now"] = "updated_at_ns", now
        for i, (k, v) in enumerate((set_ or {}).items()):
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
        lease = lease or leases.renewal_of(LEASE_PK, reap, now)
        try:
            self.table.transact([Op("Update", CHECKPOINT_PK, CHECKPOINT_SK, expr, names, values, OWNED), lease,
                                  *(ops or [])])
        except TransactionCancelled:
            raise LeaseLost(f"reap epoch {reap['epoch']} lost the lease") from None

    def _counted(self, out: dict[str, Any]) -> dict[str, Any]:
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

    def _route(self, reap: dict[str, Any], cp: dict[str, Any]) -> dict[str, Any]:
        """Which task runs next, from the checkpoint's phase."""
        phase = cp["phase"]
        if phase == "done":
            return {"reap": reap, "next": "finish"}
        task = self._task_of(phase)
        wait_ns = int(cp.get("wait_until_ns", 0)) - self.now()
        if wait_ns > 0:
            return {"reap": reap, "next": "wait", "wait_s": max(1, -(-wait_ns // NS)), "after": task}
        return {"reap": reap, "next": task}

    def _finishing(self, cp: dict[str, Any]) -> dict[str, Any]:
        """Rule G-I8, the one way a reap ends: what its last step sets. A dry run ends (it only
        reports). Any other reap with a ``marks#`` item left — its own, or a failed reap's of any
        mode, epoch or key range — first runs the settle phase in the GC role, which then ends it
        (``closing``); nothing left: it ends. One Query of the marks prefix."""
        if cp["dry_run"] or not self.table.query(CHECKPOINT_PK, sk_prefix=MARKS_PREFIX, limit=1):
            return {"phase": "done", "wait_until_ns": 0}
        return {"phase": "settle", "closing": True, "listing_done": True, "wait_until_ns": 0}

    @staticmethod
    def _task_of(phase: str) -> str:
        if phase == "done":
            return "finish"
        return "gc" if phase in ("mark", "blobs", "settle") else "retention"

    # -- fencing (docs/protocol.md §13, L2 and L3) --------------------------------------------------
    def fence(self, reap: dict[str, Any]) -> Fence:
        """This task's fence: called right before every S3 delete and commit of the task. A dry
        run's refuses them all (rule DR1, :class:`~lightmetrics.reaps.dry_run.DryRunFence`)."""
        return (DryRunFence if reap.get("dry_run") else Fence)(self.table, LEASE_PK, reap, self.ctx.clock, LeaseLost)

    def _writer_may_run_until(self, item: dict[str, Any], reap: dict[str, Any], cp: dict[str, Any]) -> int:
        """Rule L3: until when an invocation that recorded this intent may still be placing its
        delete markers. Any invocation — a Step Functions retry of the same task may run beside the
        one it replaces (a timeout whose request is in flight, a service error while the function
        runs) — started before it wrote the intent and runs at most the longest reap task; an intent
        of another owner is also bounded by the time this run took the lease. Recovering waits until
        then, so every marker that will ever land has landed and is found. Recorded marks need no
        wait here: the grace is at least as long (rule H2, checked at start)."""
        if item.get("state") != "intent":
            return 0
        longest = longest_reap_task_s() * NS
        until = int(item.get("created_at_ns") or 0) + longest
        if item.get("owner") != reap["owner"]:
            until = max(until, int(cp.get("owned_since_ns", 0)) + longest)
        return until

    def _wait(self, reap: dict[str, Any], cp: dict[str, Any], until_ns: int) -> dict[str, Any]:
        wait = {"wait_until_ns": until_ns}
        self._commit(reap, set_=wait)
        return self._route(reap, {**cp, **wait})
