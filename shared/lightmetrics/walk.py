"""The bootstrap walk: complete, resumable cold reconciliation (docs/protocol.md §13; docs/walks.md).

Events and derived entries can be lost, and the steady-state reconciler cannot discover a
missing ``accepted-by-time`` entry (that index is its input). The walk can: it enumerates the
partitions of ``accepted/v1/`` and ``quarantine/v1/identity-conflict/`` (agent, then boot, with
``Delimiter``), lists each partition *from its beginning* in pages and repairs every key that needs
it with the same code as the reconciler and the event path —
:func:`~lightmetrics.indexing.repair_accepted` and :func:`~lightmetrics.indexing.index_quarantine`
under :func:`~lightmetrics.work.run_unit`. An acceptance record needs it only when its
``accepted-by-time`` entry is missing; a record of a reaped hour is not probed at all
(:class:`RecordChecks`, docs/protocol.md §13 W4, W5).

It runs on Step Functions (``infra/statemachines/bootstrap_walk.asl.json``); each Lambda task is
one method of :class:`Walker`:

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

Control-table records (docs/control-table.md): the lease ``lease#walk``/``lease``; the summary
``checkpoint#walk``/``current`` (full walks; ``checkpoint#walk#agent=<agent-hex>`` for walks
scoped to one agent) and one ``part#<partition>`` item per partition in progress (its cursor and
counters); the watermarks ``watermark#<index>``/``current``. Every write is conditional on the
walk's ``epoch`` and ``owner``; a resume re-stamps the owner of the summary and the partitions in
progress in one transaction, so a run that lost the walk cannot move a cursor.

Example (what ``lmctl walk start --wait`` does)::

    >>> control = WalkControl(ctx, sfn_client, state_machine_arn)              # doctest: +SKIP
    >>> started = control.start(page_size=500)                                 # doctest: +SKIP
    >>> control.follow(started).status                                         # doctest: +SKIP
    'finished'
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from botocore.exceptions import ClientError

from lightmetrics import leases
from lightmetrics.config import longest_accept_s
from lightmetrics.control_table import ConditionFailed, ControlTable, Op, TransactionCancelled
from lightmetrics.errors import KeyLayoutError
from lightmetrics.leases import OWNED, Fence, LeaseError, LeaseHeld, LeaseLost, task_lease_rule_broken
from lightmetrics.identity import id_to_hex, validate_id
from lightmetrics.indexing import KIND_QUARANTINE, KIND_REPAIR, index_quarantine, repair_accepted, tombstones
from lightmetrics.keys import KeyKind, UtcHour
from lightmetrics.outcome import Outcome
from lightmetrics.pricing import PRICE_TABLE
from lightmetrics.store import ListPage, TransientStoreError
from lightmetrics.work import WorkContext, run_unit

log = logging.getLogger(__name__)
_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="lm-walk")
_NS = 1_000_000_000

LEASE_PK, LEASE_SK = "lease#walk", "lease"
CHECKPOINT_SK = "current"
#: The derived indexes the walk repairs; each has its own completeness watermark.
INDEXES = ("accepted-by-time", "accepted-by-blob", "raw-blobs-by-time", "quarantine-by-blob")
#: What a walk that is not ``full`` proves complete (W3, W5): it checks each record's time entry
#: (repairing what is missing) and repairs every quarantine manifest in full; a record's blob entry
#: and its blob's entry follow from a present time entry only for entries written under D5/D6
#: (protocol §17 E7), so only a full walk vouches for those two indexes.
PRESENCE_WALK_INDEXES = ("accepted-by-time", "quarantine-by-blob")
#: Outcome counters of a walk (``SKIPPED``: an operator skipped the key's blocker).
OUTCOMES = ("DONE", "NOOP_RESOLVED", "RETRY_LATER", "BLOCKED", "SKIPPED")
#: How a key counted NOOP_RESOLVED was settled without a unit of work (rules W4, W5): ``present``
#: — its ``accepted-by-time`` entry exists; ``reaped`` — its hour is tombstoned, nothing probed.
#: Partition items and the summary keep them as ``keys_present`` and ``keys_reaped``.
KEY_CHECKS = ("present", "reaped")

# --- input limits and defaults (docs/walks.md, "Console input") --------------------------------------
# A page task lists up to page_size keys in ListObjectsV2 calls of at most 1,000 each: a bigger page
# costs fewer tasks and state transitions per key (most keys of a year-old bucket are in reaped
# hours and cost nothing but their listing, rule W4). 10,000 keys whose entries are all missing
# take ~60 s to repair at 16 at a time, well inside the page task's 300 s.
DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, LIST_MAX_KEYS = 1000, 10_000, 1000
DEFAULT_PARALLELISM, MAX_PARALLELISM = 4, 10  # the ASL's Map MaxConcurrency is 10
DEFAULT_MAX_ROUNDS = 100
DEFAULT_LEASE_S, MAX_LEASE_S = 900, 86400
MIN_LEASE_S = 60  # the input's range; rule L1 (min_lease_s of the walk's tasks) is checked on top
INPUT_FIELDS = ("agent", "resume", "full", "page_size", "parallelism", "max_rounds_per_execution", "lease_seconds")

# --- the execution history bound (docs/walks.md, "History") ------------------------------------------
#: Step Functions' hard limit per standard execution, and the budget the walk plans with.
HISTORY_LIMIT, HISTORY_BUDGET = 25_000, 20_000
#: Events outside the rounds: start, Begin, the last Plan and Route, Continue or Finish, the end
#: state, and the Abort path — each task with its worst case of retries.
EVENTS_FIXED = 100
#: Per round: Plan (5 events + up to 5 retries of 3 events), Route (2), the Map's own 4 events ...
EVENTS_PER_ROUND = 5 + 15 + 2 + 4
#: ... and per page: 7 events (iteration, task, Lambda) plus 3 per retry, at most 6 + 3 retries.
EVENTS_PER_PAGE = 7 + 3 * (6 + 3)


def history_bound(parallelism: int, rounds: int) -> int:
    """Most history events an execution of ``rounds`` rounds of ``parallelism`` pages can have."""
    return EVENTS_FIXED + rounds * (EVENTS_PER_ROUND + parallelism * EVENTS_PER_PAGE)


def max_rounds_for(parallelism: int) -> int:
    """The most rounds one execution may run and stay inside :data:`HISTORY_BUDGET`."""
    return (HISTORY_BUDGET - EVENTS_FIXED) // (EVENTS_PER_ROUND + parallelism * EVENTS_PER_PAGE)


# --- what a page checks per acceptance record (docs/protocol.md §13 W4, W5) -------------------------
def boundary_margin_ns(settings: Any) -> int:
    """Rule W4: how far a record's ``accepted_at_unix_ns`` (the ingest host's clock, taken before its
    create) may lie from the record's listed ``LastModified`` (S3's clock when the create began,
    whole seconds): the longest accept (the ingest function's timeout) plus ``LM_CLOCK_SKEW_S``,
    plus the second ``LastModified`` truncates. Rule H1 (docs/protocol.md §15) uses the same bound.

    >>> boundary_margin_ns(type("S", (), {"clock_skew_s": 60})()) // 1_000_000_000
    121
    """
    return (longest_accept_s() + int(settings.clock_skew_s) + 1) * _NS


def candidate_hours(last_modified_ns: int, margin_ns: int) -> list[UtcHour]:
    """The hours a record listed with ``last_modified_ns`` can have been accepted in (rule W4): the
    hour of its ``LastModified`` first, then the adjacent hour when that lies within the margin.

    >>> [str(h) for h in candidate_hours(3600 * 10**9 - 10**9, 121 * 10**9)]
    ['1970-01-01T00', '1970-01-01T01']
    """
    own = UtcHour.of_unix_ns(last_modified_ns)
    out = [own]
    for edge in (last_modified_ns - margin_ns, last_modified_ns + margin_ns):
        hour = UtcHour.of_unix_ns(edge)
        if hour not in out:
            out.append(hour)
    return out


def list_beats_heads(entries: int) -> bool:
    """Whether one ``ListObjectsV2`` (billed like a PUT: 12.5 HEADs at list prices) is cheaper than a
    HEAD for each of ``entries`` index entries (rule W5)."""
    return entries * PRICE_TABLE.price("s3.get_per_1000") > PRICE_TABLE.price("s3.put_per_1000")


# --- errors: the class name is the Step Functions error name (Retry / Catch in the ASL) -----------------
class WalkError(Exception):
    """Base of the errors a walk task raises on purpose."""


class NothingToResume(WalkError):
    """``resume`` was asked for but the last walk of that scope finished (or never ran)."""


class InvalidWalkInput(WalkError):
    """The execution input is not a walk input (docs/walks.md)."""


class WalkRetryLater(WalkError):
    """Keys of this page ended RETRY_LATER: the cursor did not move; retry the page later."""


class WalkTransient(WalkError):
    """S3 or DynamoDB failed transiently outside a unit of work; retry the task."""


def checkpoint_pk(agent_hex: str | None) -> str:
    return "checkpoint#walk" if agent_hex is None else f"checkpoint#walk#agent={agent_hex}"


def watermark_pk(index: str) -> str:
    return f"watermark#{index}"


def plain(value: Any) -> Any:
    """DynamoDB values (nested Decimals) as plain JSON types."""
    if isinstance(value, Decimal):
        return int(value) if value == int(value) else float(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


@dataclass(frozen=True)
class WalkParams:
    """A validated execution input (every field optional; unknown fields are refused)."""

    agent: str | None = None
    resume: bool = False
    #: repair every key in full (W5's presence check skipped): after derived entries were deleted
    #: behind the system's back, which a present accepted-by-time entry does not reveal
    full: bool = False
    page_size: int = DEFAULT_PAGE_SIZE
    parallelism: int = DEFAULT_PARALLELISM
    max_rounds: int = DEFAULT_MAX_ROUNDS
    lease_s: int = DEFAULT_LEASE_S

    @classmethod
    def parse(cls, raw: Any) -> "WalkParams":
        if not isinstance(raw, dict):
            raise InvalidWalkInput("the execution input must be a JSON object")
        unknown = set(raw) - set(INPUT_FIELDS)
        if unknown:
            raise InvalidWalkInput(f"unknown input fields {sorted(unknown)}; known: {list(INPUT_FIELDS)}")
        agent = raw.get("agent")
        if agent in ("", None):
            agent = None
        else:
            try:
                agent = validate_id(agent, "agent")
            except Exception as exc:
                raise InvalidWalkInput(f"agent: {exc}") from None
        resume = raw.get("resume", False)
        if not isinstance(resume, bool):
            raise InvalidWalkInput("resume must be true or false")
        full = raw.get("full", False)
        if not isinstance(full, bool):
            raise InvalidWalkInput("full must be true or false")

        def integer(name: str, default: int, low: int, high: int) -> int:
            v = raw.get(name)
            if v is None:
                return default
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise InvalidWalkInput(f"{name} must be an integer in [{low}, {high}]")
            return v

        parallelism = integer("parallelism", DEFAULT_PARALLELISM, 1, MAX_PARALLELISM)
        limit = max_rounds_for(parallelism)
        lease_s = integer("lease_seconds", DEFAULT_LEASE_S, MIN_LEASE_S, MAX_LEASE_S)
        broken = task_lease_rule_broken(lease_s, TASK_STEPS)
        if broken:
            raise InvalidWalkInput(broken)
        return cls(
            agent=agent,
            resume=resume,
            full=full,
            page_size=integer("page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE),
            parallelism=parallelism,
            max_rounds=min(integer("max_rounds_per_execution", DEFAULT_MAX_ROUNDS, 1, 10**6), limit),
            lease_s=lease_s,
        )

    @property
    def agent_hex(self) -> str | None:
        return None if self.agent is None else id_to_hex(self.agent)


_OWNED = OWNED
PART_PREFIX = "part#"


# --- the walk's lease (lightmetrics.leases; docs/protocol.md §13, L1-L3) ----------------------------------
def describe_lease(lease: dict[str, Any], now_ns: int) -> str:
    return leases.describe(lease, now_ns, "walk")


def _owned(walk: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    return {"#own": "owner", "#ep": "epoch"}, {":own": walk["owner"], ":ep": walk["epoch"]}


def _counters() -> dict[str, Any]:
    return {"keys": 0, "pages": 0, "outcomes": {o: 0 for o in OUTCOMES}, **{f"keys_{c}": 0 for c in KEY_CHECKS}}


def read_walk(table: ControlTable, pk: str, *, leftovers: list[dict[str, Any]] | None = None
              ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The walk checkpoint of one scope: its summary (``current``) and its partition items
    (``part#<partition>``, the cursors of partitions in progress), with one Query. Partition
    items of an older, unfinished epoch are left out (appended to ``leftovers`` if given)."""
    summary, parts = None, []
    for item in table.query(pk):
        item = plain(item)
        if item["sk"] == CHECKPOINT_SK:
            summary = item
        elif item["sk"].startswith(PART_PREFIX):
            parts.append(item)
    epoch = (summary or {}).get("epoch")
    if leftovers is not None:
        leftovers.extend(p for p in parts if p.get("epoch") != epoch)
    return summary, [p for p in parts if p.get("epoch") == epoch]


class RecordChecks:
    """Which acceptance records of one page need a repair (docs/protocol.md §13 W4, W5).

    Built from the page's keys and their listed ``LastModified``: every candidate hour (rule W4)
    gets its retention tombstone checked (``indexing.tombstones``: one HEAD per hour per process);
    a key all of whose candidate hours are tombstoned is ``reaped`` and never probed. For the rest,
    per (hour, boot) group, one ``ListObjectsV2`` of ``accepted-by-time/v1/<hour>/<agent>.<boot>.``
    when that is cheaper than a HEAD per key (:func:`list_beats_heads`), done here; else
    :meth:`settle` HEADs the key's entry in each open candidate hour. A key whose entry is found is
    ``present``; :meth:`settle` returns None for a key to repair in full. A key outside the layout
    is never settled here: its repair makes it a blocker.

    Example (inside ``Walker.page``)::

        >>> checks = RecordChecks(walker, [(key, last_modified_ns)])           # doctest: +SKIP
        >>> checks.settle(key)                                                 # doctest: +SKIP
        'present'
    """

    def __init__(self, walker: "Walker", listed: list[tuple[str, int]]) -> None:
        self.store, codec = walker.ctx.store, walker.codec
        margin = boundary_margin_ns(walker.settings)
        cache = tombstones(walker.ctx)
        self.reaped: set[str] = set()
        #: key -> its entry key in each open candidate hour, with that hour's group prefix
        self.entries: dict[str, list[tuple[str, str]]] = {}
        groups: dict[str, list[str]] = defaultdict(list)
        for key, last_modified in listed:
            try:
                parsed = codec.parse(key)
            except KeyLayoutError:
                continue
            if parsed.kind is not KeyKind.ACCEPTED or parsed.identity is None:
                continue
            ident = parsed.identity
            hours = [h for h in candidate_hours(last_modified, margin) if not cache.is_tombstoned("raw", h)]
            if not hours:
                self.reaped.add(key)  # every hour it can belong to is reaped (or being reaped): D1
                continue
            self.entries[key] = []
            for hour in hours:
                prefix = f"{codec.accepted_by_time_hour(hour)}{ident.agent_hex}.{ident.boot_hex}."
                entry = codec.accepted_by_time(hour, ident)
                self.entries[key].append((prefix, entry))
                groups[prefix].append(entry)
        #: group prefix -> the entries its LIST found (only groups that were listed)
        self.listed: dict[str, set[str]] = {}
        for prefix, entries in groups.items():
            if list_beats_heads(len(entries)):
                try:
                    self.listed[prefix] = self._list(prefix, min(entries), max(entries))
                except TransientStoreError:
                    pass  # HEAD them instead; a failing HEAD leaves the key to its full repair

    def _list(self, prefix: str, first: str, last: str) -> set[str]:
        """The entries under ``prefix`` from ``first`` to ``last``: entry names sort like the records'
        keys (fixed-width sequence numbers), so one page's keys span at most one page of entries."""
        found: set[str] = set()
        after = first[:-1]  # a proper prefix of ``first``: sorts right before it
        while True:
            page = self.store.list_page(prefix, max_keys=1000, start_after=after)  # type: ignore[attr-defined]
            found.update(page.keys)
            if not page.truncated or not page.keys or page.keys[-1] >= last:
                return found
            after = page.keys[-1]

    def settle(self, key: str) -> str | None:
        """``"reaped"``, ``"present"``, or None: repair ``key`` in full."""
        if key in self.reaped:
            return "reaped"
        candidates = self.entries.get(key)
        if candidates is None:
            return None
        if any(entry in self.listed[prefix] for prefix, entry in candidates if prefix in self.listed):
            return "present"
        for prefix, entry in candidates:
            if prefix in self.listed:
                continue
            try:
                if self.store.head(entry) is not None:
                    return "present"
            except TransientStoreError:
                return None
        return None


class Walker:
    """The walk's Lambda tasks (one method each) over a :class:`WorkContext`.

    Checkpoint layout: the summary ``checkpoint#walk[...]``/``current`` (epoch, owner, status,
    enumeration state, totals of finished partitions) is written by one task at a time (Begin,
    Plan, End). Each partition in progress has its own item ``.../part#<partition>`` holding its
    cursor and counters, written by its page task only, so concurrent pages never contend for one
    item; Plan folds a finished partition into the summary and deletes its item, atomically.
    """

    def __init__(self, ctx: WorkContext, settings: Any, *, sfn_client: Any = None) -> None:
        self.ctx, self.settings = ctx, settings
        self.table: ControlTable = ctx.extras["table"]
        self.codec = ctx.codec
        self._sfn = sfn_client

    # -- helpers -----------------------------------------------------------------------------------
    def now(self) -> int:
        return self.ctx.clock.now_ns()

    def lease(self) -> dict[str, Any] | None:
        item = self.table.get(LEASE_PK, LEASE_SK)
        return plain(item) if item else None

    def _renew(self, walk: dict[str, Any], now: int, **extra: Any) -> Op:
        return leases.renewal_of(LEASE_PK, walk, now, **extra)

    def _roots(self, agent_hex: str | None) -> list[dict[str, Any]]:
        """The enumeration queue's start: the two roots, at the agents level or one agent's boots."""
        roots = [self.codec.accepted_root(), self.codec.quarantine_root()]
        if agent_hex is None:
            return [{"prefix": r, "level": "agents", "token": None} for r in roots]
        return [{"prefix": f"{r}agent={agent_hex}/", "level": "boots", "token": None} for r in roots]

    def _describe_lease(self, lease: dict[str, Any]) -> str:
        return describe_lease(lease, self.now())

    def _kind(self, partition: str) -> str:
        return "quarantine" if partition.startswith(self.codec.quarantine_root()) else "accepted"

    # -- begin -------------------------------------------------------------------------------------
    def begin(self, event: dict[str, Any]) -> dict[str, Any]:
        inp = event.get("input") or {}
        execution, machine = event.get("execution_arn", ""), event.get("state_machine_arn", "")
        if isinstance(inp, dict) and "continuation" in inp:
            return self._begin_continuation(inp["continuation"], execution)
        params = WalkParams.parse(inp)
        now = self.now()
        lease = self.lease()
        if leases.is_live(lease, now):
            raise LeaseHeld(self._describe_lease(lease or {}))
        cp_pk = checkpoint_pk(params.agent_hex)
        cp, parts = read_walk(self.table, cp_pk)
        if params.resume:
            if cp is None or cp.get("status") == "finished":
                raise NothingToResume(f"no unfinished walk to resume for {cp_pk} "
                                      f"(last status: {cp.get('status') if cp else 'never ran'})")
            epoch = int(cp["epoch"])
            # A resume keeps the walk's page size, parallelism and mode unless the input changes them.
            kept = {k: cp[k] for k in ("page_size", "parallelism", "full") if k in cp and inp.get(k) is None}
            if kept:
                params = WalkParams.parse({**inp, **kept})
        else:
            epoch = int((lease or {}).get("last_epoch", (lease or {}).get("epoch", 0))) + 1
        owner = uuid.uuid4().hex
        scope = "all" if params.agent is None else f"agent={params.agent_hex}"
        leases.take(self.table, LEASE_PK, lease, owner=owner, lease_seconds=params.lease_s, now_ns=now, what="walk",
                    epoch=epoch, execution=execution, scope=scope, checkpoint_pk=cp_pk)
        walk = {
            "scope": scope, "agent": params.agent, "checkpoint_pk": cp_pk, "epoch": epoch, "owner": owner,
            "page_size": params.page_size, "parallelism": params.parallelism, "max_rounds": params.max_rounds,
            "full": params.full, "lease_seconds": params.lease_s, "state_machine_arn": machine, "execution_arn": execution, "round": 0,
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
                      {":own": owner, ":running": "running", ":x": execution, ":now": now, ":one": 1,
                       ":rb": summarize(cp, parts, now)["keys"], ":ps": params.page_size,
                       ":par": params.parallelism, ":ep": epoch},
                      "#ep = :ep")]
            ops += [Op("Update", cp_pk, p["sk"], "SET #own = :own", {"#own": "owner", "#ep": "epoch"},
                       {":own": owner, ":ep": epoch}, "#ep = :ep") for p in parts[:90]]
            try:
                self.table.transact(ops)
            except TransactionCancelled:
                raise NothingToResume(f"{cp_pk} changed while resuming; start again") from None
            walk["executions"] = int(cp.get("executions", 0)) + 1
        else:
            self.table.put(self._fresh_checkpoint(walk, now), condition="attribute_not_exists(pk) OR epoch < :e",
                           values_for_condition={":e": epoch})
            walk["executions"] = 1
        log.info("walk %s epoch %d begins (%s)", scope, epoch, "resume" if params.resume else "new epoch")
        return {"walk": walk}

    def _fresh_checkpoint(self, walk: dict[str, Any], now: int) -> dict[str, Any]:
        return {
            "pk": walk["checkpoint_pk"], "sk": CHECKPOINT_SK, "epoch": walk["epoch"], "owner": walk["owner"],
            "scope": walk["scope"], "agent": walk["agent"], "status": "running", "started_at_ns": now,
            "updated_at_ns": now, "rate_since_ns": now, "rate_keys_base": 0, "page_size": walk["page_size"],
            "full": bool(walk.get("full", False)),
            "parallelism": walk["parallelism"], "execution": walk["execution_arn"], "executions": 1, "resumes": 0,
            "enum": {"queue": self._roots(id_to_hex(walk["agent"]) if walk["agent"] else None), "done": False},
            "partitions_found": 0, "partitions_done": 0, "keys_accepted": 0, "keys_quarantine": 0, **_counters(),
        }

    def _begin_continuation(self, cont: Any, execution: str) -> dict[str, Any]:
        required = ("scope", "agent", "checkpoint_pk", "epoch", "owner", "page_size", "parallelism", "max_rounds",
                    "lease_seconds", "state_machine_arn", "executions")
        if not isinstance(cont, dict) or any(k not in cont for k in required):
            raise InvalidWalkInput(f"continuation must carry {list(required)}")
        walk = {k: cont[k] for k in required}
        walk["full"] = bool(cont.get("full", False))
        now = self.now()
        walk.update(execution_arn=execution, round=0, executions=int(cont["executions"]) + 1)
        names, values = _owned(walk)
        try:
            self.table.transact([
                self._renew(walk, now, execution=execution),
                Op("Update", walk["checkpoint_pk"], CHECKPOINT_SK, "SET #x = :x, #u = :now ADD #n :one",
                   {**names, "#x": "execution", "#u": "updated_at_ns", "#n": "executions"},
                   {**values, ":x": execution, ":now": now, ":one": 1}, _OWNED),
            ])
        except TransactionCancelled:
            raise LeaseLost(f"epoch {walk['epoch']} no longer owns the walk lease; not continuing") from None
        return {"walk": walk}

    # -- plan --------------------------------------------------------------------------------------
    def plan(self, event: dict[str, Any]) -> dict[str, Any]:
        walk = dict(event["walk"])
        pk = walk["checkpoint_pk"]
        leftovers: list[dict[str, Any]] = []  # partition items of an unfinished older epoch
        cp, parts = read_walk(self.table, pk, leftovers=leftovers)
        if cp is None or cp.get("owner") != walk["owner"] or int(cp.get("epoch", -1)) != walk["epoch"]:
            raise LeaseLost(f"checkpoint {pk} is no longer epoch {walk['epoch']} of this run")
        now = self.now()
        finished = [p for p in parts if p.get("done")]
        active = {p["partition"]: p for p in parts if not p.get("done")}
        enum = cp.get("enum") or {"queue": [], "done": True}
        need = int(walk["parallelism"]) - len(active)
        new: list[str] = []
        strays: Counter[str] = Counter()
        if need > 0 and not enum.get("done"):
            new, stray_keys = self._enumerate(enum, need)
            if stray_keys:
                skipped_strays = {b.object_key for b in self.ctx.blockers.list(status="skipped")}
                strays = Counter("SKIPPED" if k in skipped_strays else self._repair(k).value for k in stray_keys)

        # Fold finished partitions (and the strays) into the summary, start the new ones.
        folded = Counter({o: sum(int(p["outcomes"].get(o, 0)) for p in finished) for o in OUTCOMES}) + strays
        by_kind = Counter()
        for p in finished:
            by_kind[p.get("kind", "accepted")] += int(p.get("keys", 0))
        names, values = _owned(walk)
        names.update({"#en": "enum", "#u": "updated_at_ns", "#pd": "partitions_done", "#pf": "partitions_found",
                      "#k": "keys", "#pg": "pages", "#ka": "keys_accepted", "#kq": "keys_quarantine"})
        values.update({":en": enum, ":now": now, ":fd": len(finished), ":nf": len(new),
                       ":k": sum(int(p.get("keys", 0)) for p in finished) + sum(strays.values()),
                       ":pg": sum(int(p.get("pages", 0)) for p in finished),
                       ":ka": by_kind["accepted"] + sum(strays.values()), ":kq": by_kind["quarantine"]})
        adds = ["#pd :fd", "#pf :nf", "#k :k", "#pg :pg", "#ka :ka", "#kq :kq"]
        for check in KEY_CHECKS:
            names[f"#c{check}"], values[f":c{check}"] = f"keys_{check}", sum(int(p.get(f"keys_{check}", 0))
                                                                              for p in finished)
            adds.append(f"#c{check} :c{check}")
        if folded:
            names["#o"] = "outcomes"
        for i, (outcome, n) in enumerate(sorted(folded.items())):
            names[f"#oc{i}"], values[f":oc{i}"] = outcome, n
            adds.append(f"#o.#oc{i} :oc{i}")
        ops = [self._renew(walk, now),
               Op("Update", pk, CHECKPOINT_SK, "SET #en = :en, #u = :now ADD " + ", ".join(adds), names, values,
                  _OWNED)]
        pnames, pvalues = _owned(walk)
        ops += [Op("Delete", pk, p["sk"], names=pnames, values=pvalues, condition=_OWNED) for p in finished]
        new_sks = {PART_PREFIX + p for p in new}
        for partition in new:
            ops.append(Op("Put", pk, PART_PREFIX + partition, names={"#ep": "epoch"}, values={":ep": walk["epoch"]},
                          condition="attribute_not_exists(pk) OR #ep < :ep",
                          item={"partition": partition, "kind": self._kind(partition), "after": "", "done": False,
                                "epoch": walk["epoch"], "owner": walk["owner"], "updated_at_ns": now,
                                **_counters()}))
        room = 90 - len(ops)
        ops += [Op("Delete", pk, p["sk"]) for p in leftovers if p["sk"] not in new_sks][:max(0, room)]
        try:
            self.table.transact(ops)
        except TransactionCancelled:
            raise LeaseLost(f"epoch {walk['epoch']} lost the walk lease") from None
        for p in new:
            active[p] = {"partition": p, "after": ""}
        if not active:
            return {"walk": walk, "next": "finish", "work": []}
        if int(walk["round"]) >= int(walk["max_rounds"]):
            return {"walk": walk, "next": "continue", "work": []}
        walk["round"] = int(walk["round"]) + 1
        # Keys whose blocker an operator skipped (few by design: each is an incident) are not
        # walked but counted. Read once per round here rather than once per page.
        skipped = sorted({b.object_key for b in self.ctx.blockers.list(status="skipped")})
        work = [{"partition": p, "after": f.get("after", ""), "skipped": [k for k in skipped if k.startswith(p)],
                 **({"failed_through": f["failed_through"]} if f.get("failed_through") else {})}
                for p, f in sorted(active.items())]
        return {"walk": walk, "next": "pages", "work": work}

    def _enumerate(self, enum: dict[str, Any], need: int) -> tuple[list[str], list[str]]:
        """Up to ``need`` more partitions, depth first (agents, then their boots); mutates ``enum``.

        Keys that sit where a partition should be (``accepted/v1/x.json``) are returned as strays:
        they are outside the layout and become blockers, never silent skips.
        """
        out: list[str] = []
        strays: list[str] = []
        queue: list[dict[str, Any]] = enum["queue"]
        while len(out) < need and queue:
            head = queue[0]
            boots = head["level"] == "boots"
            page = self.ctx.store.list_page(  # type: ignore[attr-defined]
                head["prefix"], delimiter="/", max_keys=(need - len(out)) if boots else 100,
                continuation_token=head.get("token"),
            )
            strays.extend(page.keys)
            if page.truncated and page.next_token:
                head["token"] = page.next_token
            else:
                queue.pop(0)
            if boots:
                out.extend(page.prefixes)
            else:
                queue[0:0] = [{"prefix": p, "level": "boots", "token": None} for p in page.prefixes]
        enum["done"] = not queue
        return out, strays

    def _repair(self, key: str, *, previously_failed: bool = False) -> Outcome:
        if key.startswith(self.codec.quarantine_root()):
            kind, fn = KIND_QUARANTINE, index_quarantine
        else:
            kind, fn = KIND_REPAIR, repair_accepted
        return run_unit(self.ctx, kind=kind, object_key=key, source="walk", fn=lambda: fn(self.ctx, key),
                        previously_failed=previously_failed).outcome

    # -- page --------------------------------------------------------------------------------------
    def _list(self, partition: str, page_size: int, after: str) -> ListPage:
        """Up to ``page_size`` keys of ``partition`` after ``after``, in listings of at most 1,000."""
        keys: list[str] = []
        sizes: list[int] = []
        modified: list[int] = []
        while True:
            part = self.ctx.store.list_page(  # type: ignore[attr-defined]
                partition, max_keys=min(LIST_MAX_KEYS, page_size - len(keys)), start_after=(keys[-1] if keys else after) or None)
            keys += part.keys
            sizes += part.sizes
            modified += part.last_modified_ns if len(part.last_modified_ns) == len(part.keys) else []
            if not part.truncated or len(keys) >= page_size or not part.keys:
                truncated = part.truncated and bool(part.keys)
                break
        if len(modified) != len(keys):
            modified = []  # a listing without LastModified: every key is repaired in full
        return ListPage(keys=keys, sizes=sizes, prefixes=[], truncated=truncated, last_modified_ns=modified)

    def page(self, event: dict[str, Any]) -> dict[str, Any]:
        walk, item = event["walk"], event["item"]
        partition, after = item["partition"], item.get("after") or ""
        pk, sk = walk["checkpoint_pk"], PART_PREFIX + partition
        retried = int(event.get("retry_count") or 0) > 0
        # O1a: the last key of a page of this partition that ended RETRY_LATER in this epoch (an
        # earlier execution's, before a resume): keys up to it may have a failure on record.
        failed_through = item.get("failed_through") or ""
        skipped = set(item.get("skipped") or ())
        listing = self._list(partition, int(walk["page_size"]), after)
        keys = listing.keys

        def failed_before(key: str) -> bool:
            return retried or key <= failed_through

        # Rules W4, W5: an acceptance record is probed for its accepted-by-time entry only; a key
        # that may have failed before (a retried page, or up to ``failed_through``) is repaired in
        # full, so its success clears its budget (O1a).
        checks = RecordChecks(self, [(k, lm) for k, lm in zip(keys, listing.last_modified_ns)
                                     if k not in skipped and not failed_before(k)]) \
            if not retried and not walk.get("full") and self._kind(partition) == "accepted" \
            and len(listing.last_modified_ns) == len(keys) else None

        def one(key: str) -> tuple[str, str | None]:
            if key in skipped:
                return "SKIPPED", None  # an operator decided; counted, so no watermark from this walk
            settled = checks.settle(key) if checks is not None and not failed_before(key) else None
            if settled is not None:
                return Outcome.NOOP_RESOLVED.value, settled
            return self._repair(key, previously_failed=failed_before(key)).value, None

        if len(keys) > 1:
            futures = [_POOL.submit(contextvars.copy_context().run, one, k) for k in keys]  # the caller's context
            results = [f.result() for f in futures]
        else:
            results = [one(k) for k in keys]
        outcomes = Counter(outcome for outcome, _ in results)
        settled_by = Counter(check for _, check in results if check is not None)
        names, values = _owned(walk)
        now = self.now()
        if outcomes["RETRY_LATER"]:
            try:
                # ``failed_through`` survives the execution: a resumed page repairs those keys in
                # full, whichever page size it runs with (O1a).
                self.table.update(pk, sk, "ADD #o.#r :n SET #u = :now, #ft = :ft",
                                  names={**names, "#o": "outcomes", "#r": "RETRY_LATER", "#u": "updated_at_ns",
                                         "#ft": "failed_through"},
                                  values={**values, ":n": outcomes["RETRY_LATER"], ":now": now,
                                          ":ft": max(failed_through, keys[-1])}, condition=_OWNED)
            except ConditionFailed:
                raise LeaseLost(f"epoch {walk['epoch']} lost partition {partition}") from None
            raise WalkRetryLater(f"{outcomes['RETRY_LATER']} of {len(keys)} keys in {partition} are RETRY_LATER; "
                                 "the cursor stays before them")
        done = not listing.truncated
        last = keys[-1] if keys else after
        names.update({"#a": "after", "#d": "done", "#pg": "pages", "#u": "updated_at_ns", "#k": "keys"})
        values.update({":last": last, ":done": done, ":prev": after, ":one": 1, ":n": len(keys), ":now": now})
        adds = ["#pg :one", "#k :n"]
        for check in KEY_CHECKS:
            names[f"#c{check}"], values[f":c{check}"] = f"keys_{check}", settled_by[check]
            adds.append(f"#c{check} :c{check}")
        if outcomes:
            names["#o"] = "outcomes"
        for i, (outcome, n) in enumerate(sorted(outcomes.items())):
            names[f"#oc{i}"], values[f":oc{i}"] = outcome, n
            adds.append(f"#o.#oc{i} :oc{i}")
        # Rule L2: the page commits only right after a fence (which also renews the lease).
        Fence(self.table, LEASE_PK, walk, self.ctx.clock, LeaseLost).renew()
        try:
            # Only after every key's repair finished: the cursor (compare-and-set) and the counters.
            self.table.update(pk, sk, "SET #a = :last, #d = :done, #u = :now ADD " + ", ".join(adds),
                              names=names, values=values, condition=_OWNED + " AND #a = :prev")
        except ConditionFailed:
            current = self.table.get(pk, sk)
            if current is None or current.get("owner") != walk["owner"] or int(current.get("epoch", -1)) != walk["epoch"]:
                raise LeaseLost(f"epoch {walk['epoch']} lost partition {partition}") from None
            # The cursor moved already: this page was walked twice (a retried task); nothing to count.
            return {"partition": partition, "keys": len(keys), "stale": True}
        return {"partition": partition, "keys": len(keys), "done": done, "outcomes": dict(outcomes),
                **{f"keys_{c}": settled_by[c] for c in KEY_CHECKS if settled_by[c]}}

    # -- continue ----------------------------------------------------------------------------------
    def cont(self, event: dict[str, Any]) -> dict[str, Any]:
        walk = event["walk"]
        if self._sfn is None:
            raise RuntimeError("walk-continue needs a Step Functions client")
        n = int(walk["executions"]) + 1
        # Deterministic name: a retried task finds the execution it already started.
        name = f"walk-e{walk['epoch']}-{walk['owner'][:8]}-{n:04d}"
        carried = {k: walk[k] for k in ("scope", "agent", "checkpoint_pk", "epoch", "owner", "page_size",
                                         "parallelism", "max_rounds", "full", "lease_seconds",
                                         "state_machine_arn", "executions") if k in walk}
        machine = walk["state_machine_arn"]
        try:
            arn = self._sfn.start_execution(stateMachineArn=machine, name=name,
                                            input=json.dumps({"continuation": carried}, sort_keys=True))["executionArn"]
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ExecutionAlreadyExists":
                raise
            arn = machine.replace(":stateMachine:", ":execution:") + f":{name}"
        names, values = _owned(walk)
        try:
            self.table.update(walk["checkpoint_pk"], CHECKPOINT_SK, "SET #nx = :nx, #u = :now",
                              names={**names, "#nx": "next_execution", "#u": "updated_at_ns"},
                              values={**values, ":nx": arn, ":now": self.now()}, condition=_OWNED)
        except ConditionFailed:
            raise LeaseLost(f"epoch {walk['epoch']} lost the walk checkpoint") from None
        return {"next_execution": arn}

    # -- end ---------------------------------------------------------------------------------------
    def end(self, event: dict[str, Any]) -> dict[str, Any]:
        walk, outcome = event["walk"], event.get("outcome", "failed")
        cp, parts = read_walk(self.table, walk["checkpoint_pk"])
        if cp is None or cp.get("owner") != walk["owner"] or int(cp.get("epoch", -1)) != walk["epoch"]:
            return {"status": "lease-lost", "epoch": walk["epoch"]}
        now = self.now()
        names, values = _owned(walk)
        summary = summarize(cp, parts, now)
        watermark: int | None = None
        if outcome == "finished":
            reason = watermark_blocker(cp, parts)
            if not reason:
                watermark = int(cp["started_at_ns"]) - int(self.settings.settle_s) * _NS
            names.update({"#st": "status", "#fa": "finished_at_ns", "#u": "updated_at_ns"})
            values.update({":st": "finished", ":now": now})
            expr = "SET #st = :st, #fa = :now, #u = :now"
            if watermark is not None:
                names["#wm"], values[":wm"] = "watermark_ns", watermark
                expr += ", #wm = :wm"
            if reason is not None:
                names["#wr"], values[":wr"] = "watermark_withheld", reason
                expr += ", #wr = :wr"
            update = Op("Update", walk["checkpoint_pk"], CHECKPOINT_SK, expr, names, values, _OWNED)
            summary.update(status="finished", watermark_ns=watermark, watermark_withheld=reason)
        else:
            error = json.dumps(event.get("error"), sort_keys=True, default=str)[:2000]
            update = Op("Update", walk["checkpoint_pk"], CHECKPOINT_SK,
                        "SET #st = :st, #fa = :now, #u = :now, #err = :err",
                        {**names, "#st": "status", "#fa": "failed_at_ns", "#u": "updated_at_ns", "#err": "error"},
                        {**values, ":st": "failed", ":now": now, ":err": error}, _OWNED)
            summary.update(status="failed", error=error)
        release = leases.release(LEASE_PK, walk["owner"], walk["epoch"], now)
        try:
            self.table.transact([update, release])
        except TransactionCancelled:
            return {"status": "lease-lost", "epoch": walk["epoch"]}
        # Only after the owned write (rule L2): an End that lost the walk moves no watermark. A crash
        # in between leaves W where it was (conservative); the retried End, still the owner, moves it.
        if watermark is not None:
            for index in (INDEXES if walk.get("full") else PRESENCE_WALK_INDEXES):
                set_watermark(self.table, index, watermark, epoch=walk["epoch"], now_ns=now)
        log.info("walk %s epoch %s %s", walk["scope"], walk["epoch"], summary["status"])
        return summary


