"""The deterministic simulation (``lmctl sim``; docs/reliability.md, "Deterministic simulation").

The same seed replays the same schedule byte for byte; a bounded run on fixed seeds finds nothing;
and the defect it found on main stays fixed (tests/test_sim_mutants.py shows it finds re-introduced ones).
"""

from __future__ import annotations

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
          f"{figures['steps'] // figures['schedules']} calls/schedule")
    assert figures["violations"] == []
    kinds = figures["coverage"]["fault_kinds"]
    assert all(kinds[k] > 0 for k in ("fail", "lost", "crash-before", "crash-after", "crash-point")), kinds
    assert set(figures["coverage"]["crash_points_hit"]) <= set(crashpoints.REGISTRY)
    assert len(figures["coverage"]["crash_points_hit"]) >= 15


def test_a_settle_rerun_after_its_purge_died_deletes_the_purged_blobs_hint() -> None:
    """Seed 111 found it on main: a mark without a recorded marker id (the marking DeleteObjects'
    answer was lost) was settled by a task that died at gc.purged-markers; the re-run found the
    captured version gone and left the blob's raw-blobs-by-time hint behind (docs/protocol.md §15 G-I9)."""
    result = run_seed(111)
    assert result.violations == [], result.violations
