"""The audit's read of GC's marks (pipeline/audit/confirm.py ``gc_marked_blobs``) over the marks shards
(docs/protocol.md §15 G-I10, §17 E8): the previous version's partition first, then the 32 shards sent
at once — two round trips of the driver, and in the simulation one step of the audit for the shards
(harness/sim/scheduler.py ``OneStepExecutor``), each Query still meeting its own fault.

An old writer's item that a new writer moves to its shard while the audit reads (one transaction:
put under the shard, delete under ``checkpoint#reap``) is in one answer or the other, whenever the
move lands; read shards first, it was missed when it landed between the two reads.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from lightmetrics.harness.sim.proxies import FaultPlan, SimControlTable
from lightmetrics.harness.sim.scheduler import InlineExecutor, OneStepExecutor, Scheduler, SimClock
from lightmetrics.harness.testing.memory import InMemoryControlTable
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.reaps.gc_marks import (
    LEGACY_MARKS_PK,
    MARKS_SHARDS,
    Mark,
    MarksItem,
    marks_pk,
    page_ops,
    page_prefix,
)
from lightmetrics.reaps.state import MarkState
from lightmetrics_pipeline.audit.confirm import gc_marked_blobs

CODEC = KeyCodec("")
SHA = "ab" * 32
BLOB = CODEC.raw_blob(SHA)


def _mark() -> Mark:
    return Mark(BLOB, SHA, "v1", None, 10**18, 3600, "unreferenced", agent_hex="61", boot_hex="62",
                seq_start=0, seq_end=9)


def _old_writers_page(table: InMemoryControlTable) -> tuple[str, str]:
    """Page 5 of epoch 1 as the previous version recorded it: under ``checkpoint#reap``."""
    (put,) = page_ops(1, 5, [_mark()], MarksItem(MarkState.MARKED, marked_at_ns=10**18), [])
    table.put({**put.item, "pk": LEGACY_MARKS_PK, "sk": put.sk})
    return LEGACY_MARKS_PK, put.sk


class MovesDuringRead:
    """The table, where a new writer's rewrite of the page (``page_ops`` replacing the old item)
    lands right after the audit's ``n``-th Query is answered."""

    def __init__(self, inner: InMemoryControlTable, n: int, old_key: tuple[str, str]) -> None:
        self.inner, self.n, self.old_key, self.queries = inner, n, old_key, 0

    def query(self, pk: str, **kw: Any) -> Any:
        answer = self.inner.query(pk, **kw)
        self.queries += 1
        if self.queries == self.n:
            self.inner.transact(page_ops(1, 5, [_mark()], MarksItem(MarkState.MARKED, marked_at_ns=10**18),
                                         [self.old_key]))
        return answer


@pytest.mark.parametrize("n", range(1, MARKS_SHARDS + 2))
def test_an_old_writers_item_moved_to_its_shard_during_the_audits_read_is_read(n: int) -> None:
    table = InMemoryControlTable()
    old_key = _old_writers_page(table)
    moving = MovesDuringRead(table, n, old_key)
    assert BLOB in gc_marked_blobs(moving, CODEC, pool=InlineExecutor())
    assert moving.queries == MARKS_SHARDS + 1  # one Query a partition, whatever the history
    assert table.query(old_key[0], sk_prefix="marks#") == [] and table.query(marks_pk(page_prefix(1, 5)))


def test_the_shards_are_sent_at_once_after_the_previous_versions_partition() -> None:
    """The driver's pool gets the 32 shard Queries together, once the old partition answered; its
    own pool when none is given (two round trips)."""
    sent: list[str] = []

    class Recording(InlineExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            sent.append("task")
            return super().submit(fn, *args, **kwargs)

    class Table(InMemoryControlTable):
        def query(self, pk: str, **kw: Any) -> Any:
            sent.append(pk)
            return super().query(pk, **kw)

    table = Table()
    _old_writers_page(table)
    assert gc_marked_blobs(table, CODEC, pool=Recording()) == {BLOB}
    assert sent[:2] == [LEGACY_MARKS_PK, "task"] and sent.count("task") == MARKS_SHARDS
    assert LEGACY_MARKS_PK not in sent[1:]
    assert gc_marked_blobs(table, CODEC) == {BLOB}  # a pool of its own


def _audit_read_steps(fault_rate: float, seed: int) -> tuple[list[str], str | None]:
    """The audit's marks read as the simulation runs it, beside another actor: its trace, and how it ended."""
    scheduler = Scheduler(random.Random(seed), SimClock(0), max_steps=10_000)
    table = SimControlTable(InMemoryControlTable(), scheduler, FaultPlan(random.Random(seed), fault_rate))
    _old_writers_page(table.inner)
    ended: list[str | None] = []

    def audit(actor: Any) -> None:
        try:
            gc_marked_blobs(table, CODEC, pool=OneStepExecutor(scheduler))
            ended.append(None)
        except BaseException as exc:  # noqa: BLE001 - a failed read fails the job
            ended.append(type(exc).__name__)

    scheduler.spawn("audit", audit)
    scheduler.spawn("other", lambda actor: [scheduler.before_call("GetObject", str(i)) for i in range(60)])
    scheduler.run()
    return scheduler.trace, ended[0]


def test_in_the_simulation_the_shards_are_one_step_and_each_query_meets_its_own_fault() -> None:
    trace, ended = _audit_read_steps(0.0, 1)
    audit = [i for i, line in enumerate(trace) if " audit Query " in line]
    assert ended is None and len(audit) == MARKS_SHARDS + 1
    shards = audit[1:]
    assert shards == list(range(shards[0], shards[0] + MARKS_SHARDS))  # no other actor's call between
    assert len({trace[i].split()[0] for i in shards}) == 1  # one step
    # faults still drawn per Query: at a rate of 0.5 some read fails, and the read raises
    failed = [_audit_read_steps(0.5, seed) for seed in range(5)]
    assert all(end is not None for _, end in failed)
    assert all(any("fault" in line and "Query checkpoint#reap#marks#" in line for line in t) or
               any("fault" in line and f"Query {LEGACY_MARKS_PK}" in line for line in t) for t, _ in failed)
