"""The background jobs' benchmarks (issue 14 target 4): ``lmctl bench reconcile``, ``bench reap`` and
``bench walk`` run at tiny sizes, report what they claim, and their baselines do the same work.

Nothing here is timed (the speedups are the benchmarks' figures, for ``lmctl bench``; under load a
ratio can lose). What a broken design would fail is counted instead: the job overlaps its round trips
(the latency injector saw more than one S3 request in flight at once during its run) while its
baseline never does, and the baseline does the same requests per unit as the job — (reconcile, reap)
every S3 request of the baseline through an injector whose cap is one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lightmetrics.harness.bench.harness import BenchEnv

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = {"median", "min", "max", "spread", "runs"}


def _s3(by_api: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in by_api.items() if k.startswith("s3.")}


def test_bench_reconcile_cli_prints_strict_json_and_overlaps_what_its_baseline_sends_one_at_a_time(tmp_path):  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LM_", "MOTO_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "lightmetrics.cli.main", "bench", "reconcile", "--quick", "--latency-ms", "20",
         "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)  # stdout is the JSON document and nothing else
    assert "reconciler over 40 entries" in proc.stderr  # progress goes to stderr
    assert json.loads((tmp_path / "reconcile.json").read_text())["figures"] == report["figures"]
    assert (tmp_path / "reconcile.png").is_file()
    f = report["figures"]
    assert set(f) == {"entries_per_s", "sequential_entries_per_s", "speedup", "requests_per_entry"}
    assert all(set(v) == SUMMARY and v["runs"] == 1 and v["median"] > 0 for v in f.values())
    (run,) = report["runs"]
    for name in ("reconciler", "sequential"):
        assert run[name]["entries"] == 40 and run[name]["outcomes"] == {"NOOP_RESOLVED": 40}, run[name]
    # the baseline is the same check: the same S3 requests, every one of them through the cap of one
    assert _s3(run["reconciler_requests"]) == _s3(run["sequential_requests"])
    assert run["sequential"]["one_at_a_time_requests"] == sum(_s3(run["sequential_requests"]).values())
    # a healthy entry costs one GET plus its share of the listings, not a repair
    assert run["reconciler_requests"]["s3.GetObject"] == 40 and "s3.PutObject" not in run["reconciler_requests"]
    assert run["reconciler"]["peak_inflight"] > 1 and run["sequential"]["peak_inflight"] == 1, run


def test_bench_reap_runs_gc_by_time_and_retention_with_the_same_requests_as_its_baseline(runtime):  # type: ignore[no-untyped-def]
    from lightmetrics.harness.bench.reap_bench import run_reap

    with BenchEnv(latency_ms=20, max_inflight=8, runtime=runtime) as env:
        report = run_reap(env, hours=1, batches_per_hour=16, agents=2, repeat=1)
    assert os.environ.get("LM_INJECT_LATENCY_MS") is None  # the bench put the environment back
    f = report["figures"]
    assert set(f) == {"gc_blobs_per_s", "sequential_gc_blobs_per_s", "gc_speedup", "retention_batches_per_s",
                      "sequential_retention_batches_per_s", "retention_speedup", "gc_requests_per_blob",
                      "retention_requests_per_batch"}
    assert all(v["median"] > 0 for v in f.values())
    (run,) = report["runs"]
    for name in ("reap", "sequential"):
        assert run["seeded"][name]["batches"] == 16
        assert run[f"{name}.gc_examined"] == run[f"{name}.gc_kept"] == 16  # every blob referenced: kept
        assert len(run[f"{name}.hours_reaped"]) == 1 and run[f"{name}.retention_purged"] == 16
    for job in ("gc", "retention"):
        assert _s3(run[f"reap.{job}_requests"]) == _s3(run[f"sequential.{job}_requests"]), job
    # retention's blobs go through GC's concurrent collector: its requests overlap, the baseline's never
    assert run["reap.peak_inflight"] > 1 and run["sequential.peak_inflight"] == 1, run


def test_bench_walk_repairs_the_same_per_key_as_its_sequential_walker_and_overlaps_its_requests(runtime):  # type: ignore[no-untyped-def]
    from lightmetrics.harness.bench.walk_bench import run_walk

    with BenchEnv(latency_ms=20, max_inflight=32, runtime=runtime) as env:
        report = run_walk(env, batches=40, agents=4, page_size=100, repeat=1)
    (run,) = report["runs"]
    assert run["walk_keys"] == run["sequential_keys"] == 40
    # each walker had its own history without derived entries: every key repaired by both
    assert run["walk_outcomes"]["DONE"] == 40 and run["sequential_outcomes"] == {"DONE": 40}
    assert run["per_key_requests"]["walk"] == run["per_key_requests"]["sequential"] == {
        "s3.GetObject": 1.0, "s3.PutObject": 3.0}
    assert report["params"]["parallelism"] == 4
    assert run["peak_inflight"]["walk"] > 1 and run["peak_inflight"]["sequential"] == 1, run["peak_inflight"]
