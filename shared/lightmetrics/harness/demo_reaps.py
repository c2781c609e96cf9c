"""The demo's reap phase (issue 6): orphans and an expired hour, both reaps on Step Functions, verify.

* **Orphans**: batches submitted through the real accept code whose manifest create never gets
  through (a fault on ``accepted/v1/`` PUTs) — what a collector killed between blob and manifest
  leaves behind.
* **An expired hour**: batches accepted with the injectable clock set three days back (their
  acceptance hour is older than ``LM_RETENTION_S`` = 1 day), indexed like any other.
* Both reaps run as executions of ``infra/statemachines/reap.asl.json`` on the local runtime's
  Step Functions interpreter, their tasks hosted in the runtime's process, whose clock runs
  :data:`CLOCK_OFFSET_S` ahead (``LM_CLOCK_OFFSET_S``) so the fresh orphans are past the retry
  horizon; the grace and the tombstone wait are real Wait states.
* Then ``lmctl verify --strict`` must pass, with the reaped hour's manifests counted as reaped.

The completeness watermark: the demo's walk withholds it (the poisoned record is an
operator-skipped item), so this phase sets W from a strict verify run just before — the same
property (every accepted manifest has its derived entries) proven by the oracle instead of a walk.

Example:
    >>> run_reap_phase(report, system, runtime, show_progress=False)   # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Any

from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.frame import Sample, encode_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import UtcHour

_NS = 1_000_000_000
#: what the runtime process hosting the reap tasks gets besides the demo's LM_* (demo.run_demo)
CLOCK_OFFSET_S = 600
HOSTED_ENV = {"LM_RETRY_HORIZON_S": "60", "LM_GC_GRACE_S": "2", "LM_RETENTION_S": "86400",
              "LM_CLOCK_OFFSET_S": str(CLOCK_OFFSET_S)}
ORPHANS, OLD_BATCHES = 3, 4


def _frame(identity: BatchIdentity, at_ns: int, salt: float) -> bytes:
    samples = [Sample(metric="demo.reap", labels={"n": str(i)}, ts_unix_ns=at_ns + i, value=salt + i) for i in range(3)]
    return encode_frame(identity, samples)


def plant(system: Any, runtime: Any) -> dict[str, Any]:
    """Write the orphans and the expired hour (indexed directly: the event pump is stopped)."""
    from lightmetrics.acceptance.accept import accept_batch
    from lightmetrics.composition.services import accept_context
    from lightmetrics.derived.indexing import index_accepted, index_raw_blob
    from lightmetrics.harness.testing.faults import FaultInjector, FaultRule

    ctx = system.work_context()
    now = time.time_ns()
    broken = accept_context(system.settings, client=runtime.boto3_client("s3"))
    FaultInjector(broken.store.client).add(FaultRule(fault="down", operation="PutObject",
                                                     key_contains=ctx.codec.accepted_root(), times=-1))
    orphans = []
    for n in range(ORPHANS):
        ident = BatchIdentity.create("demo-reap-orphans", "boot-0", n * 10, n * 10 + 9)
        r = accept_batch(broken, ident, _frame(ident, now, 0.25))
        if r.blob_key and r.status.value == "unavailable":  # stopped after step 4: an orphan
            index_raw_blob(ctx, r.blob_key)
            orphans.append(r.blob_key)
    old_ns = now - 3 * 86400 * _NS
    old = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=FrozenClock(old_ns))
    expired = []
    for n in range(OLD_BATCHES):
        ident = BatchIdentity.create("demo-reap-old", "boot-0", n * 10, n * 10 + 9)
        r = accept_batch(old, ident, _frame(ident, old_ns, 0.0))
        index_accepted(ctx, r.manifest_key or "")
        index_raw_blob(ctx, r.blob_key or "")
        expired.append({"manifest_key": r.manifest_key, "blob_key": r.blob_key})
    return {"orphans": orphans, "expired": expired, "hour": str(UtcHour.of_unix_ns(old_ns))}


def run_reap_phase(report: Any, system: Any, runtime: Any, show_progress: bool = True) -> None:
    """Plant, reap (gc, then retention of the expired hour), verify; fills ``report.reaps``."""
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    from lightmetrics.derived.walk import INDEXES, set_watermark
    from lightmetrics.operator_tools.verify import verify

    t0 = time.monotonic()
    planted = plant(system, runtime)
    ctx = system.work_context()
    table = ctx.table
    pre = verify(ctx, strict=True)
    w_source = "walk"
    if pre.ok and not any(w for w in pre.watermarks.values()):
        w = time.time_ns() - int(system.settings.settle_s) * _NS
        for index in INDEXES:
            set_watermark(table, index, w, epoch=0, now_ns=time.time_ns())
        w_source = "strict verify (the walk withheld W: an operator-skipped item)"
    operator = system.operator_session()  # the reaps are started and followed as the operators' role
    control = system.reap_control(system.work_context(session=operator), session=operator)
    runs: dict[str, Any] = {}
    from lightmetrics.cli.output import err_console

    with Progress(TextColumn("[bold]reaping {task.fields[mode]}"), TimeElapsedColumn(), disable=not show_progress,
                  console=err_console) as p:
        for mode, inp in (("gc", {"mode": "gc", "dry_run": False}),
                          ("retention", {"mode": "retention", "dry_run": False, "hour": planted["hour"],
                                         "tombstone_wait_s": 1})):
            task = p.add_task(mode, total=None, mode=mode)
            arn = control.start(**inp)
            followed = control.follow(arn, poll_s=0.2, timeout_s=300)
            runs[mode] = {"status": followed.status, "detail": followed.detail, "execution": arn,
                          **(followed.report.to_json() if followed.report else {})}
            p.update(task, completed=1, total=1)
    store = ctx.store
    orphans_gone = all(store.head(k) is None for k in planted["orphans"])
    expired_ok = all(store.head(e["blob_key"]) is None and store.get(e["manifest_key"]) is not None
                     for e in planted["expired"])
    checked = verify(system.work_context(session=system.operator_session()), strict=True)
    report.reaps = {
        "orphans": len(planted["orphans"]), "orphans_purged": orphans_gone, "expired_hour": planted["hour"],
        "expired_batches": len(planted["expired"]), "expired_blobs_purged_manifests_kept": expired_ok,
        "watermark_from": w_source, "gc": runs.get("gc"), "retention": runs.get("retention"),
        "verify_ok": checked.ok, "verify_reaped": checked.expected.get("reaped", 0),
        "seconds": round(time.monotonic() - t0, 1),
    }
    report.reaps["ok"] = bool(
        planted["orphans"] and orphans_gone and expired_ok and checked.ok
        and runs.get("gc", {}).get("status") == "finished" and runs.get("retention", {}).get("status") == "finished"
        and runs["retention"].get("hours_reaped") == [planted["hour"]])
    if not report.reaps["ok"]:
        report.violations.append(f"reaps: {report.reaps}")
    for v in checked.violations[:20]:
        report.violations.append(f"verify after reaps: {v.rule}: {v.detail}: {', '.join(v.keys)}")


def summary_rows(report: Any) -> list[tuple[str, Any]]:
    r = getattr(report, "reaps", None) or {}
    gc, ret = r.get("gc") or {}, r.get("retention") or {}
    return [
        ("reap gc (Step Functions): examined, purged, restored, kept",
         f"{gc.get('examined', 0)}, {gc.get('purged', 0)}, {gc.get('restored', 0)}, "
         + (", ".join(f"{n} {why}" for why, n in sorted((gc.get("kept") or {}).items())) or "0")),
        ("reap retention: hour reaped, blobs purged; verify",
         f"{', '.join(ret.get('hours_reaped') or []) or 'NONE'}, {ret.get('purged', 0)}; "
         + ("clean" if r.get("verify_ok") else "VIOLATIONS")),
    ]
