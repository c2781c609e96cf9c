"""The data pipeline's commands: ``inventory snapshot``, ``pipeline audit|rollup``, ``query``,
``bench pipeline``. Locally the CLI is the jobs' entry point (moto cannot run the EMR Serverless
task of the Step Functions state machine); in AWS the same functions run under spark-submit
(``pipeline/jobs.py``, docs/pipeline.md).

Exit codes as everywhere: 0 ok; 1 violations found (audit: integrity or derived entries without
a source; rollup: inputs that could not be read, or a recomputed generation that differs);
2 invalid input; 4 S3/DynamoDB unavailable; 5 the rollup lease is held by another run, or
another owner committed the generation first.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from lightmetrics.cli.options import config_options, exit_for_error, json_option
from lightmetrics.cli.output import (
    EXIT_LEASE_HELD,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VIOLATIONS,
    console,
    emit_json,
    err_console,
    fail,
    grid,
    kv_table,
    progress_lines,
)
from lightmetrics.deployment.settings import Settings


def _access(settings: Settings, component: str) -> Any:
    from lightmetrics_pipeline.s3io import S3Access

    return S3Access.from_settings(settings, component=component)


def _as_job_role(settings: Settings, access: Any) -> tuple[Any, Any]:
    """``(access, table)`` of a job: pointed at the local runtime, signing as the pipeline job role, as
    EMR Serverless runs the jobs on AWS (docs/deploy.md, "IAM enforced locally"); else ``(access, None)``
    (the job builds its table from the environment's credentials)."""
    from dataclasses import replace

    from lightmetrics.local.principals import local_role_credentials
    from lightmetrics.operator_tools.policies import PIPELINE_JOB_PRINCIPAL

    credentials = local_role_credentials(PIPELINE_JOB_PRINCIPAL, settings.queue_urls)
    if not credentials:
        return access, None
    import boto3

    from lightmetrics.composition.services import control_table

    access = replace(access, access_key=credentials["aws_access_key_id"],
                     secret_key=credentials["aws_secret_access_key"], session_token=credentials["aws_session_token"])
    return access, control_table(settings, session=boto3.session.Session(region_name=access.region, **credentials))


def _now_ns(as_of: str | None, as_json: bool) -> int:
    import time

    from lightmetrics_pipeline.rollup.query import parse_time

    now = time.time_ns()
    if not as_of:
        return now
    try:
        return parse_time(as_of, now)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)


# ------------------------------------------------------------------------------- inventory
@click.group()
def inventory() -> None:
    """S3 Inventory reports (manifest.json + Parquet or CSV.gz data files, AWS's format)."""


@inventory.command("snapshot")
@click.option("--destination", default=None,
              help="s3://BUCKET/PREFIX or a local directory (default: s3://<LM_BUCKET>/inventory).")
