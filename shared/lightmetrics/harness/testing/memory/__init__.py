"""In-memory adapters of the object-store and control-table ports, for fast unit tests of the
decisions beside the moto-backed ones (never instead of them); and of the executions port
(:mod:`~lightmetrics.harness.testing.memory.executions`) for the drivers that run a job's tasks inline.

:func:`memory_system` builds one bucket and one table on a shared clock, and the work context
(:class:`~lightmetrics.work.units.WorkContext`) and accept context the services run on — the same
objects :mod:`lightmetrics.composition.services` builds from boto3, with these adapters in their place.
``tests/test_memory_contract.py`` holds both adapters to moto's behaviour.

Example:
    >>> system = memory_system(clock=FrozenClock(1_764_000_000 * 10**9))
    >>> system.ctx.store.put_if_absent("k", b"{}")[0].value
    'created'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightmetrics.acceptance.accept import AcceptContext
from lightmetrics.deployment.settings import Settings
from lightmetrics.harness.testing.memory.control_table import InMemoryControlTable
from lightmetrics.harness.testing.memory.object_store import NO_WAIT, InMemoryObjectStore
from lightmetrics.protocol.clock import Clock, FrozenClock
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.protocol.metrics import MetricsSink, NoMetrics
from lightmetrics.protocol.retry import RetryPolicy
from lightmetrics.work.blockers import BlockerStore
from lightmetrics.work.retry_budget import RetryBudget
from lightmetrics.work.units import WorkContext

#: A fixed time for tests (2025-11-24T16:00:00Z).
T0_NS = 1_764_000_000_000_000_000


@dataclass
class MemorySystem:
    """One in-memory bucket and table, the settings, and the contexts built on them."""

    store: InMemoryObjectStore
    table: InMemoryControlTable
    settings: Settings
    clock: Any
    ctx: WorkContext
    accept: AcceptContext


def memory_system(*, clock: Clock | None = None, settings: Settings | None = None, prefix: str = "",
                  metrics: MetricsSink | None = None, policy: RetryPolicy = NO_WAIT, versioned: bool = True,
                  **overrides: Any) -> MemorySystem:
    """In-memory adapters and the contexts on them; ``overrides`` are :class:`Settings` fields."""
    clock = clock if clock is not None else FrozenClock(T0_NS)
    settings = settings or Settings.from_env({}, timing_rules=False, bucket="lm-memory", prefix=prefix,
                                             collector_id="collector-memory", **overrides)
    store = InMemoryObjectStore(settings.bucket, clock=clock, versioned=versioned, read_policy=policy)
    table = InMemoryControlTable(settings.table)
    metrics = metrics or NoMetrics()
    codec = KeyCodec(settings.prefix)
    ctx = WorkContext(store=store, codec=codec,
                      budget=RetryBudget(table, max_count=settings.retry_budget_count,
                                         max_age_s=settings.retry_budget_age_s, clock=clock),
                      blockers=BlockerStore(table, clock), table=table, settings=settings, clock=clock,
                      metrics=metrics, policy=policy)
    accept = AcceptContext(store=store, codec=codec, collector_id=settings.collector_id,
                           max_frame_bytes=settings.max_frame_bytes, clock=clock, policy=policy, metrics=metrics)
    return MemorySystem(store, table, settings, clock, ctx, accept)


__all__ = ["InMemoryControlTable", "InMemoryObjectStore", "MemorySystem", "NO_WAIT", "T0_NS", "memory_system"]
