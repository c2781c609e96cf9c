"""Dry runs (issue 23; docs/protocol.md §16.1 DR1, DR2): a dry run deletes nothing — whatever its
mode and source, and whatever marks a failed reap left — and it counts everything it reports.

Every test runs the reap's real task methods against moto (:func:`reap_support.drive`), with a
botocore hook recording every S3 request the dry run sends.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import ident
from reap_support import OLD_NS, World, drive, make_world

from lightmetrics.cli.reap_cmds import report_rows
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.reaps.gc_marks import stored_marks_items
from lightmetrics.work import crashpoints

HOUR = UtcHour.of_unix_ns(OLD_NS)
GC = {"mode": "gc", "dry_run": True}
RETENTION = {"mode": "retention", "dry_run": True}
#: S3 requests that change nothing; a dry run sends no other.
READS = ("Get", "Head", "List")

DRY_RUNS = {  # every GC source the input allows (reaps.params.SOURCES, audit by run and 'latest'), and retention
    "gc-scan": {**GC, "source": "scan"},
    "gc-by-time": {**GC, "source": "by-time"},
    "gc-by-time-hour": {**GC, "source": "by-time", "hour": str(HOUR)},
    "gc-audit-run": {**GC, "source": "audit", "audit_run": "week-1"},
    "gc-audit-latest": {**GC, "source": "audit", "audit_run": "latest"},
    "retention-hour": {**RETENTION, "hour": str(HOUR)},
    "retention-expired": {**RETENTION},
    "rollup-retention": {**RETENTION, "scope": "rollup", "hour": str(HOUR)},
}


def _s3_requests(w: World) -> list[tuple[str, str]]:
    """Every S3 request sent from now on, as ``(operation, key or prefix)``."""
    seen: list[tuple[str, str]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        seen.append((model.name, str(params.get("Key", params.get("Prefix", "")))))

    w.s3.meta.events.register("before-parameter-build.s3", record)
    return seen


def _marks_items(w: World) -> list[dict[str, Any]]:
    return [dict(i) for i in stored_marks_items(w.ctx.table)]


def _failed_gc(w: World, orphan: str) -> None:
    """A non-dry GC that marked the orphan (marker placed, mark recorded) and died before settling;
    the ASL's Abort released its lease."""
    w.ctx.store.put_if_absent(f"{w.ctx.codec.audit_run('week-1')}orphan-blob-candidates/part-00000.jsonl",
                              json.dumps({"blob_key": orphan}).encode())
    w.ctx.store.put_if_absent(f"{w.ctx.codec.audit_run('week-1')}summary.json", b"{}")
    w.ctx.store.put_if_absent(w.ctx.codec.audit_committed(1_764_000_000, "week-1"), b"{}")
    hook, _ = crashpoints.crash_once_at("reap.page-recorded")
    with crashpoints.hooked(hook), pytest.raises(crashpoints.InjectedCrash):
        drive(w.reaper(), {**GC, "dry_run": False, "source": "audit", "audit_run": "latest"}, w.clock, attempts=1)
    w.reaper().end({"reap": {**w.ctx.table.get("checkpoint#reap", "current")}, "outcome": "failed",
                    "error": {"Error": "InjectedCrash"}})


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_a_dry_run_deletes_nothing_and_reports_the_marks_a_failed_reap_left(bucket: str, name: str) -> None:
    """DR1: no dry run — GC of any source, ``latest`` included, or retention — sends a request that
    changes S3 or settles a mark; the marks a failed reap left stay as they are, and are reported."""
    w = make_world(bucket)
    accepted = [w.accept(ident(n)) for n in range(2)]
    orphan = w.orphan(ident(9))
    w.rollups(HOUR)
    w.cover_watermark()
    _failed_gc(w, orphan)
    sha = w.ctx.codec.parse(orphan).sha256 or ""
    [hint] = [k for k in w.ctx.store.list_keys(w.ctx.codec.root(KeyKind.RAW_BLOBS_BY_TIME)) if sha in k]
    marks, versions = _marks_items(w), w.versions(orphan)
    assert marks and len(versions[1]) == 1 and not w.blob_exists(orphan)  # hidden under the failed reap's marker

    sent = _s3_requests(w)
    report = drive(w.reaper(), DRY_RUNS[name], w.clock)

    assert report["status"] == "finished" and report["dry_run"] is True, report
    assert [r for r in sent if not r[0].startswith(READS)] == []
    assert _marks_items(w) == marks and w.versions(orphan) == versions
    assert w.ctx.store.head(hint) is not None and all(w.blob_exists(r.blob_key) for r in accepted)
    assert (report["purged"], report["restored"], report["marked"]) == (0, 0, 0)
    assert report["would_settle"] == 1, report
    assert ("would settle", "1 (blobs a failed reap marked; the next reap run with --execute settles them)") \
        in report_rows(w.reap_report())  # what lmctl reap prints


def _write_entries(w: World, n: int) -> None:
    """``n`` ``accepted-by-time`` entries in HOUR (a dry run lists them; it reads none)."""
    keys = [w.ctx.codec.accepted_by_time(HOUR, ident(i, agent="many")) for i in range(n)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: w.s3.put_object(Bucket=w.settings.bucket, Key=k, Body=b"{}"), keys))


