"""``lmctl bench accept|indexing|walk|reconcile|reap|cost-table``: benchmarks under injected S3 latency;
``lmctl bench keepup``: each background job's headroom from a model (:mod:`lightmetrics.operator_tools.keepup`);
``lmctl bench indexer-cpu``: the indexers' own CPU per record and invocation (no latency, no AWS).

They add to the ``bench`` group of :mod:`lightmetrics.cli.pipeline_cmds` (``bench pipeline``).
Each starts an embedded runtime in this process, puts ``--latency-ms`` / ``--max-inflight`` in
front of every S3 client (:mod:`lightmetrics.harness.testing.latency`), repeats ``--repeat`` times and
prints median (min-max) and the ratio to the baseline measured in the same run; it writes
``<out>/<target>.json`` and ``<out>/<target>.png``. Exit 1 if a request count is off contract
(accept not exactly 2 requests; a cost that grows with history). docs/performance.md.

Example::

    lmctl bench accept --repeat 3 --out bench-out
    lmctl bench reconcile --json
    lmctl bench cost-table --depths 10,1000,10000 --json
    lmctl bench keepup --rate 1000 --require 10
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from lightmetrics.cli.options import json_option
from lightmetrics.cli.output import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS, console, emit_json, fail, grid
from lightmetrics.cli.pipeline_cmds import bench


def _common(fn: Callable[..., Any] | None = None, *, repeat: int = 3, max_inflight: int = 8,
            latency_ms: float = 20.0) -> Any:
    """The options every target shares; ``repeat``, ``max_inflight`` and ``latency_ms`` are the
    target's defaults."""
    if fn is None:
        return lambda f: _common(f, repeat=repeat, max_inflight=max_inflight, latency_ms=latency_ms)
    for opt in reversed((
        click.option("--repeat", type=click.IntRange(1, 50), default=repeat, show_default=True,
                     help="Repeated runs; figures are the median and spread over them."),
        click.option("--quick", is_flag=True, help="Small sizes (a smoke run of a few seconds)."),
        click.option("--latency-ms", type=click.FloatRange(0, 5000), default=latency_ms, show_default=True,
                     help="Injected delay per S3 request (the round-trip time)."),
        click.option("--max-inflight", type=click.IntRange(1, 1024), default=max_inflight, show_default=True,
                     help="Cap on S3 requests in flight in this process."),
        click.option("--out", "out_dir", default="bench-out", show_default=True, type=click.Path(file_okay=False),
                     help="Directory for <target>.json and <target>.png."),
    )):
        fn = opt(fn)
    return json_option(fn)


