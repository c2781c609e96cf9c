"""The reap's Lambda tasks: each is one method of :class:`Reaper` (docs/reaps.md). The state machine
``infra/statemachines/reap.asl.json`` loops over them; every task returns ``{"reap": ..., "next": ...}``
and the state machine routes on ``next``:

``begin``      (reap-begin) validate the input (``mode`` and an explicit ``dry_run``), take the
               lease ``lease#reap`` with a new epoch (or ``resume`` the last one) — refused while
               another reap holds it (:class:`LeaseHeld`, the CLI exits 5).
``gc``         (reap-gc, the GC role) one page: mark (prove a page of candidates, record the
               intent, place delete markers, record the marks and move the cursor) or settle
               (after the grace: purge or restore recorded marks). Also the blobs of a
               retention hour, with the proof "hour tombstoned".
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
renewal of the lease, :class:`~lightmetrics.ops.leases.Fence`), so a task that lost the lease deletes
nothing; and an intent another owner recorded is settled only once that owner cannot be running.

Example (the local runtime drives the tasks the same way)::

    >>> reaper = Reaper(ctx, settings)                                         # doctest: +SKIP
    >>> reaper.begin({"input": {"mode": "gc", "dry_run": True}})["next"]       # doctest: +SKIP
    'gc'
"""

from __future__ import annotations

import json
import logging
import uuid
from contextlib import closing
from typing import Any, cast

from lightmetrics.aws.control_table import ControlTable, Op, TransactionCancelled, plain
from lightmetrics.aws.step_functions import start_continuation
from lightmetrics.composition.config import longest_reap_task_s
from lightmetrics.ops import crashpoints, leases
from lightmetrics.ops.leases import OWNED, Fence, LeaseHeld, LeaseLost
from lightmetrics.ops.work import WorkContext, work_key
from lightmetrics.protocol.errors import KeyLayoutError
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.gc import BlobCollector
from lightmetrics.reaps.gc_marks import page_of, page_ops, page_prefix, read_marks_items
from lightmetrics.reaps.params import (
    CHECKPOINT_PK,
    CHECKPOINT_SK,
    DEFAULT_MAX_PAGES,
    DEFAULT_RANGE_PARALLELISM,
    LATEST_AUDIT,
    LEASE_PK,
    ReapParams,
    latest_audit_run,
    map_visit_tasks,
    max_tasks_for,
    read_lease,
    source_cursor_sk,
)
from lightmetrics.reaps.report import proof_counts, report_of, settle_counts
from lightmetrics.reaps.retention import KIND_RETENTION, HourRetention, WatermarkBehind, expired_hours
from lightmetrics.reaps.retention_ranges import (
    CP_RANGES_FOLDED,
    FOLD_DELETES_PER_TRANSACTION,
    RANGE_PK,
    RangeTask,
    folded,
    plan_visit,
    read_ranges,
)

log = logging.getLogger(__name__)
_NS = 1_000_000_000
_OWNED = OWNED

#: The report lists at most this many blocked work keys (the blockers list has them all).
REPORT_BLOCKED_MAX = 100

CP_INTENT = crashpoints.register("reap.intent-recorded", "a page's intent recorded, no marker placed yet")
CP_PAGE_DONE = crashpoints.register("reap.page-recorded", "a page's marks and cursor recorded")
CP_SETTLE_RECORDED = crashpoints.register("reap.settle-recorded", "a settled page counted and its item deleted")
CP_STEP_DONE = crashpoints.register("reap.retention-step", "a retention step's checkpoint written")
CP_CONTINUED = crashpoints.register("reap.continued", "the next execution started and recorded, this one not ended")
CP_CONTINUATION_BEGUN = crashpoints.register("reap.continuation-begun",
                                             "a continuation took over the lease and checkpoint, nothing routed")


