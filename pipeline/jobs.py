"""Job entry points: the same functions run under ``lmctl`` locally and under spark-submit on EMR
Serverless (``pipeline/emr_main.py`` is the ``entryPoint`` file; see docs/pipeline.md).

Example (EMR Serverless ``entryPointArguments``)::

    ["audit", "--inventory", "s3://<ops-bucket>/inventory/<bucket>/weekly-parquet/"]
    ["rollup", "--lookback-hours", "24"]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.keys import UtcHour, hours_between
from lightmetrics_pipeline.s3io import S3Access


def _spark(master: str | None) -> Any:
    from lightmetrics_pipeline.session import get_spark

    return get_spark("lightmetrics-pipeline", master=master)


def audit_job(settings: Settings, inventory_location: str, *, run_id: str, now_ns: int | None = None,
              access: S3Access | None = None, spark: Any = None, master: str | None = "local[2]",
              table: Any = None, progress: Any = None) -> Any:
    from lightmetrics.composition.services import control_table
    from lightmetrics.operator_tools.audit_watermarks import apply_watermarks
    from lightmetrics_pipeline.audit.job import gc_marked_blobs, run_audit
    from lightmetrics_pipeline.inventory.report import inventory_dataframe, open_report

    access = access or S3Access.from_settings(settings, component="pipeline-audit")
    spark = spark or _spark(master)
    report = open_report(inventory_location, access)
    if report.source_bucket != access.bucket:
        from lightmetrics_pipeline.inventory.report import InventoryError

        raise InventoryError(f"the report is of bucket {report.source_bucket}, not {access.bucket}")
    df = inventory_dataframe(spark, report, access)
    now_s = (now_ns if now_ns is not None else time.time_ns()) // 1_000_000_000
    table = table or control_table(settings)
    marked = gc_marked_blobs(table, access.codec)
    audit = run_audit(spark, df, access, run_id=run_id, now_s=now_s, retry_horizon_s=settings.retry_horizon_s,
                      inventory_info=report.to_json(), gc_marked=marked, progress=progress, settle_s=settings.settle_s)
    # Only now, the summary committed (docs/protocol.md §13 W6): a crash before moves no watermark.
    apply_watermarks(table, audit.watermarks, now_ns=time.time_ns(), run_id=run_id)
    return audit


def closed_boundary(settings: Settings, table: Any) -> UtcHour | None:
    """The reconciler's checkpoint: the first hour not yet closed (hours before it are closed) — by
    every shard: the slowest shard's (docs/protocol.md §12 R8)."""
    from lightmetrics.derived.reconcile_state import read_shard_checkpoints

    return read_shard_checkpoints(table, settings.reconcile_shards).hour