@click.option("--format", "file_format", type=click.Choice(["parquet", "csv"]), default="parquet", show_default=True)
@click.option("--rows-per-file", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@config_options
@json_option
def inventory_snapshot(destination: str | None, file_format: str, rows_per_file: int, settings: Settings,
                       as_json: bool) -> None:
    """List the authority namespace (every version, like the stack's daily inventory) and write an
    inventory report of it, so local audits read the real format."""
    from lightmetrics_pipeline.inventory.report import Destination, InventoryError, snapshot

    dest = Destination.parse(destination or f"s3://{settings.bucket}/inventory")
    try:
        with progress_lines("inventory snapshot") as say:
            written = snapshot(_access(settings, "inventory"), dest,
                               file_format="Parquet" if file_format == "parquet" else "CSV",
                               rows_per_file=rows_per_file, progress=say)
    except InventoryError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    except Exception as exc:  # S3 unreachable (4), or the bucket missing / refusing us (2)
        exit_for_error(exc, "inventory snapshot failed", as_json=as_json)
    if as_json:
        emit_json(written.to_json())
    else:
        console.print(kv_table("inventory report written", written.to_json().items()))


# -------------------------------------------------------------------------------- pipeline
@click.group()
def pipeline() -> None:
    """The Spark jobs: inventory audit and hourly rollups (local[2] here, EMR Serverless in AWS)."""


@pipeline.command("audit")
@click.option("--inventory", "inventory_location", default=None,
              help="manifest.json or a prefix/directory above it (s3://... or local); default: the latest "
                   "report under s3://<LM_BUCKET>/inventory/.")
@click.option("--run-id", default=None, help="Run id (default: UTC time + random suffix).")
@click.option("--as-of", default=None, help="Judge ages (retry horizon) as of this time (default: now).")
@config_options
@json_option
def pipeline_audit(inventory_location: str | None, run_id: str | None, as_of: str | None, settings: Settings,
                   as_json: bool) -> None:
    """Audit the bucket from an inventory report; confirmed findings go to audit/v1/run=<id>/.

    Exit 1 if integrity violations or derived entries without a source were confirmed.
    """
    import secrets
    from datetime import datetime, timezone

    from lightmetrics_pipeline.inventory.report import InventoryError
    from lightmetrics_pipeline.jobs import audit_job

    now_ns = _now_ns(as_of, as_json)
    run_id = run_id or datetime.fromtimestamp(now_ns / 1e9, tz=timezone.utc).strftime("%Y%m%dT%H%M%SZ") + \
        "-" + secrets.token_hex(3)
    try:
        with progress_lines("audit") as say:
            access, table = _as_job_role(settings, _access(settings, "pipeline-audit"))
            report = audit_job(settings, inventory_location or f"s3://{settings.bucket}/inventory/", run_id=run_id,
                               now_ns=now_ns, access=access, table=table, progress=say)
    except InventoryError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    code = EXIT_VIOLATIONS if report.violations else EXIT_OK
    if as_json:
        emit_json({**report.to_json(), "summary_key": report.summary_key, "exit_code": code})
    else:
        rows = [(c, report.candidates.get(c, 0), report.confirmed.get(c, 0), len(report.files.get(c, [])))
                for c in report.candidates]
        console.print(grid(f"audit run {report.run_id} ({report.rows_scanned} inventory rows, {report.seconds:.1f} s)",
                           ["finding", "#candidates", "#confirmed", "#files"], rows))
        console.print(f"summary: s3://{settings.bucket}/{report.summary_key}")
    sys.exit(code)


@pipeline.command("rollup")
@click.option("--hour", "hours", multiple=True, help="Acceptance hour YYYY-MM-DDTHH (repeatable). Default: the "
              "closed hours of the last --lookback-hours.")
@click.option("--lookback-hours", type=click.IntRange(1, 24 * 31), default=24, show_default=True,
              help="Closed hours before the reconciler checkpoint to (re)check for new or late batches.")
@click.option("--allow-open-hour", is_flag=True,
              help="Also roll up hours the reconciler has not closed (the demo only: a later run supersedes "
                   "the generation when more batches arrive).")
@click.option("--recompute", is_flag=True, help="Recompute up-to-date hours and compare with the committed generation "
                                             "(v3: nothing is written; exit 1 if anything differs).")
@click.option("--owner", default=None, help="Owner id for the lease (default: random).")
@config_options
@json_option
def pipeline_rollup(hours: tuple[str, ...], lookback_hours: int, allow_open_hour: bool, recompute: bool,
                    owner: str | None, settings: Settings, as_json: bool) -> None:
    """Roll closed acceptance hours up into rollup/v1/ Parquet objects and a committed manifests/v1/
    generation (exit 5 if another run holds the lease or committed first)."""
    from lightmetrics.protocol.errors import SegmentLayoutError
    from lightmetrics.protocol.keys import UtcHour
    from lightmetrics_pipeline.jobs import rollup_job
    from lightmetrics_pipeline.rollup.lease import LeaseHeld, LeaseLost
    from lightmetrics_pipeline.rollup.plan import GenerationTaken, NondeterministicRollup

    try:
        wanted = [UtcHour.parse(h) for h in hours]
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    try:
        with progress_lines("rollup") as say:
            access, table = _as_job_role(settings, _access(settings, "pipeline-rollup"))
            report = rollup_job(settings, wanted or None, lookback_hours=lookback_hours, allow_open=allow_open_hour,
                                recompute=recompute, owner=owner, access=access, table=table, progress=say)
    except (LeaseHeld, LeaseLost, GenerationTaken) as exc:
        fail(str(exc), EXIT_LEASE_HELD, as_json=as_json)
    except NondeterministicRollup as exc:
        fail(str(exc), EXIT_VIOLATIONS, as_json=as_json)
    except SegmentLayoutError as exc:
        # a key under the v2 root outside any part=<pp>/ prefix belongs to no hour: the run cannot
        # know its parts, so it stops before Spark, naming the key (docs/pipeline.md §4 step 1)
        fail(f"rollup not run: {exc}", EXIT_VIOLATIONS, as_json=as_json)
    # every hour asked by name is open: refused before Spark started, with when each closes; an hour
    # at the generation limit (docs/pipeline.md §1) has late inputs no generation holds
    refused = bool(wanted) and not report.spark_started
    limited = any(h.status in ("generation-limit", "refused") for h in report.hours)
    code = EXIT_USAGE if refused else EXIT_VIOLATIONS if report.skipped or limited else EXIT_OK
    if as_json:
        emit_json({**report.to_json(), "exit_code": code})
        sys.exit(code)
    if report.spark_started:
        rows = [(h.hour, h.status, h.generation, h.inputs, h.series, h.objects if h.format == 3 else f"{h.chunks} chunks",
                 h.samples, h.skipped_count,
                 ", ".join(f"{k} {v}" for k, v in sorted(h.writes.items()))) for h in report.hours]
        console.print(grid(f"rollup ({report.seconds:.1f} s, owner {report.owner})",
                           ["hour", "status", "generation", "#inputs", "#series", "#objects", "#samples", "#skipped",
                            "writes"], rows))
        for h in report.hours:
            for s in h.skipped[:10]:
                console.print(f"[red]skipped[/] {h.hour} {s['manifest_id']}: {s['reason']}")
            if h.reason:
                console.print(f"[red]refused[/] {h.hour}: {h.reason}")
    else:
        console.print(f"rollup: nothing rolled up ({report.seconds:.1f} s; Spark not started)")
    for note in report.notes:  # a refusal's reasons go to stderr, as every error's do
        (err_console if refused else console).print(f"note: {note}", markup=False)
    sys.exit(code)


# ----------------------------------------------------------------------------------- query
@click.command("query")
@click.option("--metric", required=True, help="Metric name.")
@click.option("--label", "labels", multiple=True, help="k=v label filter (repeatable).")
@click.option("--from", "start", required=True, help="Start (inclusive): 2025-11-24T16:00:00Z, unix s, now, -2h.")
@click.option("--to", "end", required=True, help="End (exclusive), same forms, or +1h.")
@click.option("--window", type=click.Choice(["1m", "5m", "1h"]), default="5m", show_default=True)
@click.option("--stat", type=click.Choice(["mean", "count", "sum", "min", "max", "last", "p50", "p90", "p99"]),
              default="mean", show_default=True, help="What the table and the plot show.")
@click.option("--accept-lag-hours", type=click.IntRange(0, 24 * 31), default=24, show_default=True,
              help="How long after their samples batches may have been accepted (rollup hours are acceptance hours).")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False), help="Write a PNG chart here.")
