"""Shrinking a failing schedule: the same seed re-run with fewer steps, fewer actors and fewer faults
until no smaller run fails with the same kind of violation (``lmctl sim --seed S --shrink``).

The seed stays: every candidate is a replayable ``lmctl sim`` command (:meth:`RunParams.command`),
so the minimal run replays exactly on any machine. The shrinker is greedy over the run's parameters
— first the step budget (cut to the step the run phase found the violation at, whose prefix is the
same schedule, then halved and trimmed), then each actor left out in turn, then the fault rate —
and repeats the passes until one changes nothing or ``max_runs`` is spent. Leaving an actor out, or
changing the fault rate, gives another interleaving of the same seed: a candidate counts only if it
fails with the same :func:`violation_kind`. (docs/reliability.md, "Deterministic simulation", says
why this is not Hypothesis.)

Example:
    >>> violation_kind("blob a record names deleted: raw-blobs/v1/sha256/ab/cd/x.lmbatch (record accepted/v1/x)")
    'blob a record names deleted'
    >>> violation_kind("actor collector#2 escaped: TypeError: 'NoneType' object is not subscriptable")
    'actor * escaped: TypeError'
    >>> RunParams(7, 120, 0.03, ("indexer", "gc")).command()
    'lmctl sim --seed 7 --steps 120 --fault-rate 0.03 --actors indexer,gc --trace'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from lightmetrics.harness.sim.runner import DEFAULT_FAULT_RATE, DEFAULT_STEPS, SimResult, run_seed

#: the runs one shrink may spend (a schedule is ~0.1 s: about 15 s at most)
MAX_RUNS = 150
_VARIABLE = re.compile(r"[/#:=]|\d")  # a key, an id, a count, an actor's number: not part of the kind


@dataclass(frozen=True)
class RunParams:
    """One run of one seed: what ``lmctl sim`` replays. ``actors`` None: every actor the seed spawns."""

    seed: int
    steps: int = DEFAULT_STEPS
    fault_rate: float = DEFAULT_FAULT_RATE
    actors: tuple[str, ...] | None = None

    def command(self) -> str:
        actors = f" --actors {','.join(self.actors)}" if self.actors is not None else ""
        return f"lmctl sim --seed {self.seed} --steps {self.steps} --fault-rate {self.fault_rate!r}{actors} --trace"

    def run(self) -> SimResult:
        return run_seed(self.seed, steps=self.steps, fault_rate=self.fault_rate, actors=self.actors)


@dataclass
class Shrunk:
    """The original failing run and the smallest one found that fails with the same ``kind``."""

    kind: str
    original: RunParams
    original_result: SimResult
    minimal: RunParams
    result: SimResult
    runs: int

    def figures(self) -> dict[str, object]:
        """``lmctl sim --shrink --json``'s ``shrunk``."""
        def shape(p: RunParams, r: SimResult) -> dict[str, object]:
            return {"steps": p.steps, "fault_rate": p.fault_rate, "actors": list(p.actors or r.actors),
                    "run_steps": r.steps, "trace_lines": len(r.trace), "violations": r.violations}
        return {"seed": self.original.seed, "kind": self.kind, "runs": self.runs,
                "original": shape(self.original, self.original_result),
                "minimal": shape(self.minimal, self.result), "replay": self.minimal.command(),
                "trace": self.result.trace}


def _clean(text: str) -> str:
    words = ["*" if _VARIABLE.search(w) else w for w in text.split()]
    return " ".join(w for n, w in enumerate(words) if w != "*" or n == 0 or words[n - 1] != "*")


def violation_kind(violation: str) -> str:
    """A violation without its keys, ids and numbers: what a smaller run must find again."""
    parts = violation.split(": ")
    head = _clean(parts[0])
    if len(parts) > 1 and (head in ("verify", "liveness") or head.endswith("escaped")):
        head = f"{head}: {_clean(parts[1])}"
    return head


def violation_step(result: SimResult) -> int | None:
    """The run-phase step whose check found the violation (None: quiescence found it)."""
    for line in result.trace:
        if " VIOLATION " in line:
            return int(line.split(" ", 1)[0])
    return None


def _step_candidates(result: SimResult, steps: int) -> Iterator[int]:
    found_at = violation_step(result)
    if found_at is not None and found_at < steps:
        yield found_at  # the same schedule up to that step: it fails there again
    yield steps // 2
    cut = steps // 4
    while cut >= 1:
        yield steps - cut
        cut //= 2


def shrink(params: RunParams, *, max_runs: int = MAX_RUNS,
           progress: Callable[[RunParams, bool], None] | None = None) -> Shrunk | None:
    """The smallest run found failing like ``params``' run; None if that run does not fail."""
    first = params.run()
    if not first.violations:
        return None
    kind = violation_kind(first.violations[0])
    best, best_result, runs = replace(params, actors=params.actors or tuple(first.actors)), first, 1

    def fails(candidate: RunParams) -> SimResult | None:
        nonlocal runs
        runs += 1
        result = candidate.run()
        ok = any(violation_kind(v) == kind for v in result.violations)
        if progress is not None:
            progress(candidate, ok)
        return result if ok else None

    changed = True
    while changed and runs < max_runs:
        changed = False
        for steps in _step_candidates(best_result, best.steps):
            if 1 <= steps < best.steps and runs < max_runs and (r := fails(replace(best, steps=steps))):
                best, best_result, changed = replace(best, steps=steps), r, True
                break
        for name in list(best.actors or ()):
            left = tuple(a for a in best.actors or () if a != name)
            if left and runs < max_runs and (r := fails(replace(best, actors=left))):
                best, best_result, changed = replace(best, actors=left), r, True
        for rate in (0.0, best.fault_rate / 4, best.fault_rate / 2):
            if rate < best.fault_rate and runs < max_runs and (r := fails(replace(best, fault_rate=rate))):
                best, best_result, changed = replace(best, fault_rate=rate), r, True
                break
    return Shrunk(kind, params, first, best, best_result, runs)


__all__ = ["MAX_RUNS", "RunParams", "Shrunk", "shrink", "violation_kind", "violation_step"]