def rollup_job(settings: Settings, hours: list[UtcHour] | None, *, lookback_hours: int = 24, allow_open: bool = False,
               recompute: bool = False, owner: str | None = None, access: S3Access | None = None, spark: Any = None,
               clock: Clock = DEFAULT_CLOCK, table: Any = None, master: str | None = "local[2]",
               progress: Any = None) -> Any:
    """Roll up ``hours`` (default: the ``lookback_hours`` closed hours before the reconciler's
    checkpoint). A preflight of a few listings first: when no asked hour can be rolled up (open, or
    no batch and no rollup) Spark is not started and the report says why (``notes``)."""
    from lightmetrics.composition.services import control_table
    from lightmetrics_pipeline import s3io
    from lightmetrics_pipeline.rollup.inputs import v2_parts
    from lightmetrics_pipeline.rollup.job import RollupJob
    from lightmetrics_pipeline.rollup.plan import HourResult, RollupReport
    from lightmetrics_pipeline.rollup.preflight import preflight

    started = time.monotonic()
    access = access or S3Access.from_settings(settings, component="pipeline-rollup")
    table = table or control_table(settings)
    first_open = closed_boundary(settings, table)
    now_hour = UtcHour.of_unix_ns(clock.now_ns())
    explicit = hours is not None
    if hours is None:
        end = now_hour if allow_open else (first_open + (-1) if first_open else None)
        hours = [] if end is None else hours_between(end + (-(lookback_hours - 1)), end)
    tally = s3io.Tally()
    parts = v2_parts(access, tally)  # once a run: the preflight and the plan take the v2 parts listed
    with s3io.task_tally() as listed:
        pre = preflight(s3io.store(access), access.codec, hours, first_open=first_open, now_hour=now_hour,
                        settle_s=settings.settle_s, explicit=explicit, allow_open=allow_open, parts=parts)
    tally.add(listed)
    # hours asked by name are planned whatever they hold (the plan reports each: empty, tombstoned,
    # open ...) once one of them is closed; the default window only where there is something
    work = sorted(hours) if explicit and pre.closed else pre.with_data
    if not work:
        report = RollupReport(owner or "-", spark_started=False, notes=pre.notes)
        report.hours = [HourResult(str(h), "open") for h in pre.asked_open]
        report.requests.add(tally)
        report.seconds = time.monotonic() - started
        return report
    spark = spark or _spark(master)
    job = RollupJob(spark, access, table=table, clock=clock, owner=owner, progress=progress)
    report = job.run(work, first_open=first_open, allow_open=allow_open, recompute=recompute, parts=parts)
    report.notes = pre.notes
    report.requests.add(tally)
    report.seconds = time.monotonic() - started
    return report


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point (EMR Serverless): configuration from LM_* in the job's environment.
    Exit 0 also when another run holds the rollup's lease (one line says who, until when); 1 when
    the audit found violations, the rollup skipped inputs or refused an hour, or a key under the v2
    root is outside every ``part=<pp>/`` prefix (one line names it); an exception fails the job run."""
    parser = argparse.ArgumentParser(prog="lightmetrics-pipeline")
    sub = parser.add_subparsers(dest="job", required=True)
    a = sub.add_parser("audit")
    a.add_argument("--inventory", required=True)
    a.add_argument("--run-id", required=True)
    r = sub.add_parser("rollup")
    r.add_argument("--hour", action="append", default=[])
    r.add_argument("--lookback-hours", type=int, default=24)
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    if args.job == "audit":
        report = audit_job(settings, args.inventory, run_id=args.run_id, master=None)
        print(json.dumps(report.to_json(), sort_keys=True))
        return 1 if report.violations else 0
    from lightmetrics.composition.services import control_table
    from lightmetrics.protocol.errors import SegmentLayoutError
    from lightmetrics_pipeline.rollup.lease import LeaseHeld

    table = control_table(settings)
    try:
        report = rollup_job(settings, [UtcHour.parse(h) for h in args.hour] or None,
                            lookback_hours=args.lookback_hours, master=None, table=table)
    except LeaseHeld as exc:
        # An overlapping run (a slow hour, a manual start) is doing the work: a success, not an alarm.
        print(lease_held_line(table, exc), flush=True)
        return 0
    except SegmentLayoutError as exc:
        # V-D4: it belongs to no hour, so no hour can be rolled up without knowing the v2 parts
        print(f"rollup: not run: {exc}; exit 1", flush=True)
        return 1
    print(json.dumps(report.to_json(), sort_keys=True))
    return 1 if report.skipped or report.refused else 0


def lease_held_line(table: Any, exc: Exception) -> str:
    """The one line a rollup run that found the lease held prints before it exits 0: who holds it
    and until when (read back from the lease item; the exception's text if it is gone).

    >>> class Table:
    ...     def get(self, pk, sk):
    ...         return {"pk": pk, "sk": sk, "owner": "3f2a9c1d-77", "epoch": 4, "expires_at_ns": 1_767_225_600 * 10**9}
    >>> lease_held_line(Table(), Exception("held"))
    'rollup: not run: the rollup lease is held by owner 3f2a9c1d-77 (epoch 4) until 2026-01-01 00:00:00Z; exit 0'
    """
    from lightmetrics.protocol.clock import utc_text
    from lightmetrics.work.leases import lease_pk, read

    item = read(table, lease_pk("rollup"))
    if item is None:
        return f"rollup: not run: {exc}; exit 0"
    return (f"rollup: not run: the rollup lease is held by owner {item.owner} (epoch {item.epoch}) "
            f"until {utc_text(item.expires_at_ns)}; exit 0")


if __name__ == "__main__":
    sys.exit(main())