@click.option("--digits", type=click.IntRange(1, 17), default=None,
              help="Round the table's values to this many significant digits (default: full precision, as --json).")
@config_options
@json_option
def query_cmd(metric: str, labels: tuple[str, ...], start: str, end: str, window: str, stat: str,
              accept_lag_hours: int, plot_path: str | None, digits: int | None, settings: Settings,
              as_json: bool) -> None:
    """Read a metric back from the committed rollups (the highest generation of each hour).

    Exit 2 if no committed hour asked for holds the metric (the closest known names are listed).
    """
    import time

    from lightmetrics_pipeline.rollup.query import iso, parse_time, plot, run_query, stat_value

    now = time.time_ns()
    try:
        start_ns, end_ns = parse_time(start, now), parse_time(end, now)
        label_filter = dict(_label(lbl) for lbl in labels)
        result = run_query(_access(settings, "query"), metric, start_ns=start_ns, end_ns=end_ns, window=window,
                           labels=label_filter, accept_lag_hours=accept_lag_hours)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    except Exception as exc:
        exit_for_error(exc, "query failed", as_json=as_json)
    if result.metric_known is False:
        _unknown_metric(result, as_json)
    if plot_path:
        plot(result, plot_path, stat)
    if as_json:
        emit_json({**result.to_json(), "plot": plot_path})
        return
    rows = []
    for s in result.series:
        name = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        for p in s.points:
            rows.append((name, iso(p.window_start_ns), p.count, value_text(stat_value(p, stat), digits)))
    console.print(grid(f"{metric} {stat} per {window} ({len(result.series)} series, "
                       f"{result.objects_read + result.chunks_read} objects read, {result.bytes_read:,} bytes)",
                       ["series", "window start", "#samples", stat], rows))
    if result.uncommitted_hours:
        console.print(f"{'no data: ' if not rows else ''}no committed rollup yet for {hour_runs(result.uncommitted_hours)} "
                      f"(uncommitted_hours in --json): an hour is rolled up after the reconciler closes it "
                      f"(the current hour is still open; see lmctl status)")
    if plot_path:
        console.print(f"plot: {plot_path}")


