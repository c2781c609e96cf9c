"""The simulated deployment: one in-memory bucket and table, history planted before the run, and
each actor's contexts (its own skewed clock) over the scheduling, fault-injecting proxies."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.acceptance.accept import AcceptContext, accept_batch
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.derived.walk import INDEXES, set_watermark
from lightmetrics.harness.sim.lease_check import LeaseWatch
from lightmetrics.harness.sim.proxies import FaultPlan, SimControlTable, SimObjectStore
from lightmetrics.harness.sim.reap_world import ReapWorld, plant_reaps
from lightmetrics.harness.sim.scheduler import Scheduler, SimClock, SkewedClock
from lightmetrics.harness.testing.memory import NO_WAIT, T0_NS, MemorySystem, memory_system
from lightmetrics.protocol.frame import Sample, encode_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.protocol.manifests import parse_record
from lightmetrics.protocol.metrics import NoMetrics
from lightmetrics.work.blockers import BlockerStore
from lightmetrics.work.retry_budget import RetryBudget
from lightmetrics.work.units import WorkContext

_NS = 1_000_000_000
HORIZON_S = 60
RETENTION_S = 86400
#: the expired history retention reaps: accepted ten days before the run
OLD_NS = T0_NS - 10 * 86400 * _NS
#: orphan blobs (an accept that stopped after its blob) written an hour before the run
ORPHAN_NS = T0_NS - 3600 * _NS


def identity(n: int, agent: str = "agent-a") -> BatchIdentity:
    return BatchIdentity.create(agent, "boot-1", n * 10, n * 10 + 9)


def frame(ident: BatchIdentity, variant: float = 0.0) -> bytes:
    samples = [Sample(metric="cpu", labels={"core": str(i)}, ts_unix_ns=T0_NS + i, value=float(i) + variant)
               for i in range(3)]
    return encode_frame(ident, samples)


@dataclass
class Ack:
    """A batch a collector answered 200 for: its record must hold this hash, for good."""

    identity: BatchIdentity
    frame_sha256: str
    actor: str


@dataclass
class World:
    system: MemorySystem
    clock: SimClock
    scheduler: Scheduler
    faults: FaultPlan
    store: SimObjectStore
    table: SimControlTable
    rng: random.Random
    acks: list[Ack] = field(default_factory=list)
    #: records a newer writer wrote (this reader cannot parse them) -> the blob each names
    newer_records: dict[str, str] = field(default_factory=dict)
    #: the checks' parsed records, by key: (version id, record or None)
    parsed: dict[str, tuple[str, Any]] = field(default_factory=dict)
    #: hours the checks saw tombstoned (for good)
    tombstoned: set[UtcHour] = field(default_factory=set)
    old_hour: UtcHour = field(default_factory=lambda: UtcHour.of_unix_ns(OLD_NS))
    #: the reaps' expired history (:mod:`lightmetrics.harness.sim.reap_world`)
    reaps: ReapWorld = field(default_factory=lambda: ReapWorld([], []))

    def clock_for(self, max_skew_s: int = 5) -> SkewedClock:
        return SkewedClock(self.clock, self.rng.randint(-max_skew_s, max_skew_s) * _NS)

    def work_context(self, clock: Any) -> WorkContext:
        s = self.system.settings
        return WorkContext(store=self.store, codec=self.system.ctx.codec,
                           budget=RetryBudget(self.table, max_count=s.retry_budget_count,
                                              max_age_s=s.retry_budget_age_s, clock=clock),
                           blockers=BlockerStore(self.table, clock), table=self.table, settings=s, clock=clock,
                           metrics=NoMetrics(), policy=NO_WAIT)

    def accept_context(self, clock: Any, collector_id: str) -> AcceptContext:
        s = self.system.settings
        return AcceptContext(store=self.store, codec=self.system.ctx.codec, collector_id=collector_id,
                             max_frame_bytes=s.max_frame_bytes, clock=clock, policy=NO_WAIT, metrics=NoMetrics())


def build_world(seed: int, *, fault_rate: float, max_steps: int, after_step: Any = None) -> World:
    """A fresh namespace with planted history (no faults, no scheduling) and the run's scheduler."""
    rng = random.Random(seed)
    clock = SimClock(T0_NS)
    planted = _planted()
    system = memory_system(clock=clock, settings=planted.system.settings)
    planted.copy_into(system)
    scheduler = Scheduler(rng, clock, max_steps=max_steps, after_step=after_step)
    faults = FaultPlan(rng, fault_rate)
    world = World(system, clock, scheduler, faults, SimObjectStore(system.store, scheduler, faults),
                  SimControlTable(system.table, scheduler, faults), rng, reaps=copy.deepcopy(planted.reaps))
    world.newer_records = dict(planted.newer_records)
    world.store.watch = world.table.watch = LeaseWatch(system.table, scheduler)
    return world


