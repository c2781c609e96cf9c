"""Crash safety of the reaps (issue 6, item 4): a kill at every registered crash point, then resume.

The registry is :data:`lightmetrics.work.crashpoints.REGISTRY` — every durable step of gc.py,
retention.py and reap.py registers its point there. For each point, a fresh world (an orphan, an
expired hour with three accepted batches and their derived entries, and a second expired hour
whose one record vanished) runs a GC reap and then retention reaps of those hours; the injected
crash kills the task at that point once, the task is retried with the same input (what the ASL's
Retry does when a Lambda dies), and afterwards the invariants hold (``verify`` strict) and the
reaps did all their work — the second hour once its blocker is skipped. The number of points that
fired is asserted equal to the registry's size, so a new step without a crash test fails here.
One point is also exercised by a real process kill (``LM_CRASH_AT`` → ``os._exit``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ALL_BACKENDS, ident
from reap_support import OLD_NS, World, drive, drive_from, make_world, rollup_keys

import lightmetrics.reaps  # noqa: F401  (registers the reap's points)
from lightmetrics.admin.blocker_actions import skip
from lightmetrics.harness.testing.crashes import CRASH_ENV
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.work import crashpoints

BACKENDS = ALL_BACKENDS  # storage semantics: every test runs on moto and on MiniStack

HOUR = UtcHour.of_unix_ns(OLD_NS)
BLOCKED_HOUR = HOUR + 1  # its one record vanished: a reap-retention blocker
RETENTION = {"mode": "retention", "dry_run": False, "hour": str(HOUR), "tombstone_wait_s": 0}
BLOCKED_RETENTION = {"mode": "retention", "dry_run": False, "hour": str(BLOCKED_HOUR), "tombstone_wait_s": 0}
# One task per execution: every step also crosses a continuation (Continue, then the next Begin).
GC = {"mode": "gc", "dry_run": False, "max_tasks_per_execution": 1}
ROLLUP = {"mode": "retention", "scope": "rollup", "dry_run": False, "hour": str(HOUR), "tombstone_wait_s": 0}
RESULTS: dict[str, str] = {}


def crash_world(bucket: str) -> tuple[World, list, str]:  # type: ignore[type-arg]
    w = make_world(bucket)
    accepted = [w.accept(ident(n)) for n in range(3)]
    orphan = w.orphan(ident(9))
    w.old.clock.advance(3600)
    lost = w.accept(ident(20))
    w.old.clock.advance(-3600)
    w.s3.delete_object(Bucket=w.settings.bucket, Key=lost.manifest_key)
    w.rollups(HOUR)
    w.cover_watermark()
    return w, accepted, orphan


def reap_blocked_hour(w: World) -> None:
    """The hour with a vanished record: left blocked, then finished once the blocker is skipped."""
    first = drive(w.reaper(), BLOCKED_RETENTION, w.clock)
    assert first["hours_reaped"] == [] and first["hours_skipped"][str(BLOCKED_HOUR)].startswith("blocked"), first
    [blocker] = w.ctx.blockers.list()
    skip(w.ctx, blocker.work_key, who="crash-test", reason="the record vanished")
    second = drive(w.reaper(), BLOCKED_RETENTION, w.clock)
    assert second["hours_reaped"] == [str(BLOCKED_HOUR)], second


def assert_reaped(w: World, accepted: list, orphan: str) -> None:  # type: ignore[type-arg]
    assert not w.blob_exists(orphan) and w.versions(orphan) == ([], [])
    for r in accepted:
        assert w.ctx.store.get(r.manifest_key) is not None
        assert w.versions(r.blob_key) == ([], []), r.blob_key  # neither marker nor version left
    codec = w.ctx.codec
    assert w.ctx.store.head(codec.retention_reaped("raw", HOUR)) is not None
    assert w.ctx.store.list_keys(codec.accepted_by_time_hour(HOUR)) == []
    assert w.ctx.store.list_keys(codec.prefix + "accepted-by-blob/v1/") == []
    assert w.ctx.store.head(codec.retention_reaped("rollup", HOUR)) is not None
    assert w.ctx.store.head(codec.retention_reaped("raw", BLOCKED_HOUR)) is not None
    assert w.ctx.store.list_keys(codec.accepted_by_time_hour(BLOCKED_HOUR)) == []
    for prefix in ("rollup/v1/", "index/v1/", "manifests/v1/"):
        assert w.ctx.store.list_keys(codec.prefix + prefix) == []
    report = verify(w.ctx, strict=True)
    assert report.ok, report.violations


#: The reaps' own points (gc.py, retention.py, reap.py); other modules' points have their own tests.
REAP_POINTS = sorted(p for p in crashpoints.REGISTRY if p.split(".")[0] in ("gc", "retention", "reap"))


@pytest.mark.parametrize("point", REAP_POINTS)
def test_crash_at_every_registered_point_then_resume(runtime, point: str) -> None:  # type: ignore[no-untyped-def]
    from conftest import make_bucket

    w, accepted, orphan = crash_world(make_bucket(runtime))
    hook, seen = crashpoints.crash_once_at(point)
    fired: list[str] = []

    def recording(name: str) -> None:
        try:
            hook(name)
        except crashpoints.InjectedCrash:
            fired.append(name)
            raise

    with crashpoints.hooked(recording):
        gc_report = drive(w.reaper(), GC, w.clock)
        retention_report = drive(w.reaper(), RETENTION, w.clock)
        rollup_report = drive(w.reaper(), ROLLUP, w.clock)
        reap_blocked_hour(w)
    # A crash in the middle of a page loses that page's count (deletes are counted when recorded),
    # never its effect: assert_reaped checks the state.
    rollup_objects = len(rollup_keys(w.ctx.codec, HOUR))
    assert rollup_report["hours_reaped"] == [str(HOUR)] and 1 <= rollup_report["purged"] <= rollup_objects
    assert fired == [point], f"{point} was never reached (reached: {sorted(seen)})"
    # The orphan, and the blob whose record vanished (nothing references it any more).
    assert gc_report["purged"] == 2 and retention_report["hours_reaped"] == [str(HOUR)]
    assert_reaped(w, accepted, orphan)
    RESULTS[point] = "crashed once, resumed, verify ok"


def test_every_registered_point_was_exercised() -> None:
    # Runs after the parametrized cases (file order): the registry and the exercised set agree.
    assert set(RESULTS) == set(REAP_POINTS), sorted(set(REAP_POINTS) - set(RESULTS))
    assert len(RESULTS) == len(REAP_POINTS)


def test_a_real_process_kill_between_marker_and_record(runtime, bucket: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w, accepted, orphan = crash_world(bucket)
    events = tmp_path / "event.json"
    worker = Path(__file__).with_name("reap_worker.py")
    env = {**os.environ, CRASH_ENV: "gc.marked-one"}
    proc = subprocess.run([sys.executable, str(worker), bucket, str(w.clock.now_ns()), json.dumps(GC), str(events)],
                          env=env, timeout=120)
    assert proc.returncode == 137  # killed at the point: a marker placed, the page not recorded
    markers = w.s3.list_object_versions(Bucket=bucket, Prefix=w.ctx.codec.prefix + "raw-blobs/v1/")
    assert markers.get("DeleteMarkers")  # (two blobs are marked in parallel: which one first varies)
    last = json.loads(events.read_text())
    assert last["next"] == "gc"
    # Step Functions retries the task whose Lambda died, with the same input.
    gc_report = drive_from(w.reaper(), {"next": "gc", "reap": last["event"]["reap"]}, w.clock)
    assert gc_report["purged"] == 2 and gc_report["status"] == "finished"
    drive(w.reaper(), RETENTION, w.clock)
    drive(w.reaper(), ROLLUP, w.clock)
    reap_blocked_hour(w)
    assert_reaped(w, accepted, orphan)
