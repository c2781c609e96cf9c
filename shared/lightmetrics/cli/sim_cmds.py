"""``lmctl sim``: the deterministic simulation of the whole system (lightmetrics.harness.sim,
docs/reliability.md "Deterministic simulation")."""

from __future__ import annotations

import logging
import random
import sys

import click

from lightmetrics.cli.options import json_option
from lightmetrics.cli.output import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS, console, emit_json, fail

#: the seeds a run without --seed, --seeds or --minutes replays
DEFAULT_SEEDS = list(range(1, 21))
TRACE_TAIL = 40


@click.command("sim")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Replay this one seed exactly.")
@click.option("--seeds", "fresh", type=click.IntRange(min=1), default=None, help="Run this many fresh random seeds.")
@click.option("--start", type=click.IntRange(min=0), default=None,
              help="With --seeds N: seeds START .. START+N-1 instead of random ones (a reproducible batch).")
@click.option("--minutes", type=click.FloatRange(min=0.01, max=1440), default=None,
              help="Run fresh random seeds until this many minutes have passed.")
@click.option("--steps", type=click.IntRange(min=20, max=100_000), default=300, show_default=True,
              help="Storage calls of one schedule's run phase (quiescence follows).")
@click.option("--trace", "show_trace", is_flag=True, help="Print the whole trace of each seed that found a violation.")
@json_option
def sim_cmd(seed: int | None, fresh: int | None, start: int | None, minutes: float | None, steps: int,
            show_trace: bool, as_json: bool) -> None:
    """The real service code as actors on the in-memory adapters under a seeded scheduler, faults at
    every storage call; safety checks after every step, the invariant catalogue and liveness at
    quiescence. Without options: seeds 1-20. Exit 0 clean, 1 on a violation (its seed and trace tail
    printed; `lmctl sim --seed S` replays it), 2 on a usage error."""
    from lightmetrics.harness.sim.runner import SimResult, run_many

    if seed is not None and (fresh is not None or minutes is not None):
        fail("lmctl sim: --seed replays one seed; it cannot be combined with --seeds or --minutes", EXIT_USAGE,
             as_json=as_json)
    if start is not None and fresh is None:
        fail("lmctl sim: --start numbers the seeds of --seeds N; give --seeds too", EXIT_USAGE, as_json=as_json)
    pick = random.Random()
    seeds = [seed] if seed is not None else [pick.randrange(2**32) if start is None else start + n
                                             for n in range(fresh or 0)]
    if seed is None and fresh is None and minutes is None:
        seeds = list(DEFAULT_SEEDS)
    results: list[SimResult] = []
    # the services' warnings under injected faults are the point of the run, not news: the trace has them
    logging.disable(logging.CRITICAL)
    figures = run_many(seeds, minutes=minutes, steps=steps, fresh=pick, keep=results)
    if as_json:
        emit_json(figures)
    else:
        _show(figures, results, show_trace)
    sys.exit(EXIT_VIOLATIONS if figures["violations"] else EXIT_OK)


def _show(figures: dict, results: list, show_trace: bool) -> None:  # type: ignore[type-arg]
    seeds = figures["seeds"]
    console.print(f"seeds: {' '.join(map(str, seeds[:50]))}{' ...' if len(seeds) > 50 else ''}", markup=False)
    cov = figures["coverage"]
    console.print(f"{figures['schedules']} schedules, {figures['steps']} steps, {figures['steps_per_s']} steps/s, "
                  f"{figures['schedules_per_min']} schedules/min; faults {cov['fault_kinds']}; "
                  f"crash points hit {len(cov['crash_points_hit'])}, missed {len(cov['crash_points_missed'])}",
                  markup=False)
    for r in results:
        if not r.violations:
            continue
        console.print(f"[red]violation[/] in seed {r.seed}: {r.violations[0]}")
        for more in r.violations[1:10]:
            console.print(f"  also: {more}", markup=False)
        console.print(f"replay: lmctl sim --seed {r.seed} --trace", markup=False)
        for line in (r.trace if show_trace else r.trace[-TRACE_TAIL:]):
            console.print(f"  {line}", markup=False, soft_wrap=True)
    console.print("[red]FAILED[/]" if figures["violations"] else "[green]OK[/]")
