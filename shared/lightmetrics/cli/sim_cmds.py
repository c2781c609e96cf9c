"""``lmctl sim``: the deterministic simulation of the whole system (lightmetrics.harness.sim,
docs/reliability.md "Deterministic simulation")."""

from __future__ import annotations

import logging
import random
import sys
from typing import TYPE_CHECKING

import click

from lightmetrics.cli.options import json_option
from lightmetrics.cli.output import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS, console, emit_json, fail

if TYPE_CHECKING:
    from lightmetrics.harness.sim.shrink import RunParams

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
@click.option("--steps", type=click.IntRange(min=1, max=100_000), default=300, show_default=True,
              help="Storage calls of one schedule's run phase (quiescence follows).")
@click.option("--fault-rate", type=click.FloatRange(min=0.0, max=0.3), default=0.06, show_default=True,
              help="Chance a read meets a fault (a write: three times that).")
@click.option("--actors", default=None, metavar="NAMES",
              help="Comma-separated: run only these of the run phase's actors (as --shrink prints them).")
@click.option("--shrink", "do_shrink", is_flag=True,
              help="Shrink the first failing seed: fewer steps, actors and faults failing alike; print its replay.")
@click.option("--trace", "show_trace", is_flag=True, help="Print the whole trace of each seed that found a violation.")
@json_option
def sim_cmd(seed: int | None, fresh: int | None, start: int | None, minutes: float | None, steps: int,
            fault_rate: float, actors: str | None, do_shrink: bool, show_trace: bool, as_json: bool) -> None:
    """The real service code as actors on the in-memory adapters under a seeded scheduler, faults at
    every storage call; safety checks after every step, the invariant catalogue and liveness at
    quiescence. Without options: seeds 1-20. Exit 0 clean, 1 on a violation (its seed and trace tail
    printed; `lmctl sim --seed S` replays it; --shrink finds a smaller run failing alike and prints
    the command replaying it), 2 on a usage error."""
    from lightmetrics.harness.sim.runner import SimResult, run_many
    from lightmetrics.harness.sim.scheduler import pin_to_one_core
    from lightmetrics.harness.sim.shrink import RunParams  # noqa: F811 - the runtime import (the CLI starts lazily)

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
    pin_to_one_core()  # the actors take turns: one core, no hand-over across cores
    only = tuple(a for a in actors.split(",") if a) if actors is not None else None
    try:
        figures = run_many(seeds, minutes=minutes, steps=steps, fresh=pick, keep=results, fault_rate=fault_rate,
                           actors=only)
    except ValueError as exc:  # an actor the seed does not spawn
        fail(f"lmctl sim: --actors: {exc}", EXIT_USAGE, as_json=as_json)
    failing = next((r for r in results if r.violations), None)
    if do_shrink and failing is not None:
        figures["shrunk"] = _shrink(RunParams(failing.seed, steps, fault_rate, only), as_json)
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
    shrunk = figures.get("shrunk")
    if shrunk:
        was, now = shrunk["original"], shrunk["minimal"]
        console.print(f"shrunk seed {shrunk['seed']} in {shrunk['runs']} runs, still \"{shrunk['kind']}\": "
                      f"steps {was['steps']} -> {now['steps']}, fault rate {was['fault_rate']} -> {now['fault_rate']}, "
                      f"actors {len(was['actors'])} -> {len(now['actors'])} ({','.join(now['actors'])}), "
                      f"trace {was['trace_lines']} -> {now['trace_lines']} lines", markup=False)
        for line in shrunk["trace"]:
            console.print(f"  {line}", markup=False, soft_wrap=True)
        console.print(f"replay the minimal run: {shrunk['replay']}", markup=False)
    console.print("[red]FAILED[/]" if figures["violations"] else "[green]OK[/]")


def _shrink(params: RunParams, as_json: bool) -> dict[str, object]:
    from lightmetrics.harness.sim.shrink import shrink

    if not as_json:
        console.print(f"shrinking seed {params.seed} ...", markup=False)
    shrunk = shrink(params)
    assert shrunk is not None, "the failing seed did not fail again: a replay is not exact"
    return shrunk.figures()
