"""The walk's Lambda tasks: each is one method of :class:`Walker` (docs/protocol.md §13;
docs/walks.md). The state machine is ``infra/statemachines/bootstrap_walk.asl.json``.

``begin``     take the lease ``lease#walk``: a new epoch (the checkpoint starts over), a resume
              of the last epoch (``resume``), or the continuation of a running walk in a new
              execution. A start while the lease is live is refused (:class:`LeaseHeld`).
``plan``      fold finished partitions into the summary, enumerate up to ``parallelism``
              more, renew the lease, and route: a round of pages, continue, or finish.
``page``      one page of one partition from its cursor: every key checked (and repaired if it
              needs it), *then* the cursor
              moves (compare-and-set on the partition's own item). A key at RETRY_LATER fails
              the page (:class:`WalkRetryLater`): the cursor stays, the item records the page's
              last key (``failed_through``: later pages repair keys up to it in full, so a
              success clears their budget, O1a), Step Functions retries it with backoff, and the
              retry budget turns a key that keeps failing into a blocker, so the page finishes.
``cont``      start the next execution under the same lease, epoch and owner (stays under the
              execution history limit; moto's interpreter cannot run ``states:startExecution``).
``end``       finished or failed (the error) and the lease released, in one owned transaction;
              then, for a clean walk of every partition, the watermarks it proved (W3).

Example (the local runtime drives the tasks the same way)::

    >>> walker = Walker(ctx, settings)                                         # doctest: +SKIP
    >>> walk = walker.begin({"input": {"page_size": 500}})["walk"]             # doctest: +SKIP
    >>> walker.plan({"walk": walk})["next"]                                    # doctest: +SKIP
    'pages'
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any, cast

from lightmetrics.derived.walk.checkpoint import ListCursor, ListLevel, WalkCheckpoint, WalkCounters, WalkEnumeration
from lightmetrics.derived.walk.errors import InvalidWalkInput, NothingToResume
from lightmetrics.derived.walk.page_task import PageTask
from lightmetrics.derived.walk.params import WalkParams
from lightmetrics.derived.walk.state import (
    CHECKPOINT_SK,
    INDEXES,
    KEY_CHECKS,
    OUTCOMES,
    PART_PREFIX,
    PRESENCE_WALK_INDEXES,
    WalkPartition,
    WalkRun,
    checkpoint_pk,
    proven_before,
    read_walk,
    set_watermark,
    summarize,
    watermark_blocker,
)
from lightmetrics.derived.walk.walker_base import WalkJob, add_counts, log
from lightmetrics.jobs.kernel import JobKernel, JobStatus
from lightmetrics.protocol.control_store import ConditionFailed, Op, TransactionCancelled
from lightmetrics.protocol.executions import Executions
from lightmetrics.protocol.identity import id_to_hex
from lightmetrics.protocol.own_writes import put_own
from lightmetrics.work.blockers import BlockerStatus
from lightmetrics.work.leases import OWNED, LeaseItem, LeaseLost
from lightmetrics.work.units import WorkContext

#: What a continuation carries into the next execution.
CARRIED = ("scope", "agent", "checkpoint_pk", "epoch", "owner", "page_size", "parallelism", "max_rounds", "full",
           "lease_seconds", "state_machine_arn", "executions")
#: Keys with an open blocker a round hands its pages to re-check (§11 O4), at most: the work list
#: travels in the Step Functions state (256 KB). More wait for a later round or walk.
RECHECK_MAX = 200


class Walker:
    """The walk's Lambda tasks (one method each) over a :class:`WorkContext`, composed of the walk's
    :class:`WalkJob` (its job kernel: the lease, owned writes, continuations) and its page task.

    Checkpoint layout: the summary ``checkpoint#walk[...]``/``current`` (epoch, owner, status,
    enumeration state, totals of finished partitions) is written by one task at a time (Begin,
    Plan, End). Each partition in progress has its own item ``.../part#<partition>`` holding its
    cursor and counters, written by its page task only, so concurrent pages never contend for one
    item; Plan folds a finished partition into the summary and deletes its item, atomically.
    """

    def __init__(self, ctx: WorkContext, settings: Any, *, executions: Executions | None = None) -> None:
        self.job = WalkJob(ctx, settings)
        self.kernel, self.ctx, self.settings, self.table = self.job.kernel, ctx, settings, ctx.table
        self.executions = executions  # the continue task's: it starts the next execution
        self.page_task = PageTask(self.job)

    def now(self) -> int:
        return self.job.now()

    def lease(self) -> LeaseItem | None:
        """The walk lease's item, or None if no walk ever took it."""
        return self.kernel.lease()

    def page(self, event: dict[str, Any]) -> dict[str, Any]:
        """The ``page`` task (:class:`~lightmetrics.derived.walk.page_task.PageTask`)."""
        return self.page_task.page(event)

    # -- begin -------------------------------------------------------------------------------------
    def begin(self, event: dict[str, Any]) -> dict[str, Any]:
        inp = event.get("input") or {}
        execution, machine = event.get("execution_arn", ""), event.get("state_machine_arn", "")
        if isinstance(inp, dict) and "continuation" in inp:
            return self._begin_continuation(inp["continuation"], execution)
        params = WalkParams.parse(inp)
        now = self.now()
        lease = self.kernel.lease()
        self.kernel.refuse_if_held(lease, now)
        cp_pk = checkpoint_pk(params.agent_hex)
        cp, parts = read_walk(self.table, cp_pk)
        if params.resume:
            if cp is None or cp.status is JobStatus.FINISHED or cp.epoch is None:  # (no epoch: not Begin's item)
                raise NothingToResume(f"no unfinished walk to resume for {cp_pk} "
                                      f"(last status: {cp.status if cp else 'never ran'})")
            epoch = cp.epoch
            # A resume keeps the walk's page size, parallelism and mode unless the input changes them.
            kept = {k: v for k, v in (("page_size", cp.page_size), ("parallelism", cp.parallelism), ("full", cp.full))
                    if v is not None and inp.get(k) is None}
            if kept:
                params = WalkParams.parse({**inp, **kept})
        else:
            epoch = (0 if lease is None else lease.epoch if lease.last_epoch is None else lease.last_epoch) + 1
        owner = uuid.uuid4().hex
        scope = "all" if params.agent is None else f"agent={params.agent_hex}"
        self.kernel.take(lease, owner=owner, lease_seconds=params.lease_s, now_ns=now, epoch=epoch, execution=execution,
                         scope=scope, checkpoint_pk=cp_pk)
        walk: WalkRun = {
            "scope": scope, "agent": params.agent, "checkpoint_pk": cp_pk, "epoch": epoch, "owner": owner,
            "page_size": params.page_size, "parallelism": params.parallelism, "max_rounds": params.max_rounds,
            "full": params.full, "lease_seconds": params.lease_s, "state_machine_arn": machine,
            "execution_arn": execution, "round": 0,
        }
        if params.resume:
            assert cp is not None
            # The new owner takes over the summary and every partition in progress, in one
            # transaction: from now on a page of the old owner cannot move a cursor.
            ops = [Op("Update", cp_pk, CHECKPOINT_SK,
                      "SET #own = :own, #st = :running, #x = :x, #u = :now, #rs = :now, #rb = :rb, "
                      "#ps = :ps, #par = :par REMOVE #err ADD #n :one, #res :one",
                      {"#own": "owner", "#st": "status", "#x": "execution", "#u": "updated_at_ns",
                       "#rs": "rate_since_ns", "#rb": "rate_keys_base", "#ps": "page_size", "#par": "parallelism",
                       "#err": "error", "#n": "executions", "#res": "resumes", "#ep": "epoch"},
                      {":own": owner, ":running": JobStatus.RUNNING.value, ":x": execution, ":now": now, ":one": 1,
                       ":rb": summarize(cp, parts, now).keys, ":ps": params.page_size,
                       ":par": params.parallelism, ":ep": epoch},
                      "#ep = :ep")]
            ops += [Op("Update", cp_pk, p.sk, "SET #own = :own", {"#own": "owner", "#ep": "epoch"},
                       {":own": owner, ":ep": epoch}, "#ep = :ep") for p in parts[:90]]
            try:
                self.table.transact(ops)
            except TransactionCancelled:
                raise NothingToResume(f"{cp_pk} changed while resuming; start again") from None
            walk["executions"] = (cp.executions or 0) + 1
        else:
            put_own(self.table, self._fresh_checkpoint(walk, now).stored(), condition="attribute_not_exists(pk) OR epoch < :e",
                    values_for_condition={":e": epoch})
            walk["executions"] = 1
        log.info("walk %s epoch %d begins (%s)", scope, epoch, "resume" if params.resume else "new epoch")
        return {"walk": walk}

    def _fresh_checkpoint(self, walk: WalkRun, now: int) -> WalkCheckpoint:
        return WalkCheckpoint(
            pk=walk["checkpoint_pk"], epoch=walk["epoch"], owner=walk["owner"], scope=walk["scope"],
            agent=walk["agent"], status=JobStatus.RUNNING, started_at_ns=now, updated_at_ns=now, rate_since_ns=now,
            rate_keys_base=0, page_size=walk["page_size"], full=bool(walk.get("full", False)),
            parallelism=walk["parallelism"], execution=walk["execution_arn"], executions=1, resumes=0,
            enum=WalkEnumeration(self.job.roots(id_to_hex(walk["agent"]) if walk["agent"] else None)),
            counters=WalkCounters())

    def _begin_continuation(self, cont: Any, execution: str) -> dict[str, Any]:
        required = ("scope", "agent", "checkpoint_pk", "epoch", "owner", "page_size", "parallelism", "max_rounds",
                    "lease_seconds", "state_machine_arn", "executions")
        if not isinstance(cont, dict) or any(k not in cont for k in required):
            raise InvalidWalkInput(f"continuation must carry {list(required)}")
        walk = cast(WalkRun, {k: cont[k] for k in required})
        walk["full"] = bool(cont.get("full", False))
        now = self.now()
        walk["execution_arn"], walk["round"], walk["executions"] = execution, 0, int(cont["executions"]) + 1
        self.kernel.commit(walk, [
            self.kernel.renewal(walk, now, execution=execution),
            self.kernel.owned_update(walk, walk["checkpoint_pk"], CHECKPOINT_SK, "SET #x = :x, #u = :now ADD #n :one",
                                     {"#x": "execution", "#u": "updated_at_ns", "#n": "executions"},
                                     {":x": execution, ":now": now, ":one": 1}),
        ], lost=f"epoch {walk['epoch']} no longer owns the walk lease; not continuing")
        return {"walk": walk}

    # -- plan --------------------------------------------------------------------------------------
    @staticmethod
    def _summary_update(walk: WalkRun, finished: list[WalkPartition], strays: Counter[str],
                        enum: WalkEnumeration, new: int, now: int) -> Op:
        """The owned checkpoint update that folds ``finished`` partitions and the ``strays`` into the
        walk's summary and saves the enumeration's state."""
        folded = Counter({o: sum(p.outcomes.get(o, 0) for p in finished) for o in OUTCOMES}) + strays
        by_kind: Counter[str] = Counter()
        for p in finished:
            by_kind[p.kind] += p.keys
        names, values = JobKernel.owned(walk)
        names.update({"#en": "enum", "#u": "updated_at_ns", "#pd": "partitions_done", "#pf": "partitions_found",
                      "#k": "keys", "#pg": "pages", "#ka": "keys_accepted", "#kq": "keys_quarantine"})
        values.update({":en": enum.stored(), ":now": now, ":fd": len(finished), ":nf": new,
                       ":k": sum(p.keys for p in finished) + sum(strays.values()),
                       ":pg": sum(p.pages for p in finished),
                       ":ka": by_kind["accepted"] + sum(strays.values()), ":kq": by_kind["quarantine"]})
        adds = ["#pd :fd", "#pf :nf", "#k :k", "#pg :pg", "#ka :ka", "#kq :kq"]
        add_counts(names, values, adds, {check: sum(p.settled[check] for p in finished) for check in KEY_CHECKS},
                   folded)
        return Op("Update", walk["checkpoint_pk"], CHECKPOINT_SK, "SET #en = :en, #u = :now ADD " + ", ".join(adds),
                  names, values, OWNED)

    def plan(self, event: dict[str, Any]) -> dict[str, Any]:
        walk = cast(WalkRun, dict(event["walk"]))
        pk = walk["checkpoint_pk"]
        leftovers: list[WalkPartition] = []  # partition items of an unfinished older epoch
        cp, parts = read_walk(self.table, pk, leftovers=leftovers)
        if cp is None or not cp.owned_by(walk["epoch"], walk["owner"]):
            raise LeaseLost(f"checkpoint {pk} is no longer epoch {walk['epoch']} of this run")
        now = self.now()
        finished = [p for p in parts if p.done]
        active = {p.partition: p for p in parts if not p.done}
        enum = cp.enum or WalkEnumeration(done=True)
        need = int(walk["parallelism"]) - len(active)
        new: list[str] = []
        strays: Counter[str] = Counter()
        if need > 0 and not enum.done:
            new, stray_keys = self._enumerate(enum, need)
            if stray_keys:
                skipped_strays = {b.object_key for b in self.ctx.blockers.list(status=BlockerStatus.SKIPPED)}
                strays = Counter("SKIPPED" if k in skipped_strays else self.job.repair(k).value for k in stray_keys)

        # Fold finished partitions (and the strays) into the summary, start the new ones.
        ops = [self.kernel.renewal(walk, now), self._summary_update(walk, finished, strays, enum, len(new), now)]
        pnames, pvalues = JobKernel.owned(walk)
        ops += [Op("Delete", pk, p.sk, names=pnames, values=pvalues, condition=OWNED) for p in finished]
        new_sks = {PART_PREFIX + p for p in new}
        for partition in new:
            ops.append(Op("Put", pk, PART_PREFIX + partition, names={"#ep": "epoch"}, values={":ep": walk["epoch"]},
                          condition="attribute_not_exists(pk) OR #ep < :ep",
                          item={"partition": partition, "kind": self.job.kind(partition), "after": "", "done": False,
                                "epoch": walk["epoch"], "owner": walk["owner"], "updated_at_ns": now,
                                **WalkCounters().stored()}))
        room = 90 - len(ops)
        ops += [Op("Delete", pk, p.sk) for p in leftovers if p.sk not in new_sks][:max(0, room)]
        self.kernel.commit(walk, ops, lost=f"epoch {walk['epoch']} lost the walk lease")
        for partition in new:
            active[partition] = WalkPartition(partition)
        if not active:
            return {"walk": walk, "next": "finish", "work": []}
        if int(walk["round"]) >= int(walk["max_rounds"]):
            return {"walk": walk, "next": "continue", "work": []}
        walk["round"] = int(walk["round"]) + 1
        # Keys whose blocker an operator skipped (few by design: each is an incident) are not
        # walked but counted; keys with an open blocker are repaired as failed before, so a success
        # resolves it (§11 O4). Read once per round here (one Query) rather than once per page.
        blockers = self.ctx.blockers.list(status=None)
        skipped = sorted({b.object_key for b in blockers if b.status is BlockerStatus.SKIPPED})
        # Only blockers a page can resolve take a slot: its partitions', of the kind it repairs under
        # (others — retention's under accepted-by-time/, which sort first — would crowd them out).
        partitions = tuple(active)
        blocked = sorted({b.object_key for b in blockers if b.status.pending
                          and b.object_key.startswith(partitions) and b.kind == self.job.unit_kind(b.object_key)}
                         )[:RECHECK_MAX]
        work = [{"partition": p, "after": f.after, "skipped": [k for k in skipped if k.startswith(p)],
                 **({"failed_through": f.failed_through} if f.failed_through else {}),
                 **({"blocked": mine} if (mine := [k for k in blocked if k.startswith(p)]) else {})}
                for p, f in sorted(active.items())]
        return {"walk": walk, "next": "pages", "work": work}

    def _enumerate(self, enum: WalkEnumeration, need: int) -> tuple[list[str], list[str]]:
        """Up to ``need`` more partitions, depth first (agents, then their boots); mutates ``enum``.

        Keys that sit where a partition should be (``accepted/v1/x.json``) are returned as strays:
        they are outside the layout and become blockers, never silent skips.
        """
        out: list[str] = []
        strays: list[str] = []
        queue = enum.queue
        while len(out) < need and queue:
            head = queue[0]
            boots = head.level is ListLevel.BOOTS
            page = self.ctx.store.list_page(
                head.prefix, delimiter="/", max_keys=(need - len(out)) if boots else 100,
                continuation_token=head.token,
            )
            strays.extend(page.keys)
            if page.truncated and page.next_token:
                head.token = page.next_token
            else:
                queue.pop(0)
            if boots:
                out.extend(page.prefixes)
            else:
                queue[0:0] = [ListCursor(p, ListLevel.BOOTS) for p in page.prefixes]
        enum.done = not queue
        return out, strays

    # -- continue ----------------------------------------------------------------------------------
    def cont(self, event: dict[str, Any]) -> dict[str, Any]:
        walk: WalkRun = event["walk"]
        carried = {k: walk[k] for k in CARRIED if k in walk}  # type: ignore[literal-required]
        arn = self.kernel.continue_in(self.executions, walk, carried)
        names, values = JobKernel.owned(walk)
        try:
            self.table.update(walk["checkpoint_pk"], CHECKPOINT_SK, "SET #nx = :nx, #u = :now",
                              names={**names, "#nx": "next_execution", "#u": "updated_at_ns"},
                              values={**values, ":nx": arn, ":now": self.now()}, condition=OWNED)
        except ConditionFailed:
            raise LeaseLost(f"epoch {walk['epoch']} lost the walk checkpoint") from None
        return {"next_execution": arn}

    # -- end ---------------------------------------------------------------------------------------
    def end(self, event: dict[str, Any]) -> dict[str, Any]:
        walk, outcome = event["walk"], event.get("outcome", "failed")
        cp, parts = read_walk(self.table, walk["checkpoint_pk"])
        if cp is None or not cp.owned_by(walk["epoch"], walk["owner"]):
            return {"status": "lease-lost", "epoch": walk["epoch"]}
        now = self.now()
        names, values = JobKernel.owned(walk)
        summary = summarize(cp, parts, now)
        watermark: int | None = None
        if outcome == "finished":
            reason = watermark_blocker(cp, parts)
            if not reason:
                watermark = proven_before(int(cp.started_at_ns or 0), self.settings.settle_s)
            names.update({"#st": "status", "#fa": "finished_at_ns", "#u": "updated_at_ns"})
            values.update({":st": JobStatus.FINISHED.value, ":now": now})
            expr = "SET #st = :st, #fa = :now, #u = :now"
            if watermark is not None:
                names["#wm"], values[":wm"] = "watermark_ns", watermark
                expr += ", #wm = :wm"
            if reason is not None:
                names["#wr"], values[":wr"] = "watermark_withheld", reason
                expr += ", #wr = :wr"
            update = Op("Update", walk["checkpoint_pk"], CHECKPOINT_SK, expr, names, values, OWNED)
            summary = replace(summary, status=JobStatus.FINISHED, watermark_ns=watermark, watermark_withheld=reason)
        else:
            error = json.dumps(event.get("error"), sort_keys=True, default=str)[:2000]
            update = Op("Update", walk["checkpoint_pk"], CHECKPOINT_SK,
                        "SET #st = :st, #fa = :now, #u = :now, #err = :err",
                        {**names, "#st": "status", "#fa": "failed_at_ns", "#u": "updated_at_ns", "#err": "error"},
                        {**values, ":st": JobStatus.FAILED.value, ":now": now, ":err": error}, OWNED)
            summary = replace(summary, status=JobStatus.FAILED, error=error)
        try:
            self.kernel.commit(walk, [update, self.kernel.release(walk, now)])
        except LeaseLost:
            return {"status": "lease-lost", "epoch": walk["epoch"]}
        # Only after the owned write (rule L2): an End that lost the walk moves no watermark. A crash
        # in between leaves W where it was (conservative); the retried End, still the owner, moves it.
        if watermark is not None:
            for index in (INDEXES if walk.get("full") else PRESENCE_WALK_INDEXES):
                set_watermark(self.table, index, watermark, epoch=walk["epoch"], now_ns=now)
        log.info("walk %s epoch %s %s", walk["scope"], walk["epoch"], summary.status)
        return summary.to_json()


__all__ = ["Walker"]