def test_a_retention_dry_run_counts_every_entry_of_an_hour_one_list_per_1000(bucket: str) -> None:
    """DR2: an hour of more than 1,000 entries (one listing page) is counted whole, one LIST per
    1,000 keys."""
    w = make_world(bucket)
    _write_entries(w, 1234)
    sent = _s3_requests(w)
    report = drive(w.reaper(), {**RETENTION, "hour": str(HOUR)}, w.clock)
    assert (report["examined"], report["deletable"]) == (1234, 1234), report
    listed = [r for r in sent if r == ("ListObjectsV2", w.ctx.codec.accepted_by_time_hour(HOUR))]
    assert len(listed) == 2 and report["hours_skipped"] == {str(HOUR): "would-reap"}


def test_a_retention_dry_run_counts_across_tasks_and_rollup_prefixes(bucket: str, monkeypatch: Any) -> None:
    """DR2 with small pages: the count goes on from its cursor in the next task (each task lists at
    most LISTS_PER_TASK pages) and across the rollup scope's prefixes, and counts each key once."""
    from lightmetrics.reaps import dry_run

    w = make_world(bucket)
    keys = w.rollups(HOUR)
    w.rollups(HOUR + 1)  # the next hour's: not counted
    _write_entries(w, 7)
    monkeypatch.setattr(dry_run, "PAGE_KEYS", 2)
    monkeypatch.setattr(dry_run, "LISTS_PER_TASK", 2)
    rollup = drive(w.reaper(), {**RETENTION, "scope": "rollup", "hour": str(HOUR)}, w.clock)
    assert rollup["examined"] == len(keys), rollup
    raw = drive(w.reaper(), {**RETENTION, "hour": str(HOUR)}, w.clock)
    assert raw["examined"] == 7, raw


def test_a_gc_dry_run_counts_past_the_pages_a_failed_reap_left(bucket: str) -> None:
    """DR2 for GC: ``max_pending_pages`` bounds the pages a run marked; a dry run marks none, so a
    failed reap's pending pages never end its count after one page."""
    w = make_world(bucket)
    orphan = w.orphan(ident(9))
    _failed_gc(w, orphan)
    others = [w.orphan(ident(n)) for n in (7, 8)]
    report = drive(w.reaper(), {**GC, "source": "scan", "page_size": 1, "max_pending_pages": 1}, w.clock)
    # the marked orphan lists no more (its marker is current): the two others, on two pages
    assert (report["examined"], report["deletable"], report["would_settle"]) == (2, 2, 1), report
    assert all(w.blob_exists(k) for k in others)


def test_a_dry_run_that_reached_a_settle_would_refuse_before_any_delete(bucket: str) -> None:
    """DR1 in general: every S3 write of a reap follows its fence, and a dry run's fence refuses.
    A dry run put into the settle phase that ends a GC (as a path that forgot the rule would: the
    one that reads the marks a failed reap left, G-I10) sends no delete."""
    from lightmetrics.reaps.dry_run import DryRunWrite

    w = make_world(bucket)
    orphan = w.orphan(ident(9))
    _failed_gc(w, orphan)
    marks, versions = _marks_items(w), w.versions(orphan)
    out = w.reaper().begin({"input": {**GC, "source": "scan"}, "execution_arn": "dry"})
    w.ctx.table.update("checkpoint#reap", "current", "SET #p = :p, #l = :l", names={"#p": "phase", "#l": "listing_done"},
                       values={":p": "settle", ":l": True})
    sent = _s3_requests(w)
    with pytest.raises(DryRunWrite, match="is a dry run: a dry run sends no write"):
        w.reaper().gc({"reap": out["reap"]})
    assert [r for r in sent if not r[0].startswith(READS)] == []
    assert _marks_items(w) == marks and w.versions(orphan) == versions


@pytest.mark.parametrize("inp", [{**GC, "resume": True}, {**RETENTION, "resume": True},
                                 {**RETENTION, "dry_run": False, "resume": True}], ids=["dry-gc", "dry-retention",
                                                                                         "retention"])
def test_a_dry_run_deletes_nothing_even_when_it_asks_to_resume(bucket: str, inp: dict[str, Any]) -> None:
    """DR1 with ``resume``: a resume carries on the failed reap as it was started, so one whose mode
    or dry_run differ from the checkpoint's is refused before any write — it never settles the
    failed GC's marks in the name of a dry run, nor runs a GC asked to be retention."""
    from lightmetrics.reaps import InvalidReapInput, ReapControl

    w = make_world(bucket)
    orphan = w.orphan(ident(9))
    _failed_gc(w, orphan)
    marks, versions = _marks_items(w), w.versions(orphan)
    checkpoint, lease = w.ctx.table.get("checkpoint#reap", "current"), w.ctx.table.get("lease#reap", "lease")
    sent = _s3_requests(w)
    with pytest.raises(InvalidReapInput) as refused:
        drive(w.reaper(), inp, w.clock)
    message = str(refused.value)
    assert "resume" in message and f"dry_run {str(inp['dry_run']).lower()}" in message, message
    assert "dry_run false" in message and "mode gc" in message, message
    with pytest.raises(InvalidReapInput, match="resume: the unfinished reap"):  # lmctl's start (exit 2) ...
        ReapControl(w.ctx, None, "arn:reap").start(**inp)  # ... refuses before it starts an execution
    assert [r for r in sent if not r[0].startswith(READS)] == []
    assert _marks_items(w) == marks and w.versions(orphan) == versions and not w.blob_exists(orphan)
    assert w.ctx.table.get("checkpoint#reap", "current") == checkpoint
    assert w.ctx.table.get("lease#reap", "lease") == lease