@dataclass
class _Planted:
    """The history every schedule starts from, planted once per process through the real code
    (the same for every seed: its request tokens come from a fixed seed); each world gets a copy
    of its bucket's versions and its table's items."""

    system: MemorySystem
    reaps: ReapWorld
    newer_records: dict[str, str]

    def copy_into(self, system: MemorySystem) -> None:
        store, table = self.system.store, self.system.table
        system.store._keys = {k: [dataclasses.replace(v, metadata=dict(v.metadata)) for v in versions]
                              for k, versions in store._keys.items()}
        system.store._next_version = store._next_version
        system.table._items = copy.deepcopy(table._items)


_PLANTED: list[_Planted] = []


def _planted() -> _Planted:
    if not _PLANTED:
        clock = SimClock(T0_NS)
        system = memory_system(clock=clock, retry_horizon_s=HORIZON_S, gc_grace_s=0, retention_s=RETENTION_S,
                               rollup_retention_s=RETENTION_S)
        rng, original = random.Random(0x91A47ED), uuid.uuid4
        uuid.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)  # type: ignore[assignment]
        try:
            _plant_history(system, clock)
            reaps = plant_reaps(system, clock, OLD_NS, identity, frame)
            newer = _plant_newer_record(system, clock)
            _plant_audit_run(system, newer)
        finally:
            uuid.uuid4 = original  # type: ignore[assignment]
        assert clock.now_ns() == T0_NS
        _PLANTED.append(_Planted(system, reaps, newer))
    return _PLANTED[0]


def _plant_history(system: MemorySystem, clock: SimClock) -> None:
    """Three indexed batches in an expired hour, two orphans past the horizon, watermarks an hour back."""
    now = clock.now_ns()
    for n, at_ns in ((90, OLD_NS), (91, OLD_NS), (92, OLD_NS)):
        clock._now = at_ns
        result = accept_batch(system.accept, identity(n, "agent-old"), frame(identity(n, "agent-old")))
        index_accepted(system.ctx, result.manifest_key)
        index_raw_blob(system.ctx, result.blob_key)
    clock._now = ORPHAN_NS
    for n in (93, 94):
        system.store.fail("PutObject", "ServiceUnavailable", key_contains=system.ctx.codec.accepted_root(), times=-1)
        result = accept_batch(system.accept, identity(n, "agent-orphan"), frame(identity(n, "agent-orphan")))
        system.store.clear_faults()
        index_raw_blob(system.ctx, result.blob_key)
    clock._now = now
    for index in INDEXES:
        set_watermark(system.table, index, now - 3600 * _NS, epoch=1, now_ns=now)


def _plant_newer_record(system: MemorySystem, clock: SimClock) -> dict[str, str]:
    """A batch whose record a newer writer rewrote (a higher schema version and a field this reader
    does not know), accepted an hour back: no reader may take it for "no record" (§17 E2)."""
    now, clock._now = clock.now_ns(), ORPHAN_NS
    ident = identity(96, "agent-newer")
    result = accept_batch(system.accept, ident, frame(ident))
    index_raw_blob(system.ctx, result.blob_key)
    clock._now = now
    key = str(result.manifest_key)
    doc = json.loads(system.store.get(key) or b"{}")
    doc.update(schema="lightmetrics.accepted_batch.v2", written_by_newer=True)
    for version in system.store.versions_of(key):
        system.store.delete_objects([(key, version.version_id)])
    system.store.put_if_absent(key, json.dumps(doc).encode())
    return {key: str(result.blob_key)}


#: the committed audit run whose orphan candidates a GC of source ``audit`` proves
AUDIT_RUN = "sim-audit-1"


def _plant_audit_run(system: MemorySystem, newer: dict[str, str]) -> None:
    """A committed audit run (its summary, then its commit marker) whose orphan candidates are the
    two orphans, a blob a live record names (the audit is a week old: a late accept has referenced
    it since) and the newer writer's record's blob: GC's proof, not the audit, decides (G1)."""
    codec, store = system.ctx.codec, system.store
    named = sorted(parse_record(codec, k, store.get(k) or b"").raw_blob_key
                   for k in store.keys(codec.accepted_root()) if k not in newer)
    orphans = sorted(set(store.keys(codec.root(KeyKind.RAW_BLOB))) - set(named) - set(newer.values()))
    lines = [{"blob_key": k} for k in orphans[:2] + named[:1] + sorted(newer.values())]
    run = codec.audit_run(AUDIT_RUN)
    store.put_if_absent(f"{run}orphan-blob-candidates/part-00000.json",
                        b"".join(json.dumps(line, sort_keys=True).encode() + b"\n" for line in lines))
    store.put_if_absent(f"{run}summary.json", json.dumps({"run_id": AUDIT_RUN, "candidates": len(lines)}).encode())
    store.put_if_absent(codec.audit_committed(ORPHAN_NS // _NS, AUDIT_RUN), json.dumps({"run_id": AUDIT_RUN}).encode())


__all__ = ["AUDIT_RUN", "Ack", "HORIZON_S", "OLD_NS", "World", "build_world", "frame", "identity"]
