"""What a walk page asks per acceptance record (docs/protocol.md §13 W4, W5; issue 14).

The page tasks run in-process (``Walker`` methods, no interpreter) on a counted work context, so
every S3 request of a walk is counted. Records get the ``LastModified`` S3 would have given them
(tests/walk_support.py): history of many hours, and reaped hours, is written directly.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import FAST, T0_NS, ident, make_frame
from test_walk import keys_under, make_system
from walk_support import record_times_as_s3_would

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.derived.walk import Walker, boundary_margin_ns, candidate_hours, list_beats_heads, read_watermarks
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import UtcHour

_NS = 1_000_000_000
HOUR = UtcHour.of_unix_ns(T0_NS)  # 16:00; retained records are accepted ten minutes in


def accept_at(system: LocalSystem, runtime: Any, at_ns: int, idents: list[BatchIdentity], *,
              index: bool = True) -> list[Any]:
    """Accept ``idents`` at ``at_ns`` (their records' LastModified too); index them unless told not to."""
    actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=FrozenClock(at_ns), policy=FAST)
    ctx = system.work_context(policy=FAST)

    def one(i: BatchIdentity) -> Any:
        r = accept_batch(actx, i, make_frame(i))
        if index:
            index_accepted(ctx, r.manifest_key)
            index_raw_blob(ctx, r.blob_key)
        return r

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, idents))
    record_times_as_s3_would(system.bucket, results, [at_ns] * len(results))
    return results


def tombstone(runtime: Any, system: LocalSystem, hour: UtcHour) -> None:
    key = system.work_context().codec.retention_tombstone("raw", hour)
    runtime.boto3_client("s3").put_object(Bucket=system.bucket, Key=key, Body=b"{}", IfNoneMatch="*")


def walk_in_process(system: LocalSystem, *, page_size: int = 1000, full: bool = False
                    ) -> tuple[dict[str, Any], dict[str, int]]:
    """One full walk through the Walker's task methods; its summary and its S3 requests by API."""
    counter = RequestCounter()
    walker = Walker(system.work_context(policy=FAST, counter=counter), system.settings)
    out = walker.begin({"input": {"page_size": page_size, "full": full}, "execution_arn": "test",
                        "state_machine_arn": "-"})
    for _ in range(200):
        out = walker.plan({"walk": out["walk"]})
        if out["next"] != "pages":
            break
        for item in out["work"]:
            walker.page({"walk": out["walk"], "item": item, "retry_count": 0})
    assert out["next"] == "finish", out
    summary = walker.end({"walk": out["walk"], "outcome": "finished"})
    return summary, {api: n for api, n in counter.totals.items() if api.startswith("s3.")}


@pytest.fixture
def system(runtime, clock):  # type: ignore[no-untyped-def]
    s = make_system(runtime, clock)
    yield s
    s.stop()


def test_the_boundary_margin_and_the_list_rule():  # type: ignore[no-untyped-def]
    class Skew:
        clock_skew_s = 60

    margin = boundary_margin_ns(Skew())
    assert margin == (60 + 60 + 1) * _NS  # the ingest timeout (resource spec) + skew + LastModified's second
    assert candidate_hours(HOUR.start_ns + 600 * _NS, margin) == [HOUR]
    assert candidate_hours(HOUR.end_ns - 100 * _NS, margin) == [HOUR, HOUR.next()]
    assert candidate_hours(HOUR.start_ns + 100 * _NS, margin) == [HOUR, HOUR + -1]
    # A LIST is billed like a PUT, 12.5 HEADs: 13 entries are the smallest group worth a LIST.
    assert not list_beats_heads(12) and list_beats_heads(13)