def watermark_blocker(cp: dict[str, Any], parts: list[dict[str, Any]]) -> str | None:
    """Why a finished walk may not set the watermark (None: it may)."""
    if cp.get("scope") != "all":
        return "agent-scoped walks never move the watermark"
    if not (cp.get("enum") or {}).get("done") or parts:
        return "the walk did not cover every partition"
    outcomes = cp.get("outcomes") or {}
    bad = {o: int(outcomes.get(o, 0)) for o in ("RETRY_LATER", "BLOCKED", "SKIPPED") if int(outcomes.get(o, 0))}
    if bad:
        return "items ended " + ", ".join(f"{o}: {n}" for o, n in bad.items())
    return None


def set_watermark(table: ControlTable, index: str, w_ns: int, *, epoch: int, now_ns: int) -> bool:
    """Raise ``watermark#<index>`` to ``w_ns`` (monotonic: never lowered); True if it moved."""
    try:
        table.update(watermark_pk(index), "current", "SET #w = :w, #at = :now, #ep = :ep",
                     names={"#w": "w_ns", "#at": "set_at_ns", "#ep": "epoch"},
                     values={":w": w_ns, ":now": now_ns, ":ep": epoch},
                     condition="attribute_not_exists(#w) OR #w < :w")
        return True
    except ConditionFailed:
        return False