def _unknown_metric(result: Any, as_json: bool) -> None:
    """Exit 2: no committed hour the query read holds the metric — a misspelling looks like this,
    not like an empty table."""
    hours = sorted(result.generations)
    span = hours[0] if len(hours) == 1 else f"{hours[0]} to {hours[-1]}"
    if result.close_matches:
        hint = f"did you mean: {', '.join(result.close_matches)}?"
    else:
        hint = f"no known name is close (the newest committed hours hold {result.known_metrics} metrics)"
    reason = (f"unknown metric {result.metric!r}: none of the {len(hours)} committed hour(s) asked for "
              f"({span}) holds it; {hint}")
    if as_json:
        emit_json({**result.to_json(), "status": "unknown_metric", "reason": reason, "exit_code": EXIT_USAGE})
        sys.exit(EXIT_USAGE)
    fail(reason, EXIT_USAGE)


def value_text(v: float | None, digits: int | None = None) -> str:
    """A value as the query table shows it: in full (the shortest text that reads back as the same
    float, as in --json; whole numbers without a fraction), or to ``digits`` significant digits.

    >>> value_text(1000000119.0), value_text(1000000119.0, 4), value_text(0.1 + 0.2), value_text(None)
    ('1000000119', '1e+09', '0.30000000000000004', '')
    """
    if v is None:
        return ""
    if digits is not None:
        return f"{v:.{digits}g}"
    if v.is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(v)


def hour_runs(hours: list[str]) -> str:
    """Hours as runs of consecutive hours: exactly the hours given, never one between them.

    >>> hour_runs(["2025-11-24T15", "2025-11-24T17"]), hour_runs(["2025-11-24T14", "2025-11-24T15"])
    ('hours 2025-11-24T15, 2025-11-24T17', 'hours 2025-11-24T14 to 2025-11-24T15')
    """
    from lightmetrics.protocol.keys import UtcHour

    runs: list[list[UtcHour]] = []
    for h in sorted(UtcHour.parse(x) for x in hours):
        if runs and runs[-1][-1].next() == h:
            runs[-1].append(h)
        else:
            runs.append([h])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]} to {r[-1]}" for r in runs)
    return f"hour{'s' if len(hours) > 1 else ''} {text}"


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--label must look like key=value, got {text!r}")
    return key, value


# ----------------------------------------------------------------------------------- bench
@click.group()
def bench() -> None:
    """Benchmarks (not tests): they print measured throughput."""


@bench.command("pipeline")
@click.option("--inventory-keys", type=click.IntRange(min=1000), default=1_000_000, show_default=True)
@click.option("--batches", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--samples-per-batch", type=click.IntRange(1, 200_000), default=500, show_default=True)
@click.option("--rollup-shape", "rollup_shapes", multiple=True, metavar="SERIESxSAMPLES",
              help="An hour of SERIES series x SAMPLES samples each to roll up (repeatable; default 10000x5 and "
                   "40x12500; 'none' for no shape).")
@json_option
def bench_pipeline(inventory_keys: int, batches: int, samples_per_batch: int, rollup_shapes: tuple[str, ...],
                   as_json: bool) -> None:
    """Audit rows/s on a generated inventory, rollup samples/s (also at high and low cardinality,
    SQL aggregation against the previous per-series Python), and the vectorized decoder against
    a per-row UDF baseline — on an embedded local runtime started for the run."""
    from lightmetrics.harness.bench.pipeline_bench import run_bench

    shapes: tuple[tuple[int, int], ...] = ((10_000, 5), (40, 12_500))
    if rollup_shapes:
        try:
            shapes = tuple((int(a), int(b)) for a, b in (x.lower().split("x") for x in rollup_shapes if x != "none"))
        except ValueError:
            raise click.BadParameter("use SERIESxSAMPLES, e.g. 10000x5", param_hint="--rollup-shape") from None
    result = run_bench(inventory_keys=inventory_keys, batches=batches, samples_per_batch=samples_per_batch,
                       rollup_shapes=shapes, progress=None if as_json else console.print)
    if as_json:
        emit_json(result)
    else:
        console.print(kv_table("pipeline benchmark", result.items()))


#: registered by lightmetrics.cli.main
PIPELINE_COMMANDS = (inventory, pipeline, query_cmd, bench)
