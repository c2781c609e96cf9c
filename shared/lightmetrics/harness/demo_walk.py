"""The demo's walk phase: derived entries vanish, a full bootstrap walk restores them, verify passes.

A sample of ``accepted-by-time`` and ``accepted-by-blob`` entries is deleted behind the
system's back; the operator skips the poisoned record's blocker; a full walk runs through the
Step Functions interpreter (spanning executions); then ``lmctl verify --strict``.
"""

from __future__ import annotations

import random
import time
from typing import Any

from lightmetrics.aws.s3_store import S3ObjectStore
from lightmetrics.cli.output import err_console
from lightmetrics.harness.demo_report import DemoReport
from lightmetrics.protocol.keys import KeyCodec, KeyKind

#: how many entries of each accepted-* index the walk phase deletes
WALK_SAMPLE = 20


def run_walk_phase(report: DemoReport, system: Any, runtime: Any, store: S3ObjectStore, codec: KeyCodec,
                   poison_key: str, show_progress: bool) -> None:
    """Delete a sample of derived entries, walk through Step Functions, then ``lmctl verify``."""
    deleted = _delete_sample(store, codec)
    operator = system.operator_session()  # the operator's steps run as the operators' role, as lmctl does
    ctx = system.work_context(session=operator)
    _skip_poisoned(ctx, poison_key)
    control = system.walk_control(ctx, session=operator)
    requests_before = runtime.request_count("s3", "walk")
    t0 = time.monotonic()
    # Full: entries deleted behind the system's back hide behind a present accepted-by-time entry
    # (a default walk checks only that one, docs/walks.md); verify reports them, a full walk repairs them.
    started = control.start(full=True, page_size=50, parallelism=4, max_rounds=2)  # spans executions at every scale
    result = _follow(control, started, show_progress)
    seconds = time.monotonic() - t0
    s3_requests = runtime.request_count("s3", "walk") - requests_before
    present = set(store.list_keys(codec.root(KeyKind.ACCEPTED_BY_TIME), limit=10**7)) | set(
        store.list_keys(codec.root(KeyKind.ACCEPTED_BY_BLOB), limit=10**7))
    restored = sum(1 for k in deleted if k in present)
    report.walk = _walk_summary(control, started, result, (len(deleted), restored), seconds, s3_requests)
    report.walk["ok"] = (result.status == "finished" and report.walk["restored"] == len(deleted)
                         and len(result.executions) >= 2)
    if not report.walk["ok"]:
        report.violations.append(f"the walk did not restore every deleted entry: {report.walk}")
    _verify_strict(report, system)


def _delete_sample(store: S3ObjectStore, codec: KeyCodec) -> list[str]:
    """Delete :data:`WALK_SAMPLE` entries of each accepted-* index behind the system's back."""
    rng = random.Random(5)
    deleted: list[str] = []
    for kind in (KeyKind.ACCEPTED_BY_TIME, KeyKind.ACCEPTED_BY_BLOB):
        keys = sorted(store.list_keys(codec.root(kind), limit=10**7))
        for key in rng.sample(keys, min(WALK_SAMPLE, len(keys))):
            store.delete(key)  # versioned: a delete marker
            deleted.append(key)
    return deleted


def _skip_poisoned(ctx: Any, poison_key: str) -> None:
    """The poisoned record is a blocker; the operator skips it (audited, with a reason), so the
    walk counts it as skipped instead of blocking on it again, and verify acknowledges it."""
    from lightmetrics.admin.blocker_actions import skip

    for b in ctx.blockers.list():
        if b.object_key == poison_key:
            skip(ctx, b.work_key, who="demo", reason="deliberately poisoned by the demo; kept as evidence")


def _follow(control: Any, started: Any, show_progress: bool) -> Any:
    """Follow the walk's executions to the end, with a progress bar of partitions."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]walking"), BarColumn(), MofNCompleteColumn(), TextColumn("partitions"),
                  TimeElapsedColumn(), disable=not show_progress, console=err_console) as progress:
        task = progress.add_task("walk", total=None)

        def update(summary: Any) -> None:  # a WalkSummary
            progress.update(task, total=summary.partitions_found if summary.enumeration_complete else None,
                            completed=summary.partitions_done)

        return control.follow(started, on_progress=update, poll_s=0.2, timeout_s=300)


def _walk_summary(control: Any, started: Any, result: Any, deleted_restored: tuple[int, int], seconds: float,
                  s3_requests: int) -> dict[str, Any]:
    histories = [control.history(arn) for arn in result.executions]
    summary = result.summary_json()
    return {
        "status": result.status,
        "detail": result.detail,
        "epoch": started.epoch,
        "executions": result.executions,
        "history_events_per_execution": [len(h) for h in histories],
        "lambda_tasks_scheduled": sum(1 for h in histories for e in h if e["type"] == "LambdaFunctionScheduled"),
        "deleted": deleted_restored[0],
        "restored": deleted_restored[1],
        "keys": summary.get("keys", 0),
        "pages": summary.get("pages", 0),
        "partitions": summary.get("partitions_done", 0),
        "repairs": summary.get("repairs", 0),
        "outcomes": summary.get("outcomes", {}),
        "watermark_withheld": summary.get("watermark_withheld"),
        "seconds": round(seconds, 2),
        "keys_per_s": round(summary.get("keys", 0) / seconds, 1) if seconds else None,
        "s3_requests": s3_requests,
        "s3_requests_per_key": round(s3_requests / summary["keys"], 2) if summary.get("keys") else None,
    }


def _verify_strict(report: DemoReport, system: Any) -> None:
    from lightmetrics.operator_tools.verify import verify

    checked = verify(system.work_context(session=system.operator_session()), strict=True)
    report.verify = {
        "ok": checked.ok,
        "counts": checked.counts,
        "violations": [v.to_json() for v in checked.violations[:20]],
        "violation_counts": checked.violation_counts(),
        "warnings": len(checked.warnings),
        "acknowledged": [a.to_json() for a in checked.acknowledged],
    }
    for v in checked.violations[:20]:
        report.violations.append(f"verify: {v.rule}: {v.detail}: {', '.join(v.keys)}")