def _fmt(s: dict[str, Any], digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def _show(report: dict[str, Any], as_json: bool, latency_ms: float, max_inflight: int, repeat: int,
          headers: list[str], rows: Callable[[dict[str, Any]], list[tuple[str, ...]]], files_note: str = "") -> None:
    """A bench report as strict JSON, or its figures as a table under the run's conditions and the
    files written."""
    if as_json:
        emit_json(report)
        return
    console.print(grid(f"{report['target']}, RTT {latency_ms} ms, cap {max_inflight} (median (min-max) of {repeat})",
                       headers, rows(report["figures"])))
    console.print(f"{files_note}files: {report['files']}")


def _run(target: str, latency_ms: float, max_inflight: int, body: Callable[[Any], dict[str, Any]],
         bars: Callable[[dict[str, Any]], list[Any]], ylabel: str, out_dir: str,
         baseline_label: str = "baseline") -> dict[str, Any]:
    from lightmetrics.harness.bench.harness import BenchEnv, write_report

    with BenchEnv(latency_ms=latency_ms, max_inflight=max_inflight) as env:
        report = body(env)
    report["files"] = write_report(target, report, out_dir, bars(report), ylabel, baseline_label)
    return report


@bench.command("accept")
@click.option("--callers", default="1,8,32", show_default=True, help="Comma-separated caller counts.")
@click.option("--batches-per-caller", type=click.IntRange(1, 10_000), default=20, show_default=True)
@_common
def bench_accept(callers: str, batches_per_caller: int, repeat: int, quick: bool, latency_ms: float,
                 max_inflight: int, out_dir: str, as_json: bool) -> None:
    """Batches/s and p50/p99 latency at 1, 8, 32 callers vs the local conditional-PUT ceiling / 2."""
    from lightmetrics.harness.bench.accept_bench import accept_bars, run_accept

    try:
        counts = tuple(int(c) for c in callers.split(",") if c.strip())
    except ValueError:
        fail("--callers must be comma-separated integers", EXIT_USAGE, as_json=as_json)
    if not counts or min(counts) < 1:
        fail("--callers must be positive integers", EXIT_USAGE, as_json=as_json)
    per = 2 if quick else batches_per_caller
    report = _run("accept", latency_ms, max_inflight,
                  lambda env: run_accept(env, callers=counts, batches_per_caller=per, repeat=repeat),
                  accept_bars, "accepted batches / s", out_dir, "local ceiling (conditional PUTs/s / 2)")
    code = EXIT_OK if report["counts"]["requests_per_accept"] == [2] else EXIT_VIOLATIONS
    if as_json:
        emit_json({**report, "exit_code": code})
    else:
        rows = [(r["callers"], _fmt(r["batches_per_s"]), _fmt(r["p50_ms"]), _fmt(r["p99_ms"]),
                 _fmt(r["p50_over_rtt"], 2), _fmt(r["p50_over_effective_rtt"], 2),
                 _fmt(r["ceiling_batches_per_s"]), _fmt(r["ratio_to_ceiling"], 2)) for r in report["rows"]]
        console.print(grid(f"accept, RTT {latency_ms} ms, cap {max_inflight} (median (min-max) of {repeat})",
                           ["#callers", "batches/s", "p50 ms", "p99 ms", "p50/RTT", "p50/eff. RTT",
                            "ceiling batches/s", "ratio to ceiling"], rows))
        console.print(f"requests per accept: {report['counts']['requests_per_accept']}; files: {report['files']}")
    sys.exit(code)


@bench.command("indexing")
@click.option("--batches", type=click.IntRange(10, 100_000), default=200, show_default=True)
@_common
def bench_indexing(batches: int, repeat: int, quick: bool, latency_ms: float, max_inflight: int, out_dir: str,
                   as_json: bool) -> None:
    """Manifests indexed/s and sequential round trips per SQS batch vs a sequential processor."""
    from lightmetrics.harness.bench.indexing_bench import indexing_bars, run_indexing

    report = _run("indexing", latency_ms, max_inflight,
                  lambda env: run_indexing(env, batches=30 if quick else batches, repeat=repeat),
                  indexing_bars, "value (see labels)", out_dir, "sequential processor")
    _show(report, as_json, latency_ms, max_inflight, repeat, ["figure", "indexer", "sequential baseline", "ratio"],
          lambda f: [("objects/s", _fmt(f["objects_per_s"]), _fmt(f["baseline_objects_per_s"]), _fmt(f["speedup"], 2)),
                     ("round trips / SQS batch of 10", _fmt(f["round_trips_per_sqs_batch"]),
                      _fmt(f["baseline_round_trips_per_sqs_batch"]), ""),
                     ("requests / record", _fmt(f["requests_per_record"], 2), "", "")],
          files_note=f"effective RTT {_fmt(report['figures']['effective_rtt_ms'])} ms; ")


@bench.command("walk")
@click.option("--batches", type=click.IntRange(10, 1_000_000), default=400, show_default=True)
@click.option("--agents", type=click.IntRange(1, 1000), default=4, show_default=True)
@click.option("--page-size", type=click.IntRange(1, 1000), default=100, show_default=True)
@_common(max_inflight=32, latency_ms=40.0)
def bench_walk(batches: int, agents: int, page_size: int, repeat: int, quick: bool, latency_ms: float,
               max_inflight: int, out_dir: str, as_json: bool) -> None:
    """Keys/s of the bootstrap walk vs a sequential walker (one LIST page, one repair at a time).

    Defaults model AWS (docs/performance.md): a cap of 32 requests in flight is the page tasks'
    pools together (4 Lambda invocations in parallel, 8 each); 40 ms per request keeps this
    process's own time per request (one interpreter lock shared by the four "Lambdas" and moto)
    a small part of a round trip, as it is in AWS."""
    from lightmetrics.harness.bench.walk_bench import run_walk, walk_bars

    report = _run("walk", latency_ms, max_inflight,
                  lambda env: run_walk(env, batches=40 if quick else batches, agents=agents, page_size=page_size,
                                       repeat=repeat),
                  walk_bars, "keys / s", out_dir, "sequential walker")
    _show(report, as_json, latency_ms, max_inflight, repeat, ["figure", "bootstrap walk", "sequential walker", "ratio"],
          lambda f: [("keys/s", _fmt(f["walk_keys_per_s"]), _fmt(f["sequential_keys_per_s"]), _fmt(f["speedup"], 2))])


@bench.command("cost-table")
@click.option("--depths", default="10,1000,10000", show_default=True, help="History depths (accepted batches).")
@_common
def bench_cost_table(depths: str, repeat: int, quick: bool, latency_ms: float, max_inflight: int, out_dir: str,
                     as_json: bool) -> None:
    """The cost contract table (docs/protocol.md §8) from the request counter at several history depths (exit 1 if a
    count differs between depths). Counts are exact: --repeat and the latency do not change them."""
    from lightmetrics.harness.bench.cost_table import measure_operation_costs, rows

    try:
        wanted = tuple(sorted({int(d) for d in depths.split(",") if d.strip()}))
    except ValueError:
        fail("--depths must be comma-separated integers", EXIT_USAGE, as_json=as_json)
    if quick:
        wanted = (10, 100)
    if not wanted or min(wanted) < 1:
        fail("--depths must be positive", EXIT_USAGE, as_json=as_json)

    def body(env: Any) -> dict[str, Any]:
        costs = measure_operation_costs(env.system(), env.raw_s3(), wanted)
        return {"target": "cost-table", "environment": env.describe(), **costs}

    def bars(report: dict[str, Any]) -> list[Any]:
        deepest = str(report["depths"][-1])
        first = str(report["depths"][0])
        return [(op.split(".", 1)[1], _point(d[deepest]["total"]), _point(d[first]["total"]))
                for op, d in report["operations"].items()]

    report = _run("cost-table", latency_ms, max_inflight, body, bars, "requests per operation", out_dir,
                  f"at depth {wanted[0]:,} (blue: at {wanted[-1]:,})")
    code = EXIT_OK if all(report["flat"].values()) else EXIT_VIOLATIONS
    if as_json:
        emit_json({**report, "exit_code": code})
    else:
        console.print(grid("requests per operation by history depth (protocol §8)",
                           ["operation", "target", *[f"{d:,}" for d in report["depths"]],
                            f"by API at {report['depths'][-1]:,}", "flat"], rows(report)))
        for s in report["seeding"]:
            console.print(f"seeded to depth {s['depth']:,}: {s['batches']:,} batches in {s['seconds']} s "
                          f"({s['batches_per_s']}/s)")
    sys.exit(code)


@bench.command("reconcile")
@click.option("--batches", type=click.IntRange(4, 1_000_000), default=400, show_default=True,
              help="Accepted batches (entries) seeded per system.")
@click.option("--agents", type=click.IntRange(1, 1000), default=4, show_default=True)
@_common(repeat=1)
def bench_reconcile(batches: int, agents: int, repeat: int, quick: bool, latency_ms: float, max_inflight: int,
                    out_dir: str, as_json: bool) -> None:
    """Entries/s of the reconciler vs the same runs with one S3 request in flight (healthy entries)."""
    from lightmetrics.harness.bench.reconcile_bench import reconcile_bars, run_reconcile

    report = _run("reconcile", latency_ms, max_inflight,
                  lambda env: run_reconcile(env, batches=40 if quick else batches, agents=agents, repeat=repeat),
                  reconcile_bars, "entries / s", out_dir, "one request at a time")
    _show(report, as_json, latency_ms, max_inflight, repeat, ["figure", "reconciler", "one request at a time", "ratio"],
          lambda f: [("entries/s", _fmt(f["entries_per_s"]), _fmt(f["sequential_entries_per_s"]), _fmt(f["speedup"], 2)),
                     ("requests / entry", _fmt(f["requests_per_entry"], 2), "", "")])


@bench.command("reap")
@click.option("--hours", type=click.IntRange(1, 24), default=2, show_default=True,
              help="Expired acceptance hours seeded (and reaped) per system.")
@click.option("--batches-per-hour", type=click.IntRange(1, 100_000), default=40, show_default=True)
@click.option("--agents", type=click.IntRange(1, 1000), default=4, show_default=True)
@_common(repeat=1)
def bench_reap(hours: int, batches_per_hour: int, agents: int, repeat: int, quick: bool, latency_ms: float,
               max_inflight: int, out_dir: str, as_json: bool) -> None:
    """GC by-time blobs/s and retention batches/s vs the same reaps with one S3 request in flight."""
    from lightmetrics.harness.bench.reap_bench import reap_bars, run_reap

    report = _run("reap", latency_ms, max_inflight,
                  lambda env: run_reap(env, hours=1 if quick else hours,
                                       batches_per_hour=8 if quick else batches_per_hour, agents=agents,
                                       repeat=repeat),
                  reap_bars, "units / s", out_dir, "one request at a time")
    _show(report, as_json, latency_ms, max_inflight, repeat,
          ["figure", "reap", "one request at a time", "ratio", "requests / unit"],
          lambda f: [("GC by-time blobs/s", _fmt(f["gc_blobs_per_s"]), _fmt(f["sequential_gc_blobs_per_s"]),
                      _fmt(f["gc_speedup"], 2), _fmt(f["gc_requests_per_blob"], 2)),
                     ("retention batches/s", _fmt(f["retention_batches_per_s"]),
                      _fmt(f["sequential_retention_batches_per_s"]), _fmt(f["retention_speedup"], 2),
                      _fmt(f["retention_requests_per_batch"], 2))])


@bench.command("indexer-cpu")
@click.option("--sizes", default="1,10,100", show_default=True, help="SQS batch sizes (records per invocation).")
@click.option("--invocations", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="Measured invocations per size and indexer (after one warm-up).")
@json_option
def bench_indexer_cpu(sizes: str, invocations: int, as_json: bool) -> None:
    """Our own CPU per record and per invocation of the indexers (the SQS batch handler over the
    in-memory adapters, time.process_time), and botocore's per S3 request: the cost model's
    index_cpu_* assumptions (docs/cost.md). Exit 0; 2 on a bad option."""
    from lightmetrics.harness.bench.indexer_cpu import run_indexer_cpu

    try:
        wanted = tuple(sorted({int(x) for x in sizes.split(",") if x.strip()}))
    except ValueError:
        fail("--sizes must be comma-separated integers", EXIT_USAGE, as_json=as_json)
    if len(wanted) < 2 or min(wanted) < 1 or max(wanted) > 1000:
        fail("--sizes needs two or more sizes from 1 to 1000", EXIT_USAGE, as_json=as_json)
    report = run_indexer_cpu(sizes=wanted, invocations=invocations)
    if as_json:
        emit_json(report)
        return
    console.print(grid(f"indexer CPU, {report['machine']}, {report['date']} (median of {invocations})",
                       ["indexer", "#records", "CPU ms / invocation", "CPU ms / record"],
                       [(kind, r["batch_size"], f"{r['cpu_ms_per_invocation']:.3f}", f"{r['cpu_ms_per_record']:.3f}")
                        for kind, k in report["kinds"].items() for r in k["rows"]]))
    fit = report["fit"]
    console.print(f"fit (mean of the indexers): {fit['fixed_ms']:.3f} ms per invocation + "
                  f"{fit['per_record_ms']:.3f} ms per record; SDK {report['sdk_cpu_ms_per_request']:.3f} ms "
                  "per S3 request (one vCPU of this machine)")


@bench.command("keepup")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), required=True,
              help="Accepted batches per second the background jobs must follow.")