def test_a_walk_over_healthy_keys_costs_one_read_each_and_reaped_keys_nothing_at_any_depth(system, runtime):  # type: ignore[no-untyped-def]
    retained_at = HOUR.start_ns + 600 * _NS
    accept_at(system, runtime, retained_at, [ident(n, agent="live", boot="few") for n in range(4)])
    accept_at(system, runtime, retained_at, [ident(n, agent="live", boot="many") for n in range(15)])
    reaped_hours = [HOUR + -(24 + h) for h in range(12)]
    for h in reaped_hours:
        tombstone(runtime, system, h)

    def seed_history(first: int, count: int) -> None:
        # Reaped history: records only (retention deleted their blobs and entries), one boot.
        for k, h in enumerate(reaped_hours):
            accept_at(system, runtime, h.start_ns + 900 * _NS,
                      [ident(k * 100 + first + n, agent="old", boot="b") for n in range(count)], index=False)

    measured = {}
    for depth, (first, count) in (("shallow", (0, 2)), ("deep", (2, 18))):
        seed_history(first, count)  # 2, then 20 records in each of the 12 reaped hours
        history = len(reaped_hours) * (first + count)
        summary, s3 = walk_in_process(system)
        assert summary["keys"] == 19 + history and summary["outcomes"]["NOOP_RESOLVED"] == 19 + history
        assert summary["keys_present"] == 19 and summary["keys_reaped"] == history
        assert summary["repairs"] == 0 and summary["watermark_ns"] is not None
        # Not one record read, not one PUT. A HEAD for each key of the small boot (4 < 13), one LIST
        # for the 15 of the other; one tombstone HEAD per hour (the live one and 12 reaped ones).
        assert s3.get("s3.GetObject", 0) == 0 and s3.get("s3.PutObject", 0) == 0, s3
        assert s3["s3.HeadObject"] == 4 + 1 + len(reaped_hours), s3
        measured[depth] = s3
    # Flat in history: ten times the reaped keys, the same requests.
    assert measured["shallow"] == measured["deep"], measured
    # Per retained key at most one read-class request, besides listings and tombstones.
    assert (measured["deep"]["s3.HeadObject"] - 1 - len(reaped_hours)) / 19 <= 1


def test_a_record_without_its_time_entry_is_repaired_in_full(system, runtime):  # type: ignore[no-untyped-def]
    at = HOUR.start_ns + 600 * _NS
    healthy = accept_at(system, runtime, at, [ident(n, agent="a", boot="b") for n in range(2)])
    (lost,) = accept_at(system, runtime, at, [ident(7, agent="a", boot="b")], index=False)  # lost events
    ctx = system.work_context()
    summary, s3 = walk_in_process(system)
    assert summary["keys_present"] == 2 and summary["repairs"] == 1, summary
    identity = ident(7, agent="a", boot="b")
    assert ctx.codec.accepted_by_time(HOUR, identity) in keys_under(runtime, system.bucket, "accepted-by-time/v1/")
    assert ctx.codec.accepted_by_blob(lost.frame_sha256, identity) in keys_under(runtime, system.bucket,
                                                                                "accepted-by-blob/v1/")
    assert any(lost.frame_sha256 in k for k in keys_under(runtime, system.bucket, "raw-blobs-by-time/v1/"))
    # the missing key: its HEAD, then the repair (GET, 2 PUTs, HEAD blob, PUT); the others a HEAD each
    assert s3["s3.GetObject"] == 1 and s3["s3.PutObject"] == 3, s3
    assert healthy and summary["watermark_ns"] is not None


