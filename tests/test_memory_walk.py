"""The walk's decisions on the in-memory adapters (fast; tests/test_walk*.py run walks on moto's
Step Functions): what a page repairs and what it settles or skips, a failing key holding the cursor,
and a task that lost its lease changing nothing.
"""

from __future__ import annotations

import pytest
from conftest import ident
from memory_support import memory_world, walk

from lightmetrics.admin.blocker_actions import skip
from lightmetrics.derived.walk import INDEXES, PRESENCE_WALK_INDEXES, Walker, WalkRetryLater, read_watermarks
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.work.leases import LeaseLost

_NS = 1_000_000_000


def _world_with_records(n: int = 6):  # type: ignore[no-untyped-def]
    w = memory_world(settle_s=600)
    results = [w.accept(ident(i, agent=f"agent-{i % 2}")) for i in range(n)]
    return w, results


def test_a_full_walk_repairs_exactly_the_missing_entries_and_proves_every_watermark() -> None:
    w, results = _world_with_records()
    codec = w.ctx.codec
    hour = UtcHour.of_unix_ns(w.accept_clock.now_ns())
    missing = [codec.accepted_by_time(hour, ident(0, agent="agent-0")),
               codec.accepted_by_blob(results[3].frame_sha256, ident(3, agent="agent-1"))]
    w.store.delete_objects([(k, None) for k in missing])
    assert verify(w.ctx, strict=True).violation_counts() == {"missing-derived": 2}
    s = walk(Walker(w.ctx, w.settings), w.clock, page_size=2, parallelism=2, full=True)
    assert s["status"] == "finished" and s["watermark_withheld"] is None
    assert (s["keys_accepted"], s["repairs"], s["outcomes"]["NOOP_RESOLVED"]) == (6, 2, 4)
    derived = [k for p in ("accepted-by-time/", "accepted-by-blob/", "raw-blobs-by-time/") for k in w.store.keys(p)]
    # conditional creates: nothing present was rewritten (a repaired entry: its version, marker, new version)
    assert len(derived) == 18 and all(len(w.store.versions_of(k)) == (3 if k in missing else 1) for k in derived)
    assert all(w.store.head(k) is not None for k in missing) and verify(w.ctx, strict=True).ok
    watermarks = read_watermarks(w.table)
    assert all(watermarks[i] == w.clock.now_ns() - 600 * _NS for i in INDEXES)  # W = start - settle


def test_a_default_walk_settles_a_present_time_entry_without_a_repair() -> None:
    w, results = _world_with_records(4)
    codec = w.ctx.codec
    hour = UtcHour.of_unix_ns(w.accept_clock.now_ns())
    gone_time = codec.accepted_by_time(hour, ident(1, agent="agent-1"))
    gone_blob = codec.accepted_by_blob(results[2].frame_sha256, ident(2, agent="agent-0"))  # behind a present time entry
    w.store.delete_objects([(gone_time, None), (gone_blob, None)])
    s = walk(Walker(w.ctx, w.settings), w.clock, page_size=10)
    assert (s["repairs"], s["keys_present"], s["outcomes"]["NOOP_RESOLVED"]) == (1, 3, 3)
    assert w.store.head(gone_time) is not None
    assert w.store.head(gone_blob) is None  # rule W5: only a full walk finds this one
    watermarks = read_watermarks(w.table)
    assert {i for i, v in watermarks.items() if v is not None} == set(PRESENCE_WALK_INDEXES)


def test_an_unreadable_record_blocks_and_once_skipped_is_counted_not_walked() -> None:
    w, _ = _world_with_records(2)
    bad = w.ctx.codec.accepted(ident(9, agent="agent-0"))
    w.store.put_if_absent(bad, b'{"schema": "garbage"}')
    s = walk(Walker(w.ctx, w.settings), w.clock, full=True)
    assert s["outcomes"]["BLOCKED"] == 1 and "BLOCKED: 1" in s["watermark_withheld"]
    assert read_watermarks(w.table)["accepted-by-time"] is None
    [blocker] = w.ctx.blockers.list(status="open")
    skip(w.ctx, blocker.work_key, who="test", reason="garbage planted by the test")
    gets = w.store.requests["GetObject"]
    s = walk(Walker(w.ctx, w.settings), w.clock, full=True)
    assert (s["outcomes"]["SKIPPED"], s["outcomes"]["BLOCKED"], s["repairs"]) == (1, 0, 0)
    assert w.store.requests["GetObject"] - gets == 2  # the two good records; the skipped one is not read


def test_a_key_that_keeps_failing_holds_the_cursor_and_counts_its_budget() -> None:
    w, _ = _world_with_records(2)
    walker = Walker(w.ctx, w.settings)
    run = walker.begin({"input": {"full": True}, "execution_arn": "x"})["walk"]
    planned = walker.plan({"walk": run})
    item = next(i for i in planned["work"] if "agent=" in i["partition"] and i["partition"].startswith(w.ctx.codec.accepted_root()))
    w.store.fail("GetObject", "SlowDown", key_contains=item["partition"], times=-1)
    with pytest.raises(WalkRetryLater):
        walker.page({"walk": planned["walk"], "item": item})
    part = w.table.get(run["checkpoint_pk"], "part#" + item["partition"])
    assert part["after"] == "" and part["failed_through"] and part["outcomes"]["RETRY_LATER"] == 1
    [budget] = [i for i in w.table.items() if i["pk"].startswith("budget#")]
    assert budget["count"] == 1


def test_a_page_that_lost_its_lease_changes_no_checkpoint() -> None:
    w, results = _world_with_records(2)
    old = Walker(w.ctx, w.settings)
    run = old.begin({"input": {"full": True, "lease_seconds": 360}, "execution_arn": "old"})["walk"]
    planned = old.plan({"walk": run})
    w.clock.advance(361)  # the old execution stalls past its lease; a new walk takes over
    new = Walker(w.ctx, w.settings)
    new.begin({"input": {"full": True}, "execution_arn": "new"})
    before = w.table.items()
    with pytest.raises(LeaseLost):
        old.page({"walk": planned["walk"], "item": planned["work"][0]})
    assert w.table.items() == before
    assert old.end({"walk": planned["walk"], "outcome": "finished"})["status"] == "lease-lost"
    assert w.table.items() == before and all(v is None for v in read_watermarks(w.table).values())
