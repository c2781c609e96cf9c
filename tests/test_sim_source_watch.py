"""The simulation's per-step check "no derived entry without its source": an entry written for a
record that does not exist, and a record deleted under its entries, are each found at the step that
made them; the planted history alone is clean."""

from __future__ import annotations

from lightmetrics.harness.sim.source_watch import SourceWatch
from lightmetrics.harness.sim.world import build_world, identity


def test_an_entry_without_its_record_and_a_record_deleted_under_its_entries_are_each_found() -> None:
    world = build_world(5, fault_rate=0.0, max_steps=10)
    watch = SourceWatch(world)
    store, codec = world.system.store, world.system.ctx.codec
    assert watch.check() == []
    records = store.keys(codec.accepted_root())
    named = {src for src, entries in watch.entries_of.items() if any(store._current(e) for e in entries)}
    victim = next(k for k in records if k in named)  # a planted record with its entries

    ghost = identity(9_999, agent="agent-ghost")
    store.put_if_absent(codec.accepted_by_time(world.old_hour, ghost), b"{}")
    found = watch.check()
    assert len(found) == 1 and codec.accepted(ghost) in found[0] and "does not exist" in found[0], found

    store.delete(victim)  # a delete marker on top: the record is absent
    found = watch.check()
    assert found and all(victim in f and "was deleted" in f for f in found), found
    assert watch.check() == []  # only what a step changed is re-checked