def test_a_record_near_an_hour_boundary_is_found_in_either_hour(system, runtime):  # type: ignore[no-untyped-def]
    # Accepted just before 17:00 by the ingest clock, created at 17:00:30 by S3's clock; and the
    # other way round: accepted at 17:00:10, created at 16:59:50.
    early, late = ident(1, agent="edge", boot="b"), ident(2, agent="edge", boot="b")
    (r_early,) = accept_at(system, runtime, HOUR.end_ns - _NS // 2, [early])
    (r_late,) = accept_at(system, runtime, HOUR.end_ns + 10 * _NS, [late])
    record_times_as_s3_would(system.bucket, [r_early, r_late], [HOUR.end_ns + 30 * _NS, HOUR.end_ns - 10 * _NS])
    summary, s3 = walk_in_process(system)
    assert summary["keys_present"] == 2 and summary["repairs"] == 0, summary
    assert s3.get("s3.GetObject", 0) == 0 and s3.get("s3.PutObject", 0) == 0, s3


def test_a_record_in_a_tombstoned_hour_is_not_probed_unless_near_an_open_hour(system, runtime):  # type: ignore[no-untyped-def]
    reaped = HOUR + -5
    tombstone(runtime, system, reaped)
    inside = accept_at(system, runtime, reaped.start_ns + 1800 * _NS, [ident(n, agent="r", boot="b") for n in range(3)],
                       index=False)
    # Near the end of the reaped hour: the next hour is open, so the record is probed there (absent)
    # and repaired in full, which finds its own hour tombstoned (D1): NOOP_RESOLVED, nothing written.
    (edge,) = accept_at(system, runtime, reaped.end_ns - 30 * _NS, [ident(9, agent="r", boot="b")], index=False)
    s3_client = runtime.boto3_client("s3")
    for r in [*inside, edge]:  # retention deleted their blobs
        s3_client.delete_object(Bucket=system.bucket, Key=r.blob_key)
    summary, s3 = walk_in_process(system)
    assert summary["keys_reaped"] == 3 and summary["keys_present"] == 0, summary
    assert summary["outcomes"]["NOOP_RESOLVED"] == 4 and summary["repairs"] == 0
    # Only the edge record was read; the three inside the reaped hour cost nothing.
    assert s3["s3.GetObject"] == 1 and s3.get("s3.PutObject", 0) == 0, s3
    assert inside and edge


def test_a_full_walk_repairs_an_entry_deleted_behind_a_present_time_entry(system, runtime):  # type: ignore[no-untyped-def]
    """W5 checks only the time entry; a blob entry deleted behind the system's back is the full
    walk's to repair (``full: true``), and a page larger than one listing covers every key."""
    idents = [ident(n) for n in range(3)]
    results = accept_at(system, runtime, T0_NS - 50 * 60 * _NS, idents)
    codec = system.work_context().codec
    s3 = runtime.boto3_client("s3")
    by_blob = [codec.accepted_by_blob(r.frame_sha256, i) for r, i in zip(results, idents)]
    s3.delete_object(Bucket=system.bucket, Key=by_blob[1])
    default, _ = walk_in_process(system)
    assert default["status"] == "finished" and default["keys_present"] == 3
    # a default walk vouches only for what it checked (W3, W5): the time and quarantine indexes
    marks = read_watermarks(system.work_context().table)
    assert marks["accepted-by-time"] and marks["quarantine-by-blob"]
    assert marks["accepted-by-blob"] is None and marks["raw-blobs-by-time"] is None
    assert by_blob[1] not in keys_under(runtime, system.bucket, codec.prefix + "accepted-by-blob/v1/")  # not seen: verify's to report
    full, requests = walk_in_process(system, full=True)
    assert full["status"] == "finished" and full["outcomes"].get("DONE") == 1
    assert set(by_blob) <= set(keys_under(runtime, system.bucket, codec.prefix + "accepted-by-blob/v1/"))
    assert requests["s3.GetObject"] == 3  # every record read: the full repair
    assert all(read_watermarks(system.work_context().table).values())  # a full walk: every index


def test_an_end_that_lost_the_walk_moves_no_watermark(system, runtime):  # type: ignore[no-untyped-def]
    """Rule L2 for the walk's commit: the watermarks move only after End's owned write succeeded."""
    accept_at(system, runtime, T0_NS - 50 * 60 * _NS, [ident(n) for n in range(2)])
    walker = Walker(system.work_context(policy=FAST), system.settings)
    out = walker.begin({"input": {}, "execution_arn": "test", "state_machine_arn": "-"})
    for _ in range(50):
        out = walker.plan({"walk": out["walk"]})
        if out["next"] != "pages":
            break
        for item in out["work"]:
            walker.page({"walk": out["walk"], "item": item, "retry_count": 0})
    assert out["next"] == "finish"
    # The lease expired and another run took it after this End read its checkpoint (still its own).
    table = system.work_context().table
    lease = table.get("lease#walk", "lease")
    table.put({**lease, "owner": "another-run", "epoch": int(lease["epoch"]) + 1})
    assert walker.end({"walk": out["walk"], "outcome": "finished"})["status"] == "lease-lost"
    assert set(read_watermarks(table).values()) == {None}
    table.put(lease)  # the lease back: the same End now commits, then moves the watermarks
    assert walker.end({"walk": out["walk"], "outcome": "finished"})["status"] == "finished"
    assert read_watermarks(table)["accepted-by-time"] is not None
