"""The steady-state reconciler's decisions on the in-memory adapters (fast; tests/test_reconcile*.py
run it on moto): entries an event path lost are repaired from ``accepted-by-time``, a second pass
changes nothing, and a record whose blob is gone blocks instead of being "repaired". The queue probe
is a port too (:class:`~lightmetrics.protocol.queue_probe.QueueProbe`): here, quiet queues.
"""

from __future__ import annotations

from conftest import ident
from memory_support import memory_world

from lightmetrics.derived.indexing import KIND_REPAIR, index_accepted, index_raw_blob
from lightmetrics.derived.reconcile import Reconciler


class QuietQueues:
    """Every index queue empty, every DLQ empty."""

    def quiet_since(self, hour_end_ns: int, now_ns: int) -> bool:
        return True

    def dlqs_empty(self) -> bool:
        return True


def test_a_lost_event_is_repaired_and_a_present_hint_settles_an_entry_without_a_repair() -> None:
    w = memory_world()
    a, b = w.accept(ident(1), index=False), w.accept(ident(2), index=False)
    for r in (a, b):
        index_accepted(w.ctx, r.manifest_key)
    index_raw_blob(w.ctx, b.blob_key)  # a's blob event was lost
    puts = w.store.requests["PutObject"]
    report = Reconciler(w.ctx, w.settings, QuietQueues()).run()
    # a: the full repair (its hint was missing); b: its blob's hint is listed in its hour, so every
    # derived entry of b is known present (D5, D6) and nothing is requested for it
    assert report.entries == 2 and report.outcomes == {"DONE": 1, "NOOP_RESOLVED": 1}
    assert len(w.store.keys("raw-blobs-by-time/")) == 2
    assert w.store.requests["PutObject"] - puts == 1  # only a's missing hint is written; nothing for b
    before = {k: len(w.store.versions_of(k)) for k in w.store.keys()}
    again = Reconciler(w.ctx, w.settings, QuietQueues()).run()
    assert again.outcomes == {"NOOP_RESOLVED": 2}, again.outcomes
    assert {k: len(w.store.versions_of(k)) for k in w.store.keys()} == before  # nothing written


def test_a_record_whose_blob_is_gone_blocks_and_nothing_is_written_for_it() -> None:
    w = memory_world()
    r = w.accept(ident(3), index=False)
    index_accepted(w.ctx, r.manifest_key)
    w.store.delete_objects([(r.blob_key, None)])
    report = Reconciler(w.ctx, w.settings, QuietQueues()).run()
    assert report.outcomes == {"BLOCKED": 1}
    [blocker] = w.ctx.blockers.list()
    assert blocker.kind == KIND_REPAIR and "integrity" in blocker.reason and r.blob_key in blocker.reason
    assert w.store.keys("raw-blobs-by-time/") == []
