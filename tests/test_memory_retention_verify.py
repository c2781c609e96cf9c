"""Retention's and verify's decisions on the in-memory adapters (fast; tests/test_reap*.py,
tests/test_retention_*.py and the invariant tests run the same on moto): a tombstoned hour's
objects go and nothing else does; verify names each planted fault.
"""

from __future__ import annotations

from conftest import ident
from memory_support import memory_world
from reap_support import drive

from lightmetrics.harness.testing.memory import T0_NS
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps import Reaper

_NS = 1_000_000_000
OLD_NS = T0_NS - 10 * 86400 * _NS


def _two_hours():  # type: ignore[no-untyped-def]
    """Three batches in an expired hour and two in a recent one, all indexed."""
    w = memory_world(accepted_at_ns=OLD_NS, now_ns=T0_NS)
    old = [w.accept(ident(i)) for i in range(3)]
    w.accept_clock.advance(9 * 86400)
    recent = [w.accept(ident(i, agent="agent-b")) for i in range(2)]
    return w, old, recent


def _derived_and_blob(w, result) -> set[str]:  # type: ignore[no-untyped-def]
    codec, hour = w.ctx.codec, UtcHour.of_unix_ns(OLD_NS)
    identity = codec.parse(result.manifest_key).identity
    return {codec.accepted_by_time(hour, identity), codec.accepted_by_blob(result.frame_sha256, identity),
            codec.raw_blobs_by_time(hour, result.frame_sha256), result.blob_key}


def test_retention_removes_the_tombstoned_hours_objects_and_nothing_else() -> None:
    w, old, recent = _two_hours()
    w.cover_watermark()
    hour = UtcHour.of_unix_ns(OLD_NS)
    before = set(w.store.keys())
    report = drive(Reaper(w.ctx, w.settings), {"mode": "retention", "dry_run": False, "hour": str(hour)}, w.clock)
    assert report["status"] == "finished"
    after = set(w.store.keys())
    assert before - after == set().union(*(_derived_and_blob(w, r) for r in old))
    codec = w.ctx.codec
    assert after - before == {codec.retention_tombstone("raw", hour), codec.retention_reaped("raw", hour)}
    assert all(w.store.versions_of(r.blob_key) == [] for r in old)  # purged, not only hidden
    assert all(r.manifest_key in after for r in old + recent)  # acceptance records are permanent
    assert w.table.get("retention#raw", str(hour))["status"] == "reaped"
    assert verify(w.ctx, strict=True).ok


def test_retention_of_an_hour_the_watermark_does_not_cover_deletes_nothing() -> None:
    w, _, _ = _two_hours()  # no walk has proved the indexes complete
    before = set(w.store.keys())
    drive(Reaper(w.ctx, w.settings), {"mode": "retention", "dry_run": False, "hour": str(UtcHour.of_unix_ns(OLD_NS))},
          w.clock)
    assert set(w.store.keys()) == before
    assert w.store.requests["DeleteObjects"] == w.store.requests["DeleteObject"] == 0


def test_verify_is_clean_on_a_consistent_namespace_and_names_each_planted_fault() -> None:
    w, old, recent = _two_hours()
    assert verify(w.ctx, strict=True).ok
    codec, hour = w.ctx.codec, UtcHour.of_unix_ns(OLD_NS)
    # a blob gone in an hour no retention tombstoned
    w.store.delete_objects([(old[0].blob_key, None)])
    # a blob of another size than its record says
    w.store.delete_objects([(old[1].blob_key, None)])
    w.store.put_if_absent(old[1].blob_key, b"short")
    # a derived entry with no record behind it, and a derived entry gone
    stray = codec.accepted_by_time(hour, ident(7, agent="agent-z"))
    w.store.put_if_absent(stray, b"{}")
    gone = codec.accepted_by_blob(recent[0].frame_sha256, codec.parse(recent[0].manifest_key).identity)
    w.store.delete_objects([(gone, None)])
    # a record no reader can trust, and a reaped marker without its tombstone
    w.store.put_if_absent(codec.accepted(ident(8, agent="agent-z")), b'{"schema": "nope"}')
    w.store.put_if_absent(codec.retention_reaped("raw", UtcHour.of_unix_ns(OLD_NS - 86400 * _NS)), b"{}")
    report = verify(w.ctx, strict=True)
    found = {(f.rule, f.keys[0]) for f in report.violations}
    assert found == {
        ("blob-missing", old[0].manifest_key), ("blob-size", old[1].manifest_key),
        ("derived-without-source", stray), ("missing-derived", recent[0].manifest_key),
        ("derived-without-source", codec.raw_blobs_by_time(hour, old[0].frame_sha256)),  # the missing blob's hint
        ("invalid-manifest", codec.accepted(ident(8, agent="agent-z"))),
        ("reaped-without-tombstone", codec.retention_reaped("raw", UtcHour.of_unix_ns(OLD_NS - 86400 * _NS))),
    }
    lenient = verify(w.ctx)  # no watermark yet: a missing entry is pending, not a violation
    assert "missing-derived" not in lenient.violation_counts() and lenient.pending["accepted-by-blob"] == 1


def test_a_skipped_stray_key_under_an_hour_never_stops_its_retention() -> None:
    """The simulation found it (R-I5): a key outside the layout under an expired hour's
    ``accepted-by-time`` prefix blocks only itself; once an operator skips its blocker, the next reap
    deletes it and reaps the hour (before the fix, every later reap of the hour failed on the skipped
    key with KeyLayoutError)."""
    from lightmetrics.admin.blocker_actions import skip

    w, old, _ = _two_hours()
    w.cover_watermark()
    hour = UtcHour.of_unix_ns(OLD_NS)
    stray = w.ctx.codec.accepted_by_time_hour(hour) + "stray-upload.json"
    w.store.put_if_absent(stray, b"{}")
    job = {"mode": "retention", "dry_run": False, "hour": str(hour)}
    first = drive(Reaper(w.ctx, w.settings), job, w.clock)
    assert first["status"] == "finished" and str(hour) in first["hours_skipped"], first
    assert stray in w.store.keys() and w.table.get("retention#raw", str(hour))["status"] == "tombstoned"
    skip(w.ctx, f"reap-retention:{stray}", who="op", reason="a stray upload")
    second = drive(Reaper(w.ctx, w.settings), job, w.clock)
    assert second["status"] == "finished", second
    assert stray not in w.store.keys() and w.table.get("retention#raw", str(hour))["status"] == "reaped"
    assert all(r.manifest_key in w.store.keys() for r in old)
