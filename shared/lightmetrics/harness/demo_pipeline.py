"""The demo's pipeline phase (``lmctl demo`` ends with it): inventory snapshot -> audit -> rollup ->
query and plot, over the demo's own data.

The demo's batches are accepted "now" (the collectors' real clock), so their acceptance hour is
the current one, which the reconciler never closes (docs/protocol.md §12 R1: an hour closes only after it
ended plus the settle window). Rather than fake the clock, the demo rolls the open hour up with
``allow_open=True`` — the same switch as ``lmctl pipeline rollup --allow-open-hour`` — and says
so in its report. That is safe by construction: if more batches arrive in that hour, the next
rollup builds a new generation that supersedes this one.

Spark's session is started early (:func:`start_spark_early`, after the accept phase), in a thread:
its JVM takes seconds of one core, while the phases before this one mostly wait on queues and
state machines; the phase's ``spark_start_s`` is what it still had to wait.
"""

from __future__ import annotations

import json
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

_NS = 1_000_000_000
APP_NAME = "lightmetrics-demo"


def start_spark_early() -> "Future[Any]":
    """The demo's Spark session, being created in a background thread (its JVM starting while the
    demo's earlier phases run); the pipeline phase takes it with ``.result()``.

    >>> session = start_spark_early()   # doctest: +SKIP
    >>> run_pipeline_phase(system, runtime, report, spark=session)   # doctest: +SKIP
    """
    starter = ThreadPoolExecutor(1, thread_name_prefix="lm-demo-spark")
    try:
        return starter.submit(_demo_spark)
    finally:
        starter.shutdown(wait=False)


def _demo_spark() -> Any:
    """The demo's session: a JVM tuned for a short run (lightmetrics_pipeline.session.SHORT_RUN_JAVA_OPTIONS)."""
    from lightmetrics_pipeline.session import SHORT_RUN_JAVA_OPTIONS, get_spark

    return get_spark(APP_NAME, java_options=SHORT_RUN_JAVA_OPTIONS)


def run_pipeline_phase(system: Any, runtime: Any, report: Any, *, spark: "Future[Any] | None" = None) -> dict[str, Any]:
    """Run the phase and attach its result to the demo ``report`` (its JSON and its printed table).
    ``spark``: the session :func:`start_spark_early` is starting (None: start it now)."""
    started = time.monotonic()
    result: dict[str, Any] = {"ok": False}
    try:
        result = _run(system, runtime, spark)
    except Exception as exc:  # the demo reports, it does not crash
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = round(time.monotonic() - started, 1)
    report.phases["pipeline (audit, rollup, query)"] = time.monotonic() - started
    if not result.get("ok"):
        report.violations.append(f"pipeline phase failed: {result.get('error') or result}")
    _attach(report, result)
    return result