def read_watermarks(table: ControlTable) -> dict[str, int | None]:
    """``{index: W in unix ns, or None if no clean full walk has finished yet}``."""
    out: dict[str, int | None] = {}
    for index in INDEXES:
        item = table.get(watermark_pk(index), "current")
        out[index] = int(item["w_ns"]) if item and "w_ns" in item else None
    return out


def summarize(cp: dict[str, Any], parts: list[dict[str, Any]], now_ns: int) -> dict[str, Any]:
    """Progress of a walk: the summary plus the partitions in progress; keys/s and an ETA estimate.
    ``keys_present`` and ``keys_reaped`` are the NOOP_RESOLVED keys no repair ran for (W4, W5)."""
    cp = plain(cp)
    outcomes = {o: int((cp.get("outcomes") or {}).get(o, 0)) + sum(int(p["outcomes"].get(o, 0)) for p in parts)
                for o in OUTCOMES}
    keys = int(cp.get("keys", 0)) + sum(int(p.get("keys", 0)) for p in parts)
    pages = int(cp.get("pages", 0)) + sum(int(p.get("pages", 0)) for p in parts)
    settled = {f"keys_{c}": int(cp.get(f"keys_{c}", 0)) + sum(int(p.get(f"keys_{c}", 0)) for p in parts)
               for c in KEY_CHECKS}
    by_kind = Counter({"accepted": int(cp.get("keys_accepted", 0)), "quarantine": int(cp.get("keys_quarantine", 0))})
    for p in parts:
        by_kind[p.get("kind", "accepted")] += int(p.get("keys", 0))
    found = int(cp.get("partitions_found", 0))
    complete = int(cp.get("partitions_done", 0)) + sum(1 for p in parts if p.get("done"))
    enum_done = bool((cp.get("enum") or {}).get("done"))
    since = int(cp.get("rate_since_ns", cp.get("started_at_ns", now_ns)))
    until = int(cp.get("finished_at_ns") or cp.get("failed_at_ns") or 0) if cp.get("status") != "running" else 0
    elapsed = ((until or now_ns) - since) / _NS
    rate = (keys - int(cp.get("rate_keys_base", 0))) / elapsed if elapsed > 0 else None
    eta = None
    if cp.get("status") == "running" and enum_done and rate and complete:
        estimated_total = keys * found / complete
        eta = max(0.0, (estimated_total - keys) / rate)
    return {
        "scope": cp.get("scope"), "epoch": cp.get("epoch"), "status": cp.get("status"),
        "started_at_ns": cp.get("started_at_ns"), "updated_at_ns": cp.get("updated_at_ns"),
        "executions": cp.get("executions"), "resumes": cp.get("resumes", 0), "execution": cp.get("execution"),
        "partitions_found": found, "partitions_done": complete, "enumeration_complete": enum_done,
        "in_progress": sorted(p["partition"] for p in parts if not p.get("done")),
        "keys": keys, "keys_accepted": by_kind["accepted"], "keys_quarantine": by_kind["quarantine"],
        "pages": pages, "repairs": outcomes["DONE"], "outcomes": outcomes,
        # NOOP_RESOLVED keys settled without a repair: entry present (W5), hour reaped (W4)
        **settled,
        "keys_per_s": None if rate is None else round(rate, 1), "eta_s": None if eta is None else round(eta, 1),
        "watermark_ns": cp.get("watermark_ns"), "watermark_withheld": cp.get("watermark_withheld"),
        "error": cp.get("error"),
    }