@click.option("--profile", type=click.Choice(["deployed", "docs"]), default="deployed", show_default=True,
              help="deployed: the code's settings; docs: what docs/performance.md said 1,000/s needs.")
@click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
              help="Override a setting, quota or assumption (repeatable; names in --json's params, quotas, "
                   "assumptions).")
@click.option("--require", "require", type=click.FloatRange(min=0), default=None,
              help="Exit 1 when any job's headroom is below this.")
@json_option
def bench_keepup(rate: float, profile: str, settings: tuple[str, ...], require: float | None, as_json: bool) -> None:
    """Each background job's headroom at --rate: what it must follow, what it can do (the least of
    its limits: parallelism x measured requests per unit x latency, AWS quotas, the code's bounds),
    the first limit it meets and the rate at which it meets it. A model, no AWS: < 1 s.
    Exit 0; 1 with --require when a job is below it; 2 on a bad option."""
    from lightmetrics.operator_tools.keepup import keepup

    overrides: dict[str, float] = {}
    for item in settings:
        name, sep, value = item.partition("=")
        try:
            overrides[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            fail(f"--set {item!r}: expected NAME=VALUE with a number", EXIT_USAGE, as_json=as_json)
    try:
        report = keepup(rate, profile=profile, overrides=overrides)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    below = [j["job"] for j in report["jobs"]
             if require is not None and j["headroom"] is not None and j["headroom"] < require]
    code = EXIT_VIOLATIONS if below else EXIT_OK
    if as_json:
        emit_json({**report, "require": require, "below_require": below, "exit_code": code})
        sys.exit(code)
    console.print(grid(f"keep-up at {rate:,g} batches/s ({profile})",
                       ["job", "must/s", "can/s", "x", "first limit", "at rate"],
                       [_keepup_row(j) for j in report["jobs"]]))
    console.print(grid("partitions: load at this rate, share of quota",
                       ["job", "partition", "per unit", "load/s", "quota"],
                       [(j["job"], p["name"], f"{p['per_unit']:.3g}", _num(p["load_per_s"]),
                         f"{p['share_of_quota']:.0%}") for j in report["jobs"] for p in j["partitions"]
                        if j.get("scheduled", True)]))
    rules = report["eventbridge_rules"]
    console.print(f"EventBridge rules: {rules['used']} of {rules['quota']} a bus, whatever the reconciler's shards "
                  "(one schedule fans out to them)")
    walk = next(j for j in report["jobs"] if j["job"].startswith("walk"))
    if report["walk_scheduled"]:
        console.print(f"walk: weekly (no S3 Inventory), {walk['one_walk_hours']:,.1f} h a walk over "
                      f"{walk['one_walk_keys']:,.0f} keys")
    else:
        console.print("walk: not scheduled (the audit over S3 Inventory moves W); no inventory: "
                      f"--set walks_per_month=4.35\n      a bootstrap of {walk['one_walk_keys']:,.0f} keys "
                      f"(all history) takes {walk['one_walk_hours']:,.1f} h")
    if below:
        console.print(f"below --require {require:g}: {', '.join(below)}")
    sys.exit(code)


def _keepup_row(j: dict[str, Any]) -> tuple[str, ...]:
    if not j.get("scheduled", True):  # no rate to follow: say so instead of a headroom
        return (j["job"], "-", _num(j["can_do_per_s"]), "-", j["first_limit"], "-")
    return (j["job"], _num(j["must_follow_per_s"]), _num(j["can_do_per_s"]), _times(j["headroom"]),
            j["first_limit"], "none" if j["at_rate"] is None else _num(j["at_rate"]))


def _times(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else f"{v:.2f}"


def _point(v: float) -> dict[str, float]:
    return {"median": v, "min": v, "max": v}


#: registered by importing this module (lightmetrics.cli.main)
BENCH_COMMANDS = (bench_accept, bench_indexing, bench_walk, bench_reconcile, bench_reap, bench_cost_table,
                  bench_indexer_cpu, bench_keepup)
