"""The simulation finds defects once fixed (issue 24's mutant suite, first part): each mutant
re-introduces one in a temporary copy of ``shared/``, and ``lmctl sim`` run on that copy (a
subprocess, fixed seeds from 1) must report a violation with its seed within ``MAX_SEEDS``.

Seeds that found each on the day they were written (one core): see docs/reliability.md,
"Deterministic simulation".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: (file under shared/, the fixed code, the defect) — one small edit each
MUTANTS = {
    # GC read a record it cannot parse (a newer writer's) as "no record" and purged the blob it names
    "gc-purges-the-blob-of-a-record-it-cannot-parse": (
        "lightmetrics/reaps/gc.py",
        "            self._block_record(key, exc)\n            return _UNREADABLE",
        "            self._block_record(key, exc)\n            return None"),
    # a dry run entered the settle phase for marks a failed reap left (rule DR1)
    "a-dry-run-settles": (
        "lightmetrics/reaps/reaper_base.py",
        'if cp["dry_run"] or not self.table.query(CHECKPOINT_PK',
        "if not self.table.query(CHECKPOINT_PK"),
    # a conditional write whose answer was lost, retried against its own write, read as another's (§11.1)
    "a-lost-answer-read-as-someone-elses-write": (
        "lightmetrics/protocol/own_writes.py",
        "if current is not None and current.get(WRITE_TOKEN) == token:",
        "if False:"),
    # the reconciler closed hours its run never scanned to their end (fixed in 9156b59: R5, "only
    # hours this run scanned are closed")
    "the-reconciler-closes-hours-it-never-scanned": (
        "lightmetrics/derived/reconcile.py",
        "            if not start <= new_open <= scanned_to:\n",
        "            if False:\n"),
    # a unit's success cleared its retry budget only when the caller knew it failed, not when this
    # process had recorded the failure (fixed in 9156b59: O1a)
    "a-success-does-not-clear-the-retry-budget-this-process-counted": (
        "lightmetrics/ops/retry_budget.py",
        "            return work_key in self._recorded\n",
        "            return False\n"),
    # a refusal (403 AccessDenied) that passed kept its blocker open for good: run_unit did not
    # resolve it when the unit's full check succeeded (fixed in bf86467: O4)
    "a-passing-refusal-blocks-for-good": (
        "lightmetrics/ops/work.py",
        "    if failed_before:\n        try:\n            ctx.blockers.resolve_by_success",
        "    if False:\n        try:\n            ctx.blockers.resolve_by_success"),
}
MAX_SEEDS = 40


def _mutated(tmp: Path, path: str, fixed: str, defect: str) -> Path:
    copy = tmp / "shared"
    shutil.copytree(ROOT / "shared", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / path
    text = target.read_text()
    assert text.count(fixed) == 1, f"{path}: the fixed code moved; update the mutant"
    target.write_text(text.replace(fixed, defect))
    return copy


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_simulation_finds_a_reintroduced_defect(name: str, tmp_path: Path) -> None:
    shared = _mutated(tmp_path, *MUTANTS[name])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shared), str(ROOT / ".pp")])}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "lightmetrics.cli.main", "sim", "--seeds", str(MAX_SEEDS),
                          "--start", "1", "--json"], capture_output=True, text=True, env=env, timeout=300)
    figures = json.loads(run.stdout)
    assert run.returncode == 1, (run.returncode, run.stderr[-2000:])
    [found] = figures["violations"]
    print(f"{name}: seed {found['seed']} after {figures['schedules']} schedules, "
          f"{time.monotonic() - started:.1f} s: {found['found'][0][:200]}")
    assert found["seed"] == figures["seeds"][-1] and found["found"] and found["trace_tail"]
