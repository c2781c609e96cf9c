"""``lmctl soak``: the chaos soak with its invariant checks (lightmetrics.harness.soak, docs/reliability.md)."""

from __future__ import annotations

import sys

import click

from lightmetrics.cli.options import json_option
from lightmetrics.cli.output import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS, console, emit_json, fail


@click.command("soak")
@click.option("--minutes", required=True, type=click.FloatRange(min=0.1, max=1440),
              help="How long to push load and faults; the settle phase and the checks follow.")
@click.option("--agents", default=4, show_default=True, type=click.IntRange(1, 64), help="Agent clients.")
@click.option("--collectors", default=3, show_default=True, type=click.IntRange(2, 16), help="Collector processes.")
@click.option("--seed", default=7, show_default=True, type=int, help="Seed of every choice the soak makes.")
@click.option("--port", default=0, type=click.IntRange(0, 65530), help="moto's port (0 = any free port).")
@json_option
def soak_cmd(minutes: float, agents: int, collectors: int, seed: int, port: int, as_json: bool) -> None:
    """Collectors, agents, indexers, reconciler, walks and GC reaps together under injected faults.

    Faults: S3 409/503/500, timeouts whose request landed, lost S3 events, duplicated SQS deliveries,
    collectors SIGKILLed and restarted. Then: agents drain, one reconcile, one walk, `lmctl verify
    --strict`, the ledger check and the derived-entry check. Exit 0 when all hold, 1 otherwise.
    """
    from lightmetrics.harness.soak import run_soak
    from lightmetrics.harness.soak_plan import SoakPlan

    try:
        plan = SoakPlan(minutes=minutes, agents=agents, collectors=collectors, seed=seed)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    report = run_soak(plan, port=port, show_progress=not as_json)
    if as_json:
        emit_json(report.to_json())
    else:
        from rich.table import Table

        table = Table(title="lightmetrics soak")
        table.add_column("counter")
        table.add_column("#", justify="right")
        for name, value in sorted(report.counters.items()):
            table.add_row(name, str(value))
        table.add_row("verify (strict)", "clean" if report.verify.get("ok") else "VIOLATIONS")
        table.add_row("violations", str(len(report.violations)))
        table.add_row("seconds", f"{report.seconds:.1f}")
        console.print(table)
        for v in report.violations[:20]:
            console.print(f"[red]violation[/]: {v}")
        for e in report.errors[:10]:
            console.print(f"[yellow]background error[/]: {e}")
        console.print("[green]OK[/]" if report.ok else "[red]FAILED[/]")
    sys.exit(EXIT_OK if report.ok else EXIT_VIOLATIONS)
