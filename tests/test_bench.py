"""Smoke tests of the benchmarks (issue 9 item 2): they run and report the right structure and
request counts. Timings are printed by the benchmarks, never asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from lightmetrics.aws.s3_store import s3_client_config
from lightmetrics.harness.bench.cost_table import OPERATIONS, measure_operation_costs
from lightmetrics.local.system import LocalSystem
from lightmetrics.operator_tools.cost_workload import MEASURED_REQUESTS

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_bench_accept_quick_writes_json_and_png_with_exact_counts(tmp_path):  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LM_", "MOTO_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "lightmetrics.cli.main", "bench", "accept", "--repeat", "1", "--quick",
         "--latency-ms", "5", "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = json.loads(proc.stdout)
    written = json.loads((tmp_path / "accept.json").read_text())
    assert printed["rows"] == written["rows"] and printed["exit_code"] == 0
    assert [r["callers"] for r in written["rows"]] == [1, 8, 32]
    for row in written["rows"]:
        for figure in ("batches_per_s", "p50_ms", "p99_ms", "p50_over_rtt", "ceiling_batches_per_s",
                       "ratio_to_ceiling"):
            assert set(row[figure]) == {"median", "min", "max", "spread", "runs"} and row[figure]["runs"] == 1
            assert row[figure]["median"] > 0
    counts = written["counts"]
    assert counts["requests_per_accept"] == [2] and counts["statuses"] == ["accepted"]
    assert counts["accepts"] == 2 * (1 + 8 + 32)  # --quick: 2 batches per caller
    # every accept request and every ceiling PUT went through the injector, and the cap held
    assert counts["injected_requests"] >= 2 * counts["accepts"] and 1 <= counts["peak_inflight"] <= 8
    assert written["environment"]["injected_rtt_ms"] == 5.0
    assert (tmp_path / "accept.png").read_bytes()[:8] == PNG_MAGIC


def test_cost_table_is_flat_and_matches_the_cost_models_table(runtime):  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:10]
    system = LocalSystem(runtime, bucket=f"lm-cost-{tag}", table=f"lm-cost-{tag}", secret_name=f"lm-cost/{tag}",
                         queue_name_prefix=f"cost{tag}-").provision()
    system.notifications(False)
    raw = runtime.boto3_client("s3", config=s3_client_config())
    costs = measure_operation_costs(system, raw, depths=(10, 30))
    assert set(costs["operations"]) == set(OPERATIONS)
    assert all(costs["flat"].values()), costs["operations"]
    for op, by_depth in costs["operations"].items():
        for depth, measured in by_depth.items():
            # The checked-in table the cost model prices (lightmetrics.operator_tools.cost_model) is the live count.
            assert measured["by_api"] == MEASURED_REQUESTS[op], (op, depth)
    assert costs["operations"]["accept.new"]["30"] == {"total": 2, "by_api": {"s3.PutObject": 2}}
    assert [s["depth"] for s in costs["seeding"]] == [10, 30]


def test_indexing_and_walk_benches_count_what_they_claim(runtime):  # type: ignore[no-untyped-def]
    """Small in-process runs on the session runtime: structure and request counts, not timings."""
    from lightmetrics.harness.bench.harness import BenchEnv
    from lightmetrics.harness.bench.indexing_bench import run_indexing
    from lightmetrics.harness.bench.walk_bench import run_walk

    with BenchEnv(latency_ms=2, max_inflight=8, runtime=runtime) as env:
        indexing = run_indexing(env, batches=20, repeat=1)
        walk = run_walk(env, batches=12, agents=2, page_size=5, repeat=1)
    assert os.environ.get("LM_INJECT_LATENCY_MS") is None  # the bench put the environment back
    counts = indexing["counts"]
    assert counts["indexed_last_repeat"] == 20
    # GET + 2 PUTs per manifest, plus one tombstone HEAD per hour per handler context
    assert counts["by_api_last_repeat"]["s3.GetObject"] == 2 * 20  # handler + sequential baseline
    assert counts["by_api_last_repeat"]["s3.PutObject"] == 2 * 2 * 20
    assert set(indexing["figures"]) >= {"objects_per_s", "baseline_objects_per_s", "speedup",
                                        "round_trips_per_sqs_batch", "baseline_round_trips_per_sqs_batch"}
    (run,) = walk["runs"]
    assert run["walk_keys"] == run["sequential_keys"] == 12
    outcomes = {k: v for k, v in run["walk_outcomes"].items() if v}
    assert sum(outcomes.values()) == 12 and set(outcomes) <= {"DONE", "NOOP_RESOLVED"}
    assert sum(run["sequential_outcomes"].values()) == 12
    # a repair is GET + HEAD + 3 PUTs per key; the sequential walker adds one LIST
    assert run["sequential_requests"] == {"s3.ListObjectsV2": 1, "s3.GetObject": 12, "s3.HeadObject": 12 + 1,
                                          "s3.PutObject": 36}
    assert walk["figures"]["walk_keys_per_s"]["runs"] == 1
