"""A world on the in-memory adapters (:mod:`lightmetrics.harness.testing.memory`) for the fast unit tests
of the decisions (tests/test_memory_*.py): accepted batches, orphans, and the walk's loop.

The moto-backed tests (tests/test_reap.py, tests/test_walk.py, ...) stay: these run the same task
methods in milliseconds, and tests/test_memory_contract.py holds the adapters to moto's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from conftest import make_frame

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.derived.walk import INDEXES, Walker, set_watermark
from lightmetrics.harness.testing.memory import T0_NS, MemorySystem, memory_system
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.identity import BatchIdentity

_NS = 1_000_000_000
HORIZON_S = 60
RETENTION_S = 86400


@dataclass
class MemoryWorld:
    """Batches accepted at ``accept_clock`` (an hour of history), work run at ``clock`` (now)."""

    system: MemorySystem
    clock: FrozenClock
    accept_clock: FrozenClock
    orphans: list[str] = field(default_factory=list)

    @property
    def ctx(self) -> Any:
        return self.system.ctx

    @property
    def store(self) -> Any:
        return self.system.store

    @property
    def table(self) -> Any:
        return self.system.table

    @property
    def settings(self) -> Any:
        return self.system.settings

    def accept(self, identity: BatchIdentity, *, index: bool = True, variant: float = 0.0) -> Any:
        """The accept at ``accept_clock`` (the store stamps LastModified from it), then the indexers."""
        self.store.clock = self.accept_clock
        try:
            result = accept_batch(replace(self.system.accept, clock=self.accept_clock), identity,
                                  make_frame(identity, variant))
        finally:
            self.store.clock = self.clock
        if index and result.manifest_key:
            index_accepted(self.ctx, result.manifest_key)
            index_raw_blob(self.ctx, result.blob_key)
        return result

    def orphan(self, identity: BatchIdentity, variant: float = 0.5) -> str:
        """An accept that stopped after its blob: every PUT of an acceptance record fails."""
        self.store.fail("PutObject", "ServiceUnavailable", key_contains="accepted/v1/", times=-1)
        try:
            result = self.accept(identity, index=False, variant=variant)
        finally:
            self.store.clear_faults()
        assert result.status.value == "unavailable" and result.blob_key
        index_raw_blob(self.ctx, result.blob_key)
        self.orphans.append(result.blob_key)
        return str(result.blob_key)

    def cover_watermark(self) -> None:
        now = self.clock.now_ns()
        for index in INDEXES:
            set_watermark(self.table, index, now - 3600 * _NS, epoch=1, now_ns=now)

    def versions(self, key: str) -> tuple[list[str], list[str]]:
        vs = self.store.versions_of(key)
        return [v.version_id for v in vs if not v.delete_marker], [v.version_id for v in vs if v.delete_marker]


def memory_world(*, accepted_at_ns: int = T0_NS, now_ns: int | None = None, grace_s: int = 0,
                 **overrides: Any) -> MemoryWorld:
    """Batches accepted at ``accepted_at_ns``; now (default) is past the retry horizon after it."""
    clock = FrozenClock(now_ns if now_ns is not None else accepted_at_ns + (HORIZON_S + 60) * _NS)
    system = memory_system(clock=clock, retry_horizon_s=HORIZON_S, gc_grace_s=grace_s, retention_s=RETENTION_S,
                           rollup_retention_s=RETENTION_S, **overrides)
    return MemoryWorld(system, clock, FrozenClock(accepted_at_ns))


def walk(walker: Walker, clock: FrozenClock, **inp: Any) -> dict[str, Any]:
    """The loop of infra/statemachines/bootstrap_walk.asl.json in Python: Begin, then Plan and a
    round of Pages (each partition's page after page until it is done or the round ends) until
    Plan says finish, then End."""
    w = walker.begin({"input": inp, "execution_arn": "inline"})["walk"]
    for _ in range(1000):
        planned = walker.plan({"walk": w})
        w = planned["walk"]
        if planned["next"] == "finish":
            return walker.end({"walk": w, "outcome": "finished"})
        assert planned["next"] == "pages", planned
        for item in planned["work"]:
            walker.page({"walk": w, "item": item})
    raise AssertionError("the walk did not finish")