# --- operator side: start, status, follow (lmctl walk, the demo) --------------------------------------
@dataclass
class Started:
    execution_arn: str
    epoch: int
    checkpoint_pk: str
    scope: str


@dataclass
class Followed:
    status: str  # finished | failed
    summary: dict[str, Any]
    executions: list[str]
    detail: str = ""


class WalkControl:
    """Start and watch walks through Step Functions (the CLI and the demo; never inside a task)."""

    def __init__(self, ctx: WorkContext, sfn_client: Any, state_machine_arn: str, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.ctx, self.sfn, self.state_machine_arn = ctx, sfn_client, state_machine_arn
        self.table: ControlTable = ctx.extras["table"]
        self.sleep = sleep

    def lease(self) -> dict[str, Any] | None:
        item = self.table.get(LEASE_PK, LEASE_SK)
        return plain(item) if item else None

    def lease_live(self) -> dict[str, Any] | None:
        lease = self.lease()
        return lease if lease and int(lease.get("expires_at_ns", 0)) > self.ctx.clock.now_ns() else None

    def checkpoint(self, agent: str | None = None) -> dict[str, Any] | None:
        """The walk summary of a scope, totals including the partitions in progress (None: never ran)."""
        cp, parts = read_walk(self.table, checkpoint_pk(None if agent is None else id_to_hex(agent)))
        if cp is None:
            return None
        return {**cp, **summarize(cp, parts, self.ctx.clock.now_ns())}

    def start(self, *, agent: str | None = None, resume: bool = False, full: bool = False, page_size: int | None = None,
              parallelism: int | None = None, max_rounds: int | None = None, lease_seconds: int | None = None,
              timeout_s: float = 120.0) -> Started:
        """Start an execution and wait until it holds the lease; :class:`LeaseHeld` if refused."""
        live = self.lease_live()
        if live:
            raise LeaseHeld(describe_lease(live, self.ctx.clock.now_ns()))
        inp: dict[str, Any] = {"agent": agent, "resume": resume}
        if full:
            inp["full"] = True
        for k, v in (("page_size", page_size), ("parallelism", parallelism),
                     ("max_rounds_per_execution", max_rounds), ("lease_seconds", lease_seconds)):
            if v is not None:
                inp[k] = v
        params = WalkParams.parse(inp)  # refuse bad input before starting anything
        if resume:
            cp = self.checkpoint(agent)
            if cp is None or cp.get("status") == "finished":
                raise NothingToResume(f"no unfinished walk to resume for {checkpoint_pk(params.agent_hex)} "
                                      f"(last status: {cp.get('status') if cp else 'never ran'})")
        name = f"lmctl-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        arn = self.sfn.start_execution(stateMachineArn=self.state_machine_arn, name=name,
                                       input=json.dumps(inp, sort_keys=True))["executionArn"]
        deadline = time.monotonic() + timeout_s
        while True:
            lease = self.lease()
            if lease and lease.get("execution") == arn:
                return Started(arn, int(lease["epoch"]), str(lease["checkpoint_pk"]), str(lease.get("scope", "all")))
            d = self.sfn.describe_execution(executionArn=arn)
            if d["status"] != "RUNNING":
                error, cause = d.get("error", ""), d.get("cause", "")
                if error == "LeaseHeld":
                    raise LeaseHeld(f"refused: {cause}")
                kind, detail = self._begin_error(arn)
                if kind == "NothingToResume":
                    raise NothingToResume(detail)
                raise InvalidWalkInput(f"the walk did not start ({d['status']} {error}): {detail or cause}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{arn} did not take the lease within {timeout_s} s")
            self.sleep(0.1)

    def _begin_error(self, arn: str) -> tuple[str, str]:
        """The Begin task's own error (type, message), from the execution history."""
        for ev in self.history(arn):
            d = ev.get("lambdaFunctionFailedEventDetails")
            if d:
                try:
                    message = str(json.loads(d.get("cause", "{}")).get("errorMessage", d.get("cause", "")))
                except ValueError:
                    message = str(d.get("cause", ""))
                return str(d.get("error", "")), message
        return "", ""

    def history(self, arn: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"executionArn": arn, "maxResults": 1000}
        while True:
            page = self.sfn.get_execution_history(**kwargs)
            events.extend(page["events"])
            if not page.get("nextToken"):
                return events
            kwargs["nextToken"] = page["nextToken"]

    def _until_ended(self, execution: str, deadline: float | None) -> None:
        """Wait (at most 60 s, or until ``deadline``) for ``execution`` to leave RUNNING."""
        limit = time.monotonic() + 60 if deadline is None else min(deadline, time.monotonic() + 60)
        while self.sfn.describe_execution(executionArn=execution)["status"] == "RUNNING" and time.monotonic() < limit:
            self.sleep(0.05)

    def follow(self, started: Started, *, on_progress: Callable[[dict[str, Any]], None] | None = None,
               poll_s: float = 0.5, timeout_s: float | None = None) -> Followed:
        """Watch the walk of ``started`` across its executions until it finishes or fails."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        executions = [started.execution_arn]
        ended_at: float | None = None
        while True:
            found, parts = read_walk(self.table, started.checkpoint_pk)
            cp = found or {}
            summary = summarize(cp, parts, self.ctx.clock.now_ns()) if cp else {}
            if on_progress and summary:
                on_progress(summary)
            if cp and int(cp.get("epoch", -1)) != started.epoch:
                return Followed("failed", summary, executions, "a newer walk replaced this epoch's checkpoint")
            status = cp.get("status")
            current = str(cp.get("execution") or started.execution_arn)
            if current not in executions:
                executions.append(current)
            if status == "finished":
                # End records "finished", then moves the watermarks (after its owned write, rule
                # L2): the walk has ended once its execution has.
                self._until_ended(current, deadline)
                return Followed("finished", summary, executions)
            if status == "failed":
                return Followed("failed", summary, executions, str(cp.get("error", "")))
            d = self.sfn.describe_execution(executionArn=current)
            if d["status"] in ("FAILED", "TIMED_OUT", "ABORTED"):
                # The end task may have recorded the error after the read above: read it again.
                found, parts = read_walk(self.table, started.checkpoint_pk)
                summary = summarize(found, parts, self.ctx.clock.now_ns()) if found else summary
                return Followed("failed", summary, executions,
                                f"execution {current} {d['status']} {d.get('error', '')}".strip())
            if d["status"] == "SUCCEEDED" and cp.get("status") == "running":
                # Handed over to the next execution: Begin records it within moments.
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > 60:
                    return Followed("failed", summary, executions, f"{current} ended without a successor")
            else:
                ended_at = None
            if deadline is not None and time.monotonic() > deadline:
                return Followed("failed", summary, executions, "timed out following the walk")
            self.sleep(poll_s)


# --- Lambda handlers (functions/walk_*/app.py are one line each) -------------------------------------
STEPS = {"begin": "begin", "plan": "plan", "page": "page", "continue": "cont", "end": "end"}
#: function name in the resource spec -> walk step (functions/walk_<step>/app.py)
TASK_STEPS = {f"walk-{step}": step for step in STEPS}


def walk_task_handler(
    step: str,
    *,
    settings_factory: Callable[[], Any] | None = None,
    work_context_factory: Callable[..., WorkContext] | None = None,
    sfn_factory: Callable[[], Any] | None = None,
) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The Lambda handler of one walk task. Configuration comes from ``LM_*`` unless factories are
    given (the local runtime passes them so several systems can share a process)."""
    from lightmetrics.task_handler import task_handler

    def build(metrics: Any) -> Walker:
        import boto3

        from lightmetrics.config import Settings
        from lightmetrics.services import work_context

        settings = settings_factory() if settings_factory else Settings.from_env()
        if work_context_factory:
            ctx = work_context_factory(settings, metrics=metrics)
        else:
            ctx = work_context(settings, metrics=metrics, component="walk")
        sfn = (sfn_factory() if sfn_factory else boto3.session.Session().client("stepfunctions")) \
            if step == "continue" else None
        return Walker(ctx, settings, sfn_client=sfn)

    return task_handler("walk", step, STEPS, build=build, passthrough=(WalkError, LeaseError), transient=WalkTransient)


__all__ = [
    "INDEXES", "PRESENCE_WALK_INDEXES", "LEASE_PK", "HISTORY_LIMIT", "HISTORY_BUDGET", "Followed", "InvalidWalkInput", "LeaseHeld", "LeaseLost",
    "NothingToResume", "Started", "TASK_STEPS", "WalkControl", "WalkParams", "WalkRetryLater", "WalkTransient", "Walker",
    "KEY_CHECKS", "RecordChecks", "boundary_margin_ns", "candidate_hours", "list_beats_heads", "checkpoint_pk",
    "history_bound", "max_rounds_for", "read_walk", "read_watermarks", "set_watermark", "summarize",
    "walk_task_handler", "watermark_blocker",
]