def _owned(reap: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    return {"#own": "owner", "#ep": "epoch"}, {":own": reap["owner"], ":ep": reap["epoch"]}


class Reaper:
    """The reap's Lambda tasks over a :class:`WorkContext` (one method per task)."""

    def __init__(self, ctx: WorkContext, settings: Any, *, sfn_client: Any = None) -> None:
        self.ctx, self.settings, self._sfn = ctx, settings, sfn_client
        self.table: ControlTable = ctx.table
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
        names, values = _owned(reap)
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
            self.table.transact([Op("Update", CHECKPOINT_PK, CHECKPOINT_SK, expr, names, values, _OWNED), lease,
                                  *(ops or [])])
        except TransactionCancelled:
            raise LeaseLost(f"reap epoch {reap['epoch']} lost the lease") from None

    # -- begin -----------------------------------------------------------------------------------
    def begin(self, event: dict[str, Any]) -> dict[str, Any]:
        inp = event.get("input") or {}
        if isinstance(inp, dict) and "continuation" in inp:
            return self._begin_continuation(inp["continuation"], event.get("execution_arn", ""))
        params = ReapParams.parse(inp)
        now = self.now()
        lease = self.lease()
        if leases.is_live(lease, now):
            raise LeaseHeld(leases.describe(lease or {}, now, "reap"))
        cp = self.table.get(CHECKPOINT_PK, CHECKPOINT_SK)
        cp = plain(cp) if cp else None
        hours: list[str] = []
        if not params.resume and params.mode == "retention":
            rollup = params.scope == "rollup"
            retention_s = int(self.settings.rollup_retention_s if rollup else self.settings.retention_s)
            if params.hour is not None:
                hours = [str(params.hour)]
                if params.hour.end_ns > now - retention_s * _NS:
                    raise InvalidReapInput(f"{params.hour} is not older than "
                                           f"{'LM_ROLLUP_RETENTION_S' if rollup else 'LM_RETENTION_S'} ({retention_s} s)")
            else:
                hours = [str(h) for h in expired_hours(self.ctx, retention_s=retention_s, now_ns=now,
                                                       scope=params.scope)]
        if params.resume:
            if cp is None or cp.get("status") == "finished":
                raise InvalidReapInput("resume: no unfinished reap to resume")
            epoch = int(cp["epoch"])
        else:
            epoch = int((lease or {}).get("epoch", 0)) + 1
        owner = uuid.uuid4().hex
        execution = event.get("execution_arn", "")
        leases.take(self.table, LEASE_PK, lease, owner=owner, lease_seconds=params.lease_seconds, now_ns=now,
                    what="reap", epoch=epoch, scope=params.mode, execution=execution)
        reap = {"epoch": epoch, "owner": owner, "mode": params.mode, "dry_run": params.dry_run,
                "lease_seconds": params.lease_seconds, "max_tasks": params.max_tasks_per_execution, "tasks": 0,
                "executions": 1, "state_machine_arn": event.get("state_machine_arn", "")}
        if params.resume:
            assert cp is not None
            self.table.update(CHECKPOINT_PK, CHECKPOINT_SK,
                              "SET #own = :own, #st = :run, #x = :x, #os = :now REMOVE #err",
                              names={"#own": "owner", "#st": "status", "#x": "execution", "#err": "error", "#ep": "epoch",
                                     "#os": "owned_since_ns"},
                              values={":own": owner, ":run": "running", ":x": execution, ":ep": epoch, ":now": now},
                              condition="#ep = :ep")
            reap.update(mode=cp["mode"], dry_run=bool(cp["dry_run"]), executions=int(cp.get("executions", 1)))
            return self._route(reap, plain(self.table.get(CHECKPOINT_PK, CHECKPOINT_SK)))
        item = {"pk": CHECKPOINT_PK, "sk": CHECKPOINT_SK, "epoch": epoch, "owner": owner, "mode": params.mode,
                "dry_run": params.dry_run, "status": "running", "started_at_ns": now, "updated_at_ns": now,
                "owned_since_ns": now,
                "execution": execution, "params": {k: v for k, v in inp.items() if k != "resume"},
                "scope": params.scope, "source": params.source, "audit_run": params.audit_run,
                "hour": str(params.hour) if params.hour else None,
                "page_size": params.page_size, "concurrency": params.concurrency,
                "max_pending_pages": params.max_pending_pages, "tombstone_wait_s": params.tombstone_wait_s,
                "verify_passes": params.verify_passes, "phase": "mark" if params.mode == "gc" else "commit",
                "after": "", "page": 0, "hours": hours, "hour_index": 0, "passes": 1, "hour_status": {},
                "wait_until_ns": 0, "listing_done": False, "max_pages": params.max_pages, "executions": 1,
                "range_parallelism": params.range_parallelism}
        if params.mode == "gc" and params.source == "audit" and params.audit_run == LATEST_AUDIT:
            # Rule G-B3: the newest committed audit run, each run's candidates proven once.
            run = latest_audit_run(self.ctx.store, self.codec)
            item["audit_run"] = run
            if run is None:
                item.update(phase="done", note="no committed audit run yet: nothing to prove")
            elif (self.table.get(CHECKPOINT_PK, source_cursor_sk("audit", run)) or {}).get("ended"):
                item.update(phase="done", note=f"audit run {run}: every candidate already proven")
            if item["phase"] == "done" and self.marks_items():
                # Marks a failed reap left: settle them now, not a week later (G-I3).
                item.update(phase="settle", listing_done=True)
        if params.mode == "gc" and item["phase"] != "done" \
                and not (params.source == "by-time" and params.hour is not None):
            # Rule G-B1: GC goes on from where the last run of this source stopped.
            sk = source_cursor_sk(params.source, item["audit_run"])
            saved = self.table.get(CHECKPOINT_PK, sk)
            item.update(source_cursor=sk, after=str((saved or {}).get("after") or ""),
                        through=(saved or {}).get("through"))
        self.table.put(item, condition="attribute_not_exists(pk) OR epoch < :e", values_for_condition={":e": epoch})
        log.info("reap %s epoch %d begins (dry_run=%s)", params.mode, epoch, params.dry_run)
        return self._route(reap, item)

    CARRIED = ("epoch", "owner", "mode", "dry_run", "lease_seconds", "max_tasks", "executions", "state_machine_arn")

    def _begin_continuation(self, cont: Any, execution: str) -> dict[str, Any]:
        """The next execution of a running reap (rule G-B2): the same lease, epoch and owner; the
        lease is renewed and the checkpoint names this execution, in one owned transaction."""
        if not isinstance(cont, dict) or any(k not in cont for k in self.CARRIED):
            raise InvalidReapInput(f"continuation must carry {list(self.CARRIED)}")
        reap = {k: cont[k] for k in self.CARRIED}
        reap.update(tasks=0, executions=int(cont["executions"]) + 1)
        self._commit(reap, set_={"execution": execution, "executions": reap["executions"]})
        crashpoints.point(CP_CONTINUATION_BEGUN)
        log.info("reap %s epoch %s continues in execution %d", reap["mode"], reap["epoch"], reap["executions"])
        return self._route(reap, self.summary(reap))

    def continuation(self, reap: dict[str, Any]) -> dict[str, Any]:
        """The input of the next execution: ``{"continuation": ...}``."""
        return {"continuation": {k: reap[k] for k in self.CARRIED}}

    def cont(self, event: dict[str, Any]) -> dict[str, Any]:
        """The ``Continue`` task: start the next execution, record it in the checkpoint; this
        execution then ends (``Continued``) without releasing the lease."""
        reap = event["reap"]
        if self._sfn is None:
            raise RuntimeError("reap-continue needs a Step Functions client")
        self.summary(reap)  # LeaseLost: a run that lost the reap starts nothing
        # Deterministic name: a retried task finds the execution it already started.
        name = f"reap-e{reap['epoch']}-{reap['owner'][:8]}-{int(reap['executions']) + 1:04d}"
        arn = start_continuation(self._sfn, reap["state_machine_arn"], name, self.continuation(reap))
        self._commit(reap, set_={"next_execution": arn})
        crashpoints.point(CP_CONTINUED)
        return {"next_execution": arn}

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
            return {"reap": reap, "next": "wait", "wait_s": max(1, -(-wait_ns // _NS)), "after": task}
        return {"reap": reap, "next": task}

    @staticmethod
    def _task_of(phase: str) -> str:
        if phase == "done":
            return "finish"
        return "gc" if phase in ("mark", "blobs", "settle") else "retention"

    # -- fencing (docs/protocol.md §13, L2 and L3) --------------------------------------------------
    def fence(self, reap: dict[str, Any]) -> Fence:
        """This task's fence: called right before every S3 delete and commit of the task."""
        return Fence(self.table, LEASE_PK, reap, self.ctx.clock, LeaseLost)

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
        longest = longest_reap_task_s() * _NS
        until = int(item.get("created_at_ns") or 0) + longest
        if item.get("owner") != reap["owner"]:
            until = max(until, int(cp.get("owned_since_ns", 0)) + longest)
        return until

    def _wait(self, reap: dict[str, Any], cp: dict[str, Any], until_ns: int) -> dict[str, Any]:
        wait = {"wait_until_ns": until_ns}
        self._commit(reap, set_=wait)
        return self._route(reap, {**cp, **wait})

    # -- the GC task: mark a page, or settle recorded marks ---------------------------------------
    def gc(self, event: dict[str, Any]) -> dict[str, Any]:
        if "range" in event:  # an iteration of the Ranges Map: one key range's blobs (reap.ranges)
            return RangeTask(self, event).gc()
        return self._counted(self._gc(event))

    def _gc(self, event: dict[str, Any]) -> dict[str, Any]:
        reap = event["reap"]
        cp = self.summary(reap)
        if self._task_of(cp["phase"]) != "gc":
            return self._route(reap, cp)  # a retried task whose step already committed: just route
        collector = BlobCollector(self.ctx, self.settings, concurrency=int(cp["concurrency"]), fence=self.fence(reap))
        try:
            if cp["phase"] == "settle":
                return self._settle(reap, cp, collector)
            if cp["phase"] in ("mark", "blobs"):
                return self._mark_page(reap, cp, collector)
            raise InvalidReapInput(f"reap-gc cannot run phase {cp['phase']!r}")
        finally:
            collector.close()

    def _candidates(self, cp: dict[str, Any]) -> tuple[list[str], str, bool, dict[str, Any]]:
        """One page of candidate blob keys after the cursor: ``(blob keys, new cursor, more, counts)``
        (counts by kept reason, and ``through``: the first hour not yet proven)."""
        limit, after = int(cp["page_size"]), cp.get("after") or None
        if cp["phase"] == "blobs":  # retention: the blobs of the hour's accepted manifests
            hr = HourRetention(self.ctx, UtcHour.parse(cp["hours"][int(cp["hour_index"])]),
                               concurrency=int(cp["concurrency"]))
            keys, more = hr.page(after or "", limit)
            page = hr.records(keys)  # an unreadable record blocks its entry, not the page
            self.records_read = {self.codec.accepted(m.identity): m for m in page.records.values()}
            counts = {"kept#blocked": len(page.blocked)} if page.blocked else {}
            return page.blob_keys, (keys[-1] if keys else after or ""), more, counts
        if cp["source"] == "audit":
            return (*self._audit_candidates(cp), {})
        if cp["source"] == "by-time":  # raw-blobs-by-time hours older than the retry horizon
            root = self.codec.prefix + "raw-blobs-by-time/v1/"
            prefix = self.codec.raw_blobs_by_time_hour(UtcHour.parse(cp["hour"])) if cp.get("hour") else root
            listing = self.ctx.store.list_page(prefix, max_keys=limit, start_after=after)
            horizon = UtcHour.of_unix_ns(self.now() - int(self.settings.retry_horizon_s) * _NS)
            out, last = [], after or ""
            for key in listing.keys:
                try:
                    parsed = self.codec.parse(key)
                except KeyLayoutError:
                    out.append(key)  # not ours: GC opens its blocker and goes on (rule D4)
                    last = key
                    continue
                if parsed.hour is not None and parsed.hour >= horizon:
                    # Keys are in hour order: the rest are too young. Every due hour is proven.
                    return out, last, False, {"through": str(horizon)}
                out.append(self.codec.raw_blob(parsed.sha256 or ""))
                last = key
            if not listing.truncated:
                return out, last, False, {"through": str(horizon)}
            # Hours before the last key's are proven (rule G-B1: the first hour not yet proven).
            try:
                through = self.codec.parse(last).hour
            except KeyLayoutError:
                through = None
            return out, last, True, {"through": str(through)} if through else {}
        listing = self.ctx.store.list_page(self.codec.prefix + "raw-blobs/v1/", max_keys=limit,
                                           start_after=after)
        return listing.keys, (listing.keys[-1] if listing.keys else after or ""), listing.truncated, {}

    def _audit_candidates(self, cp: dict[str, Any]) -> tuple[list[str], str, bool]:
        """The Spark audit's confirmed orphan candidates, ``page_size`` lines a page whatever the
        size of its part files. The cursor is ``<part key>#<byte offset>`` inside a part, or the
        last finished part's key; a page reads its lines with one ranged GET from the offset."""
        run = self.codec.audit_run(cp["audit_run"])
        if self.ctx.store.head(f"{run}summary.json") is None:
            raise InvalidReapInput(f"audit run {cp['audit_run']} is not committed (no summary.json)")
        parts_prefix = f"{run}orphan-blob-candidates/"
        after = cp.get("after") or ""
        part, _, offset = after.rpartition("#")
        if not (part.startswith(parts_prefix) and offset.isdigit()):
            listing = self.ctx.store.list_page(parts_prefix, max_keys=1, start_after=after or None)
            if not listing.keys:
                return [], after, False
            part, offset = listing.keys[0], "0"
        keys, end, finished = self._audit_lines(part, int(offset), int(cp["page_size"]))
        if not finished:
            return keys, f"{part}#{end}", True
        following = self.ctx.store.list_page(parts_prefix, max_keys=1, start_after=part)
        return keys, part, bool(following.keys)

    def _audit_lines(self, part: str, offset: int, limit: int) -> tuple[list[str], int, bool]:
        """Up to ``limit`` blob keys of the part file from byte ``offset``: ``(keys, offset after
        them, whether the file ended)``; reads only as far as it needs."""
        keys: list[str] = []
        with closing(self.ctx.store.lines_from(part, offset)) as lines:
            for line in lines:
                if len(keys) >= limit:
                    return keys, offset, False
                start, offset = offset, offset + len(line)
                if line.strip():
                    try:
                        keys.append(str(json.loads(line)["blob_key"]))
                    except (ValueError, KeyError, TypeError):
                        keys.append(f"{part}#{start}")  # not a blob key: GC blocks it and goes on
        return keys, offset, True

    def _mark_page(self, reap: dict[str, Any], cp: dict[str, Any], collector: BlobCollector) -> dict[str, Any]:
        page = int(cp["page"])
        prefix = page_prefix(reap["epoch"], page)
        intent = [i for i in self.marks_items() if str(i["sk"]).startswith(prefix) and i.get("state") == "intent"]
        if intent:
            # A crash after the intent: some markers may be placed; find them, place the others —
            # once the run that recorded the intent cannot be placing them any more (rule L3).
            until = max(self._writer_may_run_until(i, reap, cp) for i in intent)
            if until > self.now():
                return self._wait(reap, cp, until)
            first = intent[0]
            marks = collector.recover([m for i in intent for m in i["marks"]])
            return self._record_page(reap, cp, marks, first["cursor"], bool(first["more"]), first.get("counts") or {},
                                     replaces=[i["sk"] for i in intent])
        self.records_read = {}
        keys, cursor, more, counts = self._candidates(cp)
        collector.records_read.update(self.records_read)  # retention: each record read once (rule G-R1)
        now = self.now()
        proofs = collector.prove_all(keys, now_ns=now)
        deletable, proven = proof_counts(proofs, retention=cp["phase"] == "blobs")
        counts.update(proven)
        intents = [collector.intent(p, now) for p in deletable]
        if cp["dry_run"] or not intents:
            return self._record_page(reap, cp, [], cursor, more, counts, write_marks=False)
        # The intent is durable before the first marker: a crash in between is recoverable.
        ops = page_ops(reap["epoch"], page, intents, {"epoch": reap["epoch"], "owner": reap["owner"], "state": "intent",
                                                   "cursor": cursor, "more": more, "counts": counts,
                                                   "created_at_ns": now}, [])
        self._commit(reap, ops=ops)
        crashpoints.point(CP_INTENT)
        marks = collector.mark(intents)
        return self._record_page(reap, cp, marks, cursor, more, counts, replaces=[op.sk for op in ops])

    def _record_page(self, reap: dict[str, Any], cp: dict[str, Any], marks: list[dict[str, Any]], cursor: str,
                     more: bool, counts: dict[str, Any], *, write_marks: bool = True,
                     replaces: list[str] | None = None) -> dict[str, Any]:
        """The page's marks (replacing its intent items) and the cursor, in one transaction."""
        page = int(cp["page"])
        replaces = replaces or []
        counts = dict(counts)
        through: str | None = counts.pop("through", None)
        # Rule G-B1: a GC run marks at most max_pages pages, then settles and ends.
        exhausted = (cp["mode"] == "gc" and more
                     and page + 1 >= int(cp.get("max_pages") or DEFAULT_MAX_PAGES))
        ended = not more
        more = more and not exhausted
        if write_marks and marks:
            ops = page_ops(reap["epoch"], page, marks, {"epoch": reap["epoch"], "owner": reap["owner"], "state": "marked",
                                                     # the marks' own time (decode_mark gives it back to each)
                                                     "marked_at_ns": max(int(m["marked_at_ns"]) for m in marks)},
                                  replaces)
        else:  # nothing marked (a dry run, or every captured version was gone): no items left
            ops = [Op("Delete", CHECKPOINT_PK, sk) for sk in replaces]
        items = self.marks_items()
        pages = {page_of(str(i["sk"])) for i in items if str(i["sk"]) not in replaces}
        pending = len(pages | ({page_prefix(reap["epoch"], page)} if write_marks and marks else set()))
        set_: dict[str, Any] = {"after": cursor, "page": page + 1}
        if through:
            set_["through"] = through
        if exhausted:
            set_["budget_exhausted"] = True
        ops += self._source_cursor_ops(cp, cursor, through, ended)
        if not more or pending >= int(cp["max_pending_pages"]):
            set_["listing_done"] = not more
            if cp["dry_run"]:
                set_["phase"] = self._after_blobs(cp) if cp["phase"] == "blobs" else "done"
            else:
                set_["phase"] = "settle"
                latest = max([int(m["marked_at_ns"]) for i in items if str(i["sk"]) not in replaces for m in i["marks"]]
                             + [int(m["marked_at_ns"]) for m in marks] + [0])
                set_["wait_until_ns"] = latest + int(self.settings.gc_grace_s) * _NS if latest else 0
        self._commit(reap, set_=set_, add={**counts, "c_marked": len(marks)}, ops=ops)
        crashpoints.point(CP_PAGE_DONE)
        return self._route(reap, {**cp, **set_})

    def _source_cursor_ops(self, cp: dict[str, Any], cursor: str, through: str | None, ended: bool) -> list[Op]:
        """Rule G-B1: the source's durable cursor moves with the page that proved the keys up to it,
        in the page's transaction (marks recorded first, so they are settled whatever happens next).
        ``by-time`` keeps its cursor (new hours come after it) and never moves it back; ``scan`` and
        an audit start their next pass from the beginning once a pass has ended."""
        sk = cp.get("source_cursor")
        if not sk or cp["dry_run"] or cp["phase"] != "mark":
            return []
        by_time = sk == source_cursor_sk("by-time")
        names = {"#a": "after", "#u": "updated_at_ns", "#ep": "epoch", "#end": "ended"}
        # ``ended``: the pass reached the source's end (G-B3: a scheduled audit GC proves a run once)
        values: dict[str, Any] = {":a": cursor if by_time or not ended else "", ":u": self.now(), ":ep": cp["epoch"],
                                  ":end": bool(ended)}
        expr = "SET #a = :a, #u = :u, #ep = :ep, #end = :end"
        if through:
            names["#t"], values[":t"] = "through", through
            expr += ", #t = :t"
        return [Op("Update", CHECKPOINT_PK, sk, expr, names, values,
                   "attribute_not_exists(#a) OR #a <= :a" if by_time else None)]

    def _after_blobs(self, cp: dict[str, Any]) -> str:
        return "derived" if cp["phase"] in ("blobs", "settle") and cp["mode"] == "retention" else "done"

    def _settle(self, reap: dict[str, Any], cp: dict[str, Any], collector: BlobCollector) -> dict[str, Any]:
        items = self.marks_items()
        now = self.now()
        if items:
            item = items[0]
            until = self._writer_may_run_until(item, reap, cp)
            if until > now:  # its markers may still be on their way: settle once they cannot be
                return self._wait(reap, cp, until)
            marks = item["marks"]
            not_due = [int(m["marked_at_ns"]) for m in marks if not collector.due(m, now)]
            if not_due:
                return self._wait(reap, cp, max(not_due) + int(self.settings.gc_grace_s) * _NS)
            add = settle_counts(collector.settle(marks, now_ns=now))
            self._commit(reap, add=add, ops=[Op("Delete", CHECKPOINT_PK, item["sk"])])
            crashpoints.point(CP_SETTLE_RECORDED)
            if len(items) > 1:
                return {"reap": reap, "next": "gc"}
        # Every recorded mark is settled: continue marking, or move on.
        if cp["mode"] == "gc":
            set_ = {"phase": "done" if cp.get("listing_done") else "mark", "wait_until_ns": 0}
        else:
            set_ = {"phase": "derived" if cp.get("listing_done") else "blobs", "wait_until_ns": 0}
            if cp.get("listing_done"):
                set_["after"] = ""
        self._commit(reap, set_=set_)
        return self._route(reap, {**cp, **set_})

    # -- the retention task ------------------------------------------------------------------------
    def retention(self, event: dict[str, Any]) -> dict[str, Any]:
        if "range" in event:  # an iteration of the Ranges Map: one key range's derived entries (reap.ranges)
            return RangeTask(self, event).derived()
        return self._counted(self._retention(event))

    def _retention(self, event: dict[str, Any]) -> dict[str, Any]:
        reap = event["reap"]
        cp = self.summary(reap)
        if self._task_of(cp["phase"]) != "retention":
            return self._route(reap, cp)  # a retried task whose step already committed: just route
        index = int(cp["hour_index"])
        if index >= len(cp["hours"]):
            self._commit(reap, set_={"phase": "done"})
            return {"reap": reap, "next": "finish"}
        hour = cp["hours"][index]
        scope = cp.get("scope") or "raw"
        fence = self.fence(reap)
        hr = HourRetention(self.ctx, UtcHour.parse(hour), scope, fence=fence, concurrency=int(cp["concurrency"]))
        phase, now = cp["phase"], self.now()
        # What follows the tombstone (and a verify pass): the hour's key ranges in parallel when its
        # plan has more than one (reap.ranges), else its blobs (rollups: its chunks).
        first = "chunks" if scope == "rollup" else "ranges" if int(cp.get("ranges") or 1) > 1 else "blobs"
        set_: dict[str, Any]
        add: dict[str, int] = {}
        if phase == "commit":
            if cp["dry_run"]:
                if scope == "raw":
                    keys, _ = hr.page("", 1000)
                else:
                    keys = [k for p in hr.chunk_prefixes() + [self.codec.rollup_manifest_hour(hr.hour)]
                            for k in self.ctx.store.list_page(p, max_keys=1000).keys]
                add = {"c_examined": len(keys), "c_deletable": len(keys)}
                set_ = self._next_hour(cp, hour, "would-reap")
            else:
                retention_s = self.settings.rollup_retention_s if scope == "rollup" else self.settings.retention_s
                try:
                    fence()
                    hr.commit(epoch=int(reap["epoch"]), retention_s=int(retention_s), now_ns=now)
                except WatermarkBehind:
                    set_ = self._next_hour(cp, hour, "skipped: watermark does not cover the hour")
                else:
                    set_ = {"phase": first, "after": "", "listing_done": False,
                            "wait_until_ns": now + int(cp["tombstone_wait_s"]) * _NS}
                    plan = hr.plan() if scope == "raw" else None
                    if plan is not None and plan.ranges > 1:
                        set_.update(phase="ranges", ranges=plan.ranges)
        elif phase == "ranges":
            return self._ranges(reap, cp, hour)
        elif phase in ("chunks", "manifests"):  # rollup scope: chunks and index first, manifests last
            prefixes = hr.chunk_prefixes() if phase == "chunks" else [self.codec.rollup_manifest_hour(hr.hour)]
            deleted, more = hr.delete_rollup_page(prefixes, int(cp["page_size"]))
            add = {"c_examined": deleted, "c_purged": deleted}
            set_ = {} if more else {"phase": "manifests" if phase == "chunks" else "verify"}
        elif phase in ("derived", "by-time"):  # "by-time": a checkpoint of a version that ran it apart
            # Steps 3 and 4 on one listing (rule R-I8): a page's accepted-by-blob entries, then its
            # accepted-by-time entries — only those this listing returned. Entries kept for an open
            # blocker stay: hence the cursor.
            keys, more = hr.page(cp.get("after") or "", int(cp["page_size"]))
            hr.delete_page(keys)
            set_ = {"after": keys[-1] if keys else cp.get("after") or ""}
            if not more:
                set_ = {"phase": "verify", "after": ""}
        elif phase == "verify":
            late, blocked = hr.leftovers() if scope == "raw" else ([] if hr.rollup_empty() else ["?"], [])
            if not late and not blocked:
                fence()
                hr.mark_reaped(epoch=int(reap["epoch"]), passes=int(cp["passes"]), now_ns=now)
                set_ = self._next_hour(cp, hour, "reaped")
            elif late and int(cp["passes"]) < int(cp["verify_passes"]):
                # Late writes: another pass over the hour (its blobs, then its derived entries).
                set_ = {"phase": first, "after": "", "listing_done": False, "passes": int(cp["passes"]) + 1}
            elif late:
                set_ = self._next_hour(cp, hour, "skipped: entries kept appearing")
            else:  # tombstoned, not reaped: a later run finishes it once the blockers are resumed or skipped
                set_ = self._next_hour(cp, hour, f"blocked: {len(blocked)} entries have an open {KIND_RETENTION} "
                                                 "blocker (lmctl blockers list)")
                known = list(cp.get("blocked") or [])
                set_["blocked"] = (known + [work_key(KIND_RETENTION, k) for k in blocked
                                            if work_key(KIND_RETENTION, k) not in known])[:REPORT_BLOCKED_MAX]
        else:
            raise InvalidReapInput(f"reap-retention cannot run phase {phase!r}")
        self._commit(reap, set_=set_, add=add)
        crashpoints.point(CP_STEP_DONE)
        return self._route(reap, {**cp, **set_})

    def _next_hour(self, cp: dict[str, Any], hour: str, status: str) -> dict[str, Any]:
        statuses = dict(cp.get("hour_status") or {})
        statuses[hour] = status
        last = int(cp["hour_index"]) + 1 >= len(cp["hours"])
        out = {"hour_status": statuses, "hour_index": int(cp["hour_index"]) + 1, "passes": 1, "after": "",
               "listing_done": False, "wait_until_ns": 0, "phase": "done" if last else "commit"}
        if int(cp.get("ranges") or 1) > 1:
            out["ranges"] = 1  # the next hour's commit reads its own plan
        return out

    # -- an hour in key ranges (reap.ranges; docs/protocol.md §16) -------------------------------------
    def _ranges(self, reap: dict[str, Any], cp: dict[str, Any], hour: str) -> dict[str, Any]:
        """The hour's task between visits of the Ranges Map: the ranges with work now go to the next
        visit; if every range waits (a grace, rule L3), the execution waits for the first; once every
        range is done, their counters are folded into the summary, their items deleted, and the hour
        goes on to verify."""
        epoch, passes, ranges = int(reap["epoch"]), int(cp["passes"]), int(cp["ranges"])
        items = read_ranges(self.table, epoch, hour, passes)
        ready, waits = plan_visit(items, ranges, self.now())
        if ready:
            job = {"hour": hour, "passes": passes, "ranges": ranges, "page_size": int(cp["page_size"]),
                   "concurrency": int(cp["concurrency"]), "max_pending_pages": int(cp["max_pending_pages"]),
                   "owned_since_ns": int(cp.get("owned_since_ns") or 0)}
            return {"reap": reap, "next": "ranges", "ranges": ready, "range_job": job,
                    "range_parallelism": int(cp.get("range_parallelism") or DEFAULT_RANGE_PARALLELISM)}
        if waits:
            return self._wait(reap, cp, min(waits))  # recorded: a continuation's Begin waits too
        set_ = {"phase": "verify", "after": "", "wait_until_ns": 0}
        deletes = [Op("Delete", RANGE_PK, str(i["sk"])) for i in items.values()]
        n = FOLD_DELETES_PER_TRANSACTION
        self._commit(reap, set_=set_, add=folded(items), ops=deletes[:n])
        crashpoints.point(CP_RANGES_FOLDED)
        for i in range(n, len(deletes), n):  # a crash here leaves items of a finished pass: never read again
            self._commit(reap, ops=deletes[i:i + n])
        return self._route(reap, {**cp, **set_})

    # -- end ---------------------------------------------------------------------------------------
    def end(self, event: dict[str, Any]) -> dict[str, Any]:
        reap, outcome = event["reap"], event.get("outcome", "failed")
        try:
            cp = self.summary(reap)
        except LeaseLost:
            return {"status": "lease-lost", "epoch": reap.get("epoch")}
        now = self.now()
        set_: dict[str, Any] = {"status": "finished" if outcome == "finished" else "failed", "finished_at_ns": now}
        if outcome != "finished":
            set_["error"] = json.dumps(event.get("error"), sort_keys=True, default=str)[:2000]
        self._commit(reap, set_=set_, lease=leases.release(LEASE_PK, reap["owner"], reap["epoch"], now))
        report = report_of({**cp, **set_})
        for name in ("purged", "restored", "marked"):
            if report[name]:
                self.ctx.metrics.add_metric(name=f"Reap{name.capitalize()}", unit="Count", value=report[name])
        log.info("reap %s epoch %s %s: %s", reap["mode"], reap["epoch"], set_["status"], report)
        return report


__all__ = ["CP_CONTINUATION_BEGUN", "CP_CONTINUED", "CP_INTENT", "CP_PAGE_DONE", "CP_SETTLE_RECORDED", "CP_STEP_DONE",
           "REPORT_BLOCKED_MAX", "Reaper"]
