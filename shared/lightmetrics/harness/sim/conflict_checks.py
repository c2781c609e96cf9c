"""The checks of identity conflicts, resolutions and the denylist (docs/protocol.md §14), read straight
from the in-memory adapters.

After every step (:class:`ConflictWatch`, only on a step whose trace touched the objects):

* C2 — one decision per conflict: a resolution object has one version, and its bytes never change;
* D1 — the staleness bound of the denylist (§14, "Denylist enforcement"): a request that began
  ``LM_DENYLIST_TTL_S`` or more after a denylist entry landed, the entry still there when it was
  answered, is answered ``denied`` — unless a refresh of that process's cache failed (the cache
  then keeps its last list: an unreachable table never stops ingest). Measured on the world's
  clock, which both the entry's landing and the cache's TTL (the process's clock, a fixed skew) follow.

When a ``resolve`` answers (:func:`check_resolve`, §14 rule 1 and §11.1 CW3): a resolve that reports
``already_resolved`` names a record other than its own (a create of its own whose answer was lost is
its own write), and one that reports success returns its own.

At quiescence (:func:`quiescence`), every command answered: C3 — the registry item of every
resolution agrees with it; C4 — every evidence object has a registry item; C3 + C6 — a denylist
entry exists exactly when a ``deny_identity`` decision names it and no lift of that entry was made
at or after the decision; every reported decision is the stored one; and a parked batch re-sent
after a lift is not refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightmetrics.acceptance.accept import AcceptStatus
from lightmetrics.acceptance.conflict_records import CONFLICTS_PK, DENY_IDENTITY, ConflictResolutionRecord, registry_sk
from lightmetrics.acceptance.denylist import ALL_BOOTS, DENYLIST_PK, LIFTS_PK
from lightmetrics.harness.sim.conflict_actors import Conflicts, Resolve
from lightmetrics.harness.sim.world import World
from lightmetrics.protocol.keys import KeyKind
from lightmetrics.protocol.manifests import IdentityConflictManifest

_NS = 1_000_000_000


@dataclass
class Interval:
    landed_ns: int
    at_unix_ns: int
    gone_ns: int | None = None


@dataclass
class ConflictWatch:
    world: World
    shared: Conflicts
    seen: int = 0  # trace lines read
    answers: int = 0  # answers checked
    bodies: dict[str, bytes] = field(default_factory=dict)  # resolution key -> its first bytes
    denials: dict[str, list[Interval]] = field(default_factory=dict)  # denylist sk -> its lifetimes
    resolves: set[int] = field(default_factory=set)  # resolve attempts checked

    def __post_init__(self) -> None:
        self.root = self.world.system.ctx.codec.root(KeyKind.CONFLICT_RESOLUTION)

    def step(self) -> None:
        lines = self.world.scheduler.trace[self.seen:]
        self.seen = len(self.world.scheduler.trace)
        if any(" denylist/" in line for line in lines):
            self._denylist()
        for line in lines:
            if self.root in line and " PutObject " in line:
                self._resolution(line.rsplit(" ", 1)[-1])
        self._answers()
        for n, attempt in enumerate(self.shared.resolves):
            if attempt.outcome != "failed" and n not in self.resolves:
                self.resolves.add(n)
                check_resolve(self.world, attempt)

    def _denylist(self) -> None:
        now = self.world.clock.now_ns()
        items = {sk: item for (pk, sk), item in self.world.system.table._items.items() if pk == DENYLIST_PK}
        for sk, item in items.items():
            lives = self.denials.setdefault(sk, [])
            at = int(item.get("at_unix_ns", 0))
            if not lives or lives[-1].gone_ns is not None or lives[-1].at_unix_ns != at:
                if lives and lives[-1].gone_ns is None:
                    lives[-1].gone_ns = now
                lives.append(Interval(now, at))
        for sk, lives in self.denials.items():
            if sk not in items and lives[-1].gone_ns is None:
                lives[-1].gone_ns = now

    def _resolution(self, key: str) -> None:
        versions = self.world.system.store._keys.get(key) or []
        if not versions:
            return
        body = versions[0].body or b""
        first = self.bodies.setdefault(key, body)
        if len(versions) > 1 or versions[0].marker or first != body:
            self.world.scheduler.flag(f"C2: the resolution {key} changed ({len(versions)} versions)")

    def _answers(self) -> None:
        ttl_ns = self.world.system.settings.denylist_ttl_s * _NS
        now = self.world.clock.now_ns()
        for answer in self.shared.answers[self.answers:]:
            if answer.status == AcceptStatus.DENIED.value or answer.cache_failed:
                continue
            ident = answer.identity
            for sk in (f"{ident.agent_hex}#{ident.boot_hex}", f"{ident.agent_hex}#{ALL_BOOTS}"):
                for life in self.denials.get(sk, ()):
                    if life.landed_ns + ttl_ns <= answer.asked_ns and (life.gone_ns is None or life.gone_ns > now):
                        self.world.scheduler.flag(
                            f"D1: {answer.process} answered {answer.status} for {ident.manifest_id}, denied by {sk} "
                            f"since {(answer.asked_ns - life.landed_ns) / _NS:.1f} s (TTL "
                            f"{ttl_ns // _NS} s) and no refresh of its cache failed")
        self.answers = len(self.shared.answers)


def check_resolve(world: World, attempt: Resolve) -> None:
    """§14 rule 1, §11.1 CW3: what a resolve reports is true of its own write."""
    record = attempt.record
    if record is None:
        return
    if attempt.outcome == "already-resolved" and record.reason == attempt.reason:
        world.scheduler.flag(f"CW3: {attempt.actor}'s resolve of {attempt.conflict_id[:24]} reported "
                             f"already_resolved naming its own write")
    if attempt.outcome == "resolved" and record.reason != attempt.reason:
        world.scheduler.flag(f"C2: {attempt.actor}'s resolve of {attempt.conflict_id[:24]} reported another "
                             f"decision as its own ({record.reason!r})")


def _records(world: World) -> dict[str, ConflictResolutionRecord]:
    store, root = world.system.store, world.system.ctx.codec.root(KeyKind.CONFLICT_RESOLUTION)
    return {key: ConflictResolutionRecord.from_bytes(store.get(key) or b"") for key in store.keys(root)}


def quiescence(world: World, shared: Conflicts) -> list[str]:
    found: list[str] = []
    table, store, codec = world.system.table, world.system.store, world.system.ctx.codec
    records = _records(world)
    by_id = {r.conflict_id: r for r in records.values()}
    for attempt in shared.resolves:
        stored = by_id.get(attempt.conflict_id)
        if attempt.record is not None and stored != attempt.record:
            found.append(f"C2: {attempt.actor} was told {attempt.record.resolution} by {attempt.record.resolved_by} "
                         f"for {attempt.conflict_id[:24]}, the record says {stored and stored.resolution}")
    for key in store.keys(codec.quarantine_root()):
        q = IdentityConflictManifest.from_bytes(store.get(key) or b"")
        item = table.get(CONFLICTS_PK, registry_sk(q.observed_at_unix_ns, q.identity, q.submitted_frame_sha256))
        record = records.get(codec.conflict_resolution(q.identity, q.submitted_frame_sha256))
        if item is None:
            found.append(f"C4: evidence {key} has no registry item")
        elif record is not None and (item.get("resolution"), item.get("resolved_by")) != (record.resolution,
                                                                                          record.resolved_by):
            found.append(f"C3: the registry says {item.get('resolution')} for {record.conflict_id[:24]}, "
                         f"its record {record.resolution} by {record.resolved_by}")
    lifts = [i for i in table.query(LIFTS_PK)]
    denied = {i["sk"] for i in table.query(DENYLIST_PK)}
    expected: dict[str, bool] = {}
    for record in sorted(records.values(), key=lambda r: r.resolved_at_unix_ns):
        if record.resolution != DENY_IDENTITY:
            continue
        for sk in record.denylist_entries:
            lifted = any(i["entry"] == sk and int(i["lifted_at_unix_ns"]) >= record.resolved_at_unix_ns for i in lifts)
            expected[sk] = expected.get(sk, False) or not lifted
    for sk in sorted(set(expected) | denied):
        if expected.get(sk, False) != (sk in denied):
            found.append(f"C3/C6: denylist entry {sk} is {'present' if sk in denied else 'absent'}, the decisions "
                         f"and lifts say {'present' if expected.get(sk) else 'absent'}")
    for answer in shared.answers:
        ident = answer.identity
        if answer.process.endswith("-q") and answer.status == AcceptStatus.DENIED.value and not (
                {f"{ident.agent_hex}#{ident.boot_hex}", f"{ident.agent_hex}#{ALL_BOOTS}"} & denied):
            found.append(f"liveness: {ident.manifest_id} re-sent after its denial was lifted was refused")
    return found


__all__ = ["ConflictWatch", "check_resolve", "quiescence"]
