"""The simulation's runs in the background of the test session (docs/reliability.md, "Deterministic
simulation"): pytest here is one process on a two-core machine, so ``conftest.py`` starts this file as
a subprocess when the session begins and the tests marked ``sim_background`` (run last) collect what
it found. It runs, one after another, on the otherwise idle core:

1. the mutant suite (``tests/test_sim_mutants.py``'s ``MUTANTS``): ``lmctl sim --seeds MAX_SEEDS
   --start 1 --json`` on a mutated copy of ``shared/``, one subprocess each;
2. shrinking the first mutant's failing seed (``lmctl sim --seed S --shrink``) and replaying the
   minimal run it printed in another process;
3. the bounded simulation: fixed seeds ``FIXED_SEEDS``, then fresh seeds drawn from a printed master
   seed (at least ``MIN_FRESH``) until ``BOUNDED_S`` seconds have passed or the session asks it to stop.

Each step writes ``<name>.json`` in the output folder; the session's summary prints the seeds.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXED_SEEDS = range(1, 301)
MIN_FRESH = 20
#: the bounded simulation's wall time at most (fixed seeds always finish; fresh ones fill the rest)
BOUNDED_S = float(os.environ.get("LM_SIM_BOUNDED_S", "120"))


def _env(shared: Path) -> dict[str, str]:
    pipeline = shared.parent / "pp"  # a mutated copy's pipeline (test_sim_mutants._mutated), else the tree's
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(shared), str(pipeline if pipeline.is_dir() else ROOT / ".pp")]),
            "PYTHONHASHSEED": "0"}


def _lmctl_sim(shared: Path, *args: str, timeout: float = 300) -> tuple[int, dict[str, Any], str]:
    run = subprocess.run([sys.executable, "-m", "lightmetrics.cli.main", "sim", *args, "--json"], capture_output=True,
                         text=True, env=_env(shared), timeout=timeout)
    try:
        figures = json.loads(run.stdout)
    except ValueError:
        figures = {}
    return run.returncode, figures, run.stderr[-2000:]


def _write(out: Path, name: str, doc: dict[str, Any]) -> None:
    tmp = out / f".{name}.json"
    tmp.write_text(json.dumps(doc))
    tmp.replace(out / f"{name}.json")  # whole or absent: the reader polls for it


def run_mutants(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_sim_mutants import MAX_SEEDS, MORE_SEEDS, MUTANTS, START_AT, _mutated

    first: tuple[str, Path, int] | None = None
    for name in sorted(MUTANTS):
        tmp = Path(tempfile.mkdtemp(prefix=f"sim-mutant-{name[:20]}-", dir=out))
        shared = _mutated(tmp, *MUTANTS[name])
        started = time.monotonic()
        code, figures, stderr = _lmctl_sim(shared, "--seeds", str(MORE_SEEDS.get(name, MAX_SEEDS)),
                                           "--start", str(START_AT.get(name, 1)))
        _write(out, f"mutant-{name}", {"returncode": code, "figures": figures, "stderr": stderr,
                                       "seconds": round(time.monotonic() - started, 1)})
        if first is None and figures.get("violations"):
            first = (name, shared, figures["violations"][0]["seed"])
    if first is not None:
        name, shared, seed = first
        started = time.monotonic()
        code, figures, stderr = _lmctl_sim(shared, "--seed", str(seed), "--shrink")
        shrunk = figures.get("shrunk") or {}
        replay: dict[str, Any] = {}
        if shrunk:
            argv = shrunk["replay"].split()[2:]  # the printed command, less `lmctl sim`
            replay_code, replay, _ = _lmctl_sim(shared, *[a for a in argv if a != "--trace"])
            replay["returncode"] = replay_code
        _write(out, "shrink", {"mutant": name, "seed": seed, "returncode": code, "shrunk": shrunk, "replay": replay,
                               "stderr": stderr, "seconds": round(time.monotonic() - started, 1)})
    for tmp in out.glob("sim-mutant-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def run_bounded(out: Path) -> None:
    import logging

    from lightmetrics.harness.sim.runner import SimResult, run_seed, summary
    from lightmetrics.harness.sim.shrink import RunParams, shrink

    logging.disable(logging.CRITICAL)
    master = int(os.environ.get("LM_SIM_FRESH_MASTER") or random.SystemRandom().randrange(2**32))
    fresh = random.Random(master)
    started = time.monotonic()
    fresh_seeds: list[int] = []
    results_: list[SimResult] = []
    for seed in FIXED_SEEDS:
        results_.append(run_seed(seed))
        if results_[-1].violations:
            break
    while not any(r.violations for r in results_) and (
            len(fresh_seeds) < MIN_FRESH or (time.monotonic() - started < BOUNDED_S and not (out / "stop").exists())):
        fresh_seeds.append(fresh.randrange(2**32))
        results_.append(run_seed(fresh_seeds[-1]))
    figures = summary(results_, time.monotonic() - started)
    failing = next((r for r in results_ if r.violations), None)
    shrunk = shrink(RunParams(failing.seed)) if failing is not None else None
    _write(out, "bounded", {"fixed": [FIXED_SEEDS.start, FIXED_SEEDS.stop - 1], "fresh_master": master,
                            "fresh_seeds": fresh_seeds, "figures": {k: v for k, v in figures.items()
                                                                    if k != "trace_sha256"},
                            "shrunk": shrunk.figures() if shrunk is not None else None})


class Background:
    """The subprocess running :func:`main`; its results by name, waited for."""

    def __init__(self) -> None:
        self.out = Path(tempfile.mkdtemp(prefix="lm-sim-background-"))
        self.log = (self.out / "log").open("w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, __file__, str(self.out)], env=_env(ROOT / "shared"),
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.collected: dict[str, dict[str, Any]] = {}

    def request_stop(self) -> None:
        """The session is ending: the bounded run stops drawing fresh seeds (after ``MIN_FRESH``)."""
        (self.out / "stop").touch()

    def result(self, name: str, timeout_s: float = 540) -> dict[str, Any]:
        path, deadline = self.out / f"{name}.json", time.monotonic() + timeout_s
        while not path.exists():
            if self.proc.poll() is not None and not path.exists():
                raise AssertionError(f"the background simulation ended ({self.proc.returncode}) without {name}: "
                                     f"{(self.out / 'log').read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {name} from the background simulation after {timeout_s:.0f} s")
            time.sleep(0.2)
        self.collected[name] = json.loads(path.read_text())
        return self.collected[name]

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.log.close()
        shutil.rmtree(self.out, ignore_errors=True)

    def summary_lines(self) -> list[str]:
        lines = []
        bounded = self.collected.get("bounded")
        if bounded:
            f, fresh = bounded["figures"], bounded["fresh_seeds"]
            lines.append(f"bounded run: fixed seeds {bounded['fixed'][0]}..{bounded['fixed'][1]} and {len(fresh)} fresh "
                         f"seeds (random.Random({bounded['fresh_master']})): {' '.join(map(str, fresh[:12]))}"
                         f"{' ...' if len(fresh) > 12 else ''}; {f['schedules']} schedules, "
                         f"{f['schedules_per_min']} schedules/min, {f['calls_per_schedule']} calls/schedule "
                         f"(beside the suite); violations: {len(f['violations'])}")
            for v in f["violations"]:
                lines.append(f"  seed {v['seed']}: {v['found'][0][:160]}; replay: lmctl sim --seed {v['seed']} --trace")
            if bounded.get("shrunk"):
                lines.append(f"  shrunk: {bounded['shrunk']['replay']}")
        for name, doc in sorted(self.collected.items()):
            if name.startswith("mutant-") and doc["figures"].get("violations"):
                found = doc["figures"]["violations"][0]
                lines.append(f"{name}: found by seed {found['seed']} after {doc['figures']['schedules']} schedules, "
                             f"{doc['seconds']} s")
        shrink = self.collected.get("shrink")
        if shrink and shrink["shrunk"]:
            was, now = shrink["shrunk"]["original"], shrink["shrunk"]["minimal"]
            lines.append(f"shrink of {shrink['mutant']} seed {shrink['seed']}: steps {was['steps']} -> {now['steps']}, "
                         f"actors {len(was['actors'])} -> {len(now['actors'])}, trace {was['trace_lines']} -> "
                         f"{now['trace_lines']} lines, {shrink['seconds']} s; {shrink['shrunk']['replay']}")
        return lines


def main(out: Path) -> None:
    from lightmetrics.harness.sim.scheduler import pin_to_one_core

    os.nice(5)  # beside the suite, not ahead of it
    pin_to_one_core()  # the bounded run's actors take turns: one core (each lmctl sim pins itself)
    run_mutants(out)
    run_bounded(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
