"""The deterministic simulation (``lmctl sim``; docs/reliability.md, "Deterministic simulation").

The same seed replays the same schedule byte for byte; a bounded run on fixed seeds finds nothing;
and the defect it found on main stays fixed (tests/test_sim_mutants.py shows it finds re-introduced ones).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lightmetrics.harness.sim import run_many, run_seed
from lightmetrics.ops import crashpoints

#: fixed seeds of the bounded run (about 0.3 s each on one core)
FIXED_SEEDS = list(range(1, 31))


def test_the_same_seed_replays_the_same_trace_byte_for_byte() -> None:
    first, second = run_seed(7), run_seed(7)
    assert first.steps > 200 and len(first.trace) > 300
    assert "\n".join(first.trace).encode() == "\n".join(second.trace).encode()
    assert first.violations == second.violations == []
    assert "\n".join(run_seed(8).trace) != "\n".join(first.trace)  # another seed, another schedule


def test_a_bounded_run_on_fixed_seeds_finds_nothing_and_covers_every_fault_kind() -> None:
    figures = run_many(FIXED_SEEDS, stop_at_first=False)
    print(f"sim: seeds {figures['seeds'][0]}..{figures['seeds'][-1]}, {figures['schedules_per_min']} schedules/min, "
          f"{figures['calls_per_schedule']} storage calls/schedule")
    assert figures["violations"] == []
    kinds = figures["coverage"]["fault_kinds"]
    assert all(kinds[k] > 0 for k in ("fail", "lost", "crash-before", "crash-after", "crash-point", "clock-jump")), kinds
    assert set(figures["coverage"]["crash_points_hit"]) <= set(crashpoints.REGISTRY)
    # 14: the walk and two reconciler shards take turns the reaps had (reconcile.progress-saved is hit now)
    assert len(figures["coverage"]["crash_points_hit"]) >= 14
    assert "reconcile.progress-saved" in figures["coverage"]["crash_points_hit"]


def test_a_settle_rerun_after_its_purge_died_deletes_the_purged_blobs_hint() -> None:
    """Seed 111 found it on main: a mark without a recorded marker id (the marking DeleteObjects'
    answer was lost) was settled by a task that died at gc.purged-markers; the re-run found the
    captured version gone and left the blob's raw-blobs-by-time hint behind (docs/protocol.md §15 G-I9)."""
    result = run_seed(111)
    assert result.violations == [], result.violations


def _lmctl_sim(*args: str, hash_seed: str = "0") -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed,
           "PYTHONPATH": os.pathsep.join([str(root / "shared"), str(root / ".pp")])}
    return subprocess.run([sys.executable, "-m", "lightmetrics.cli.main", "sim", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_lmctl_sim_replays_a_seed_in_another_process_and_refuses_a_contradictory_request() -> None:
    one, two = _lmctl_sim("--seed", "7", "--json", hash_seed="1"), _lmctl_sim("--seed", "7", "--json", hash_seed="2")
    assert one.returncode == two.returncode == 0, one.stderr
    first, second = json.loads(one.stdout), json.loads(two.stdout)
    assert first["trace_sha256"] == second["trace_sha256"] and first["seeds"] == [7]
    assert {"steps", "storage_calls", "steps_per_s", "violations", "coverage"} <= set(first)
    usage = _lmctl_sim("--seed", "7", "--seeds", "3")
    assert usage.returncode == 2 and "--seed replays one seed" in usage.stderr
