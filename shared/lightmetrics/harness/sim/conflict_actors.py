"""The conflict actors: suspects sending through the ingest service's denylist, and the operators
who resolve their conflicts and lift denials (docs/protocol.md §14), each driven as its host does.

* ``suspect#i`` — an agent under investigation (``agent-c``, two boots) whose batches go through
  :class:`~lightmetrics.acceptance.http_contract.IngestService` (token, :class:`DenylistCache` over
  the world's table with ``LM_DENYLIST_TTL_S``, then ``accept_batch``): one Lambda container per
  process, a new one (a cold cache) after it died. Two suspects send some identities with other
  bytes (conflicts); a 409 ``unresolved`` or a 403 ``denied`` batch is parked and re-delivered at
  the parked cadence, a 503 or a lost answer sooner (§6).
* ``operator#i`` — ``lmctl conflicts list`` then ``resolve`` (either decision; a denial of the boot
  or of the whole agent, only for ``agent-c``), the two operators often picking the same conflict,
  and sometimes ``lmctl denylist remove``. A command that died or answered 503 is run again, as
  the operator would; one never answered in the run phase is finished at quiescence.

What each saw is kept in :class:`Conflicts` for :mod:`~lightmetrics.harness.sim.conflict_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightmetrics.acceptance.accept import AcceptStatus
from lightmetrics.acceptance.auth import CachedTokenKeys, TokenKeys, mint_token
from lightmetrics.acceptance.conflict_records import (
    ACCEPT_EXISTING,
    DENY_IDENTITY,
    UNRESOLVED,
    ConflictAlreadyResolved,
    ConflictResolutionRecord,
    conflict_id,
    parse_conflict_id,
)
from lightmetrics.acceptance.conflicts import ConflictRegistry
from lightmetrics.acceptance.denylist import DenylistCache, DenylistStore, NotDenied
from lightmetrics.acceptance.http_contract import HttpRequest, IngestService
from lightmetrics.harness.sim.scheduler import Actor, SimCrash
from lightmetrics.harness.sim.world import Ack, World, frame
from lightmetrics.harness.testing.memory import NO_WAIT
from lightmetrics.protocol.identity import BatchIdentity

SUSPECT = "agent-c"
BOOTS = ("boot-1", "boot-2")
KEYS = TokenKeys(current="k1", keys={"k1": "sim-" + "0" * 60})
#: attempts of one operator command (the CLI died, or answered 503) before the operator leaves it
COMMAND_ATTEMPTS = 4


def suspect_identity(boot: str, n: int) -> BatchIdentity:
    return BatchIdentity.create(SUSPECT, boot, n * 10, n * 10 + 9)


@dataclass
class Answer:
    """One ingest answer to a suspect: what the denylist check is held to."""

    process: str
    identity: BatchIdentity
    status: str
    asked_ns: int  # the world's time when the request began (the cache's decision)
    cache_failed: bool  # a refresh of this process's cache failed (it may hold an older list)


@dataclass
class Resolve:
    """One ``resolve`` attempt and what it reported."""

    actor: str
    conflict_id: str
    reason: str  # unique per attempt: the record it wrote, if any, carries it
    outcome: str  # "resolved", "already-resolved", "failed"
    record: ConflictResolutionRecord | None = None


@dataclass
class Conflicts:
    answers: list[Answer] = field(default_factory=list)
    resolves: list[Resolve] = field(default_factory=list)
    #: commands never answered in the run phase: an operator finishes them at quiescence
    unfinished: list[tuple[str, Any]] = field(default_factory=list)
    #: parked batches (denied or unresolved) of each suspect, re-sent at quiescence
    parked: dict[str, dict[str, tuple[BatchIdentity, float]]] = field(default_factory=dict)
    plan: list[tuple[str, int]] = field(default_factory=list)  # the identities the suspects send
    alerts: list[str] = field(default_factory=list)  # the quarantine keys of the 409s the agents alerted on


def _service(world: World, clock: Any, name: str) -> IngestService:
    """A fresh ingest Lambda container: its own caches (the denylist's is cold)."""
    ttl = world.system.settings.denylist_ttl_s
    now = lambda: clock.now_ns() / 1e9  # noqa: E731 - a monotonic clock: the skew is fixed per process
    return IngestService(world.accept_context(clock, name), CachedTokenKeys(lambda: KEYS, 1e9, now),
                         DenylistCache(world.table, ttl_s=ttl, now=now))


def _post(service: IngestService, ident: BatchIdentity, data: bytes) -> dict[str, Any]:
    headers = {"x-lm-agent-id": ident.agent_id, "x-lm-boot-id": ident.boot_id,
               "x-lm-seq-start": str(ident.seq_start), "x-lm-seq-end": str(ident.seq_end),
               "authorization": f"Bearer {mint_token(KEYS, ident.agent_id)}"}
    return service.handle(HttpRequest("POST", headers, data)).body


def _refresh_failed(world: World, actor: Actor, mark: int) -> bool:
    """A denylist ``Query`` of this request met a fault (the cache keeps its older list)."""
    return any(f" {actor.name} fault " in line and " Query denylist" in line for line in world.scheduler.trace[mark:])


def send(world: World, shared: Conflicts, actor: Actor, state: dict[str, Any], ident: BatchIdentity,
         variant: float) -> str | None:
    """One delivery through the ingest service; the answer's status, None when the Lambda died."""
    actor.crashed = False
    mark, asked = len(world.scheduler.trace), world.clock.now_ns()
    try:
        body = _post(state["service"], ident, frame(ident, variant))
    except SimCrash:
        state["service"] = _service(world, state["clock"], state["name"])  # a new container, a cold cache
        state["failed"] = False
        return None
    state["failed"] = state["failed"] or _refresh_failed(world, actor, mark)
    status = str(body["status"])
    world.scheduler.note(f"answer {status} {ident.manifest_id} {body.get('resolution', '')}")
    shared.answers.append(Answer(state["name"], ident, status, asked, state["failed"]))
    if status == AcceptStatus.IDENTITY_CONFLICT.value and body["quarantine_key"] not in shared.alerts:
        shared.alerts.append(str(body["quarantine_key"]))
    if status in (AcceptStatus.ACCEPTED.value, AcceptStatus.DUPLICATE.value):
        world.acks.append(Ack(ident, str(body.get("frame_sha256") or ""), actor.name))
    return status


def suspect(world: World, shared: Conflicts, n: int) -> Any:
    rng = world.rng
    shared.plan = shared.plan or [(rng.choice(BOOTS), rng.randrange(3)) for _ in range(rng.randint(2, 4))]
    plan = [(boot, num, float(n * (rng.random() < 0.5))) for boot, num in shared.plan]  # the other's bytes, often
    clock = world.clock_for()

    def body(actor: Actor) -> None:
        state: dict[str, Any] = {"service": _service(world, clock, actor.name), "clock": clock, "failed": False,
                                 "name": actor.name}
        parked = shared.parked.setdefault(actor.name, {})
        queue = [(boot, num, variant, 0) for boot, num, variant in plan]
        while queue:
            boot, num, variant, tries = queue.pop(0)
            ident = suspect_identity(boot, num)
            status = send(world, shared, actor, state, ident, variant)
            if status in (None, AcceptStatus.UNAVAILABLE.value, AcceptStatus.DENIED.value) or (
                    status == AcceptStatus.IDENTITY_CONFLICT.value):
                parked[ident.manifest_id] = (ident, variant)
                if tries < 3:  # the parked cadence (a denial may be lifted, a conflict resolved)
                    for _ in range(rng.randrange(1, 6) if status else rng.randrange(2)):
                        world.scheduler.pause("Parked")
                    queue.append((boot, num, variant, tries + 1))
            else:
                parked.pop(ident.manifest_id, None)
    return body


def command(world: World, actor: Actor, fn: Any, label: str, unfinished: list[tuple[str, Any]] | None = None
            ) -> tuple[str, Any]:
    """Run an operator command until it answers: ("ok", value), ("refused", exc) or ("failed", None).
    Until it answers it is in ``unfinished`` (also when the run phase ends in the middle of it)."""
    pending = (actor.name, fn)
    if unfinished is not None:
        unfinished.append(pending)
    for _attempt in range(COMMAND_ATTEMPTS):
        actor.crashed = False
        try:
            outcome: tuple[str, Any] = ("ok", fn())
        except (ConflictAlreadyResolved, NotDenied) as exc:
            outcome = ("refused", exc)
        except SimCrash:
            world.scheduler.note(f"{label}: the command died")
            continue
        except Exception as exc:  # noqa: BLE001 - exit 4 (unavailable) or a store error: run it again
            world.scheduler.note(f"{label}: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        if unfinished is not None:
            unfinished.remove(pending)
        return outcome
    return "failed", None


def resolve(world: World, shared: Conflicts, actor: Actor, registry: ConflictRegistry, cid: str, decision: str,
            whole_agent: bool, call: int) -> None:
    attempts: list[Resolve] = []
    normal = conflict_id(*parse_conflict_id(cid, registry.codec))  # the id of an evidence key too

    def run() -> ConflictResolutionRecord:
        mine = Resolve(actor.name, normal, f"{actor.name} call {call} attempt {len(attempts) + 1}", "failed")
        attempts.append(mine)
        shared.resolves.append(mine)
        record = registry.resolve(cid, decision, reason=mine.reason, who=actor.name, whole_agent=whole_agent)
        mine.outcome, mine.record = "resolved", record
        return record

    label = f"resolve {normal[:24]} {decision}{' whole agent' if whole_agent else ''}"
    outcome, value = command(world, actor, run, label, shared.unfinished)
    if outcome == "refused":
        attempts[-1].outcome, attempts[-1].record = "already-resolved", value.record
    world.scheduler.note(f"{label}: {outcome}")


def lift(world: World, shared: Conflicts, actor: Actor, store: DenylistStore) -> None:
    outcome, listed = command(world, actor, store.list, "denylist list")
    if outcome != "ok" or not listed:
        return
    entry = world.rng.choice(sorted(listed, key=lambda e: e.sk))

    def run() -> Any:
        return store.remove(entry.agent_id, entry.boot_id, whole_agent=entry.boot_id is None, who=actor.name,
                            reason=f"{actor.name}: host re-imaged, not a clone")
    outcome, _ = command(world, actor, run, f"denylist remove {entry.sk}", shared.unfinished)
    world.scheduler.note(f"denylist remove {entry.sk}: {outcome}")


def operator(world: World, shared: Conflicts, n: int) -> Any:
    rng = world.rng
    rounds = rng.randint(1, 3)
    clock = world.clock_for()

    def body(actor: Actor) -> None:
        registry = ConflictRegistry(world.store, world.system.ctx.codec, world.table, clock=clock, policy=NO_WAIT)
        call = looks = 0
        while call < rounds and looks < 6:
            looks += 1
            for _ in range(rng.randrange(0, 4)):
                world.scheduler.pause("Operator")
            if shared.alerts and rng.random() < 0.5:  # the agent's alert names the evidence: resolve it by key
                cid, agent_id = shared.alerts[0 if rng.random() < 0.6 else rng.randrange(len(shared.alerts))], SUSPECT
            else:
                status, agent = rng.choice(("unresolved", "all")), rng.choice((None, SUSPECT))
                outcome, page = command(world, actor, lambda: registry.list(status=status, agent=agent),
                                        "conflicts list")
                if outcome != "ok" or not page.items:
                    continue
                items = [e for e in page.items if e.resolution == UNRESOLVED] or page.items
                entry = items[0] if rng.random() < 0.6 else rng.choice(items)  # often the same one as the other
                cid, agent_id = entry.conflict_id, entry.agent_id
            decision = rng.choice((ACCEPT_EXISTING, DENY_IDENTITY)) if agent_id == SUSPECT else ACCEPT_EXISTING
            whole = decision == DENY_IDENTITY and rng.random() < 0.3
            resolve(world, shared, actor, registry, cid, decision, whole, call)
            call += 1
            if rng.random() < 0.4:
                lift(world, shared, actor, registry.denylist)
    return body


def lifter(world: World, shared: Conflicts) -> Any:
    """An operator who clears denials as hosts are re-imaged: a few ``lmctl denylist remove``, spaced
    out, racing the other operators' decisions on the same entries."""
    rng = world.rng
    lifts = rng.randint(1, 3)

    def body(actor: Actor) -> None:
        store = DenylistStore(world.table, clock=world.clock_for())
        for _ in range(lifts):
            for _ in range(rng.randrange(2, 12)):
                world.scheduler.pause("Operator")
            lift(world, shared, actor, store)
    return body


def spawn(world: World, shared: Conflicts) -> None:
    for n in range(2):
        world.scheduler.spawn(f"suspect#{n}", suspect(world, shared, n))
    for n in range(2):
        world.scheduler.spawn(f"operator#{n}", operator(world, shared, n))
    world.scheduler.spawn("operator#2", lifter(world, shared))


def quiesce(world: World, shared: Conflicts) -> Any:
    """The operators finish what never answered; then, past one TTL, each suspect re-sends its
    parked batches once (those still denied are refused, the lifted flow again)."""
    def job(actor: Actor) -> None:
        for name, run in list(shared.unfinished):
            world.scheduler.note(f"{name}'s command finished at quiescence")
            command(world, actor, run, f"{name}'s command")
        shared.unfinished.clear()
        world.clock.advance(world.system.settings.denylist_ttl_s + 1)
        clock = world.clock_for(0)
        for name, parked in sorted(shared.parked.items()):
            state: dict[str, Any] = {"service": _service(world, clock, f"{name}-q"), "clock": clock, "failed": False,
                                     "name": f"{name}-q"}
            for _mid, (ident, variant) in sorted(parked.items()):
                send(world, shared, actor, state, ident, variant)
    return job


__all__ = ["Answer", "Conflicts", "Resolve", "quiesce", "spawn", "suspect_identity"]