def _run(system: Any, runtime: Any, early_spark: "Future[Any] | None") -> dict[str, Any]:
    from lightmetrics.protocol.keys import UtcHour
    from lightmetrics_pipeline.audit.job import run_audit
    from lightmetrics_pipeline.inventory import report as inv
    from lightmetrics_pipeline.jobs import closed_boundary
    from lightmetrics_pipeline.rollup.job import RollupJob
    from lightmetrics_pipeline.rollup.query import plot, run_query
    from lightmetrics_pipeline.s3io import S3Access

    settings = system.settings
    access = S3Access.from_settings(settings, endpoint_url=runtime.endpoint_url, component="pipeline-demo")
    out: dict[str, Any] = {}
    spark = _session(early_spark, out)

    # 1. inventory: a report in AWS's format, in the bucket under inventory/
    written = inv.snapshot(access, inv.Destination.parse(f"s3://{settings.bucket}/inventory"))
    out["inventory"] = {"manifest": written.manifest_location, "rows": written.rows}

    job_session = system.role_session("pipeline-job")  # the jobs' role (the snapshot stands in for S3 Inventory)
    job_access = _as_role(access, job_session.credentials)
    # 2. audit
    now_ns = time.time_ns()
    run_id = time.strftime("demo-%Y%m%dT%H%M%SZ", time.gmtime())
    report_inv = inv.open_report(written.manifest_location, job_access)
    audit = run_audit(spark, inv.inventory_dataframe(spark, report_inv, job_access), job_access, run_id=run_id,
                      now_s=now_ns // _NS, retry_horizon_s=settings.retry_horizon_s, inventory_info=report_inv.to_json())
    out["audit"] = {"run_id": run_id, "summary": f"s3://{settings.bucket}/{audit.summary_key}",
                    "candidates": audit.candidates, "confirmed": audit.confirmed,
                    "confirmed_by_rule": audit.confirmed_by_rule, "seconds": round(audit.seconds, 1)}

    # 3. rollup of the demo's acceptance hours (open: see the module docstring)
    table = system.work_context(session=job_session).table
    first_open = closed_boundary(settings, table)
    now_hour = UtcHour.of_unix_ns(now_ns)
    job = RollupJob(spark, job_access, table=table, owner="demo")
    rollup = job.run([now_hour + (-1), now_hour], first_open=first_open, allow_open=True)
    out["rollup"] = {"reconciler_checkpoint": str(first_open) if first_open else None,
                     "open_hours_rolled_up": [h.hour for h in rollup.hours if first_open is None or
                                              UtcHour.parse(h.hour) >= first_open],
                     "hours": [h.to_json() | {"skipped": len(h.skipped)} for h in rollup.hours if h.status != "empty"],
                     "samples": rollup.samples, "seconds": round(rollup.seconds, 1)}

    # 4. query one metric back, and plot it
    start, end = now_ns - 2 * 3600 * _NS, now_ns + 3600 * _NS
    q = run_query(access, "cpu.usage", start_ns=start, end_ns=end, window="5m", labels={"host": "host-00"},
                  accept_lag_hours=1)
    png = str(Path(tempfile.mkdtemp(prefix="lm-demo-plot-")) / "cpu.usage-host-00.png")
    plot(q, png, "mean")
    points = [(p.window_start_ns, p.count, (p.sum / (p.count - p.nan_count)) if p.count > p.nan_count else None)
              for s in q.series for p in s.points]
    out["query"] = {"metric": "cpu.usage", "labels": {"host": "host-00"}, "window": "5m", "series": len(q.series),
                    "points": len(points), "samples": sum(c for _, c, _ in points), "plot": png,
                    "generations": q.generations, "table": _query_table(q)}
    committed = [h for h in rollup.hours if h.status in ("committed", "already-committed", "up-to-date")]
    out["ok"] = (audit.confirmed.get("integrity", 0) == 0 and audit.confirmed.get("derived-without-source", 0) == 0
                 and bool(committed) and rollup.skipped == 0 and out["query"]["samples"] > 0)
    return out


def _session(early_spark: "Future[Any] | None", out: dict[str, Any]) -> Any:
    """The session (the early one, or started now), and in ``out`` how long the phase waited for it."""
    mark = time.monotonic()
    spark = early_spark.result() if early_spark is not None else _demo_spark()
    out["spark_start_s"] = round(time.monotonic() - mark, 1)  # started early: what was left to wait
    out["spark_started_early"] = early_spark is not None
    out["spark_java_options"] = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions", "")
    return spark


def _as_role(access: Any, credentials: dict[str, str]) -> Any:
    """``access`` signing with a role's credentials (shipped to the executors with it)."""
    if not credentials:
        return access
    from dataclasses import replace

    return replace(access, access_key=credentials["aws_access_key_id"], secret_key=credentials["aws_secret_access_key"],
                   session_token=credentials["aws_session_token"])


def _query_table(q: Any) -> list[dict[str, Any]]:
    from lightmetrics_pipeline.rollup.query import iso, stat_value

    rows = []
    for s in q.series:
        for p in s.points:
            mean = stat_value(p, "mean")
            p90 = stat_value(p, "p90")
            rows.append({"series": ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())), "t": iso(p.window_start_ns),
                         "count": p.count, "mean": None if mean is None else round(mean, 3),
                         "p90": None if p90 is None else round(p90, 3)})
    return rows


def _attach(report: Any, result: dict[str, Any]) -> None:
    """Add the phase to the report's JSON and printed output (without changing its class)."""
    base_json, base_print = report.to_json, report.print

    def to_json() -> dict[str, Any]:
        return {**base_json(), "pipeline": result}

    def print_(console: Any) -> None:
        from lightmetrics.cli.output import grid

        base_print(console)
        audit, rollup, query = result.get("audit", {}), result.get("rollup", {}), result.get("query", {})
        rows = [
            ("inventory rows (snapshot)", result.get("inventory", {}).get("rows")),
            ("audit findings confirmed", json.dumps(audit.get("confirmed", {}), sort_keys=True)),
            ("audit findings by rule", json.dumps(audit.get("confirmed_by_rule", {}), sort_keys=True)),
            ("audit summary", audit.get("summary")),
            ("rollup hours", ", ".join(f"{h['hour']} gen {h['generation']} ({h['status']})" for h in rollup.get("hours", []))),
            ("open hours rolled up (demo only)", ", ".join(rollup.get("open_hours_rolled_up", [])) or "none"),
            ("rollup samples", rollup.get("samples")),
            ("query cpu.usage{host=host-00} 5m", f"{query.get('series')} series, {query.get('points')} points, "
                                                 f"{query.get('samples')} samples"),
            ("plot", query.get("plot")),
            ("pipeline seconds", result.get("seconds")),
        ]
        if result.get("error"):
            rows.append(("error", result["error"]))
        console.print(grid("pipeline phase", ["what", "#"], rows))
        table = query.get("table", [])
        if table:
            console.print(grid("lmctl query --metric cpu.usage --label host=host-00 --window 5m",
                               ["series", "window start", "#samples", "mean", "p90"],
                               [(r["series"], r["t"], r["count"], r["mean"], r["p90"]) for r in table[:24]]))

    report.to_json = to_json
    report.print = print_


__all__ = ["run_pipeline_phase", "start_spark_early"]
