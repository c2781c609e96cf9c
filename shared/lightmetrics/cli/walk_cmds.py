"""``lmctl walk start|status`` (bootstrap walks on Step Functions) and ``lmctl verify`` (the oracle).

The walk runs in Step Functions (``LM_STATE_MACHINE_ARNS`` names the ``bootstrap-walk`` state
machine; the stack output ``BootstrapWalkArn``); these commands start an execution, watch the
checkpoint it keeps in the control table and read the completeness watermarks. See docs/walks.md.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from botocore.exceptions import BotoCoreError, ClientError

from lightmetrics.cli.options import config_options, configured_context, exit_for_error, json_option, state_machine_arn
from lightmetrics.cli.output import (
    EXIT_LEASE_HELD,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_VIOLATIONS,
    console,
    emit_json,
    fail,
    grid,
    kv_table,
    progress_lines,
)
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.clock import utc_text

STATE_MACHINE = "bootstrap-walk"
_SUMMARY_FIELDS = ("scope", "epoch", "status", "started_at_ns", "updated_at_ns", "executions", "resumes", "execution",
                   "partitions_found", "partitions_done", "enumeration_complete", "in_progress", "keys",
                   "keys_accepted", "keys_quarantine", "keys_present", "keys_reaped", "pages", "repairs", "outcomes",
                   "keys_per_s", "eta_s", "watermark_ns", "watermark_withheld", "error")


def _duration(seconds: Any) -> str | None:
    if seconds is None:
        return None
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _control(settings: Settings, as_json: bool):  # type: ignore[no-untyped-def]
    from lightmetrics.composition.services import aws_session, executions
    from lightmetrics.derived.walk import WalkControl

    arn = state_machine_arn(settings, STATE_MACHINE, "BootstrapWalkArn", as_json=as_json)
    return WalkControl(configured_context(settings, as_json=as_json), executions(aws_session().client("stepfunctions")), arn)


@click.group()
def walk() -> None:
    """Bootstrap walks: complete, resumable reconciliation of accepted/v1/ and quarantine/v1/."""


def _summary_rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    outcomes = summary.get("outcomes") or {}
    return [
        ("scope", summary.get("scope")),
        ("epoch", summary.get("epoch")),
        ("status", summary.get("status")),
        ("started", utc_text(summary.get("started_at_ns"))),
        ("executions", summary.get("executions")),
        ("resumes", summary.get("resumes")),
        ("partitions", f"{summary.get('partitions_done', 0)}/{summary.get('partitions_found', 0)}"
                       + ("" if summary.get("enumeration_complete") else " (still enumerating)")),
        ("in progress", ", ".join(summary.get("in_progress") or []) or "-"),
        ("keys walked", summary.get("keys")),
        ("pages", summary.get("pages")),
        ("repairs (DONE)", summary.get("repairs")),
        ("already complete (NOOP_RESOLVED)", outcomes.get("NOOP_RESOLVED")),
        ("  of which: index entry present", summary.get("keys_present")),
        ("  of which: hour reaped, not probed", summary.get("keys_reaped")),
        ("blocked", outcomes.get("BLOCKED")),
        ("skipped (operator)", outcomes.get("SKIPPED")),
        ("retry later (seen)", outcomes.get("RETRY_LATER")),
        ("keys/s", summary.get("keys_per_s")),
        ("ETA (estimate)", _duration(summary.get("eta_s"))),
        ("watermark set", utc_text(summary.get("watermark_ns")) or summary.get("watermark_withheld")),
        ("error", summary.get("error")),
    ]


def _follow(control: Any, started: Any, as_json: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if as_json:
        return control.follow(started, poll_s=0.25)
    with Progress(TextColumn("[bold]walk epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("partitions · {task.fields[keys]} keys · {task.fields[repairs]} repairs · "
                             "{task.fields[rate]} keys/s · ETA {task.fields[eta]}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task("walk", total=None, epoch=started.epoch, keys=0, repairs=0, rate="-", eta="-")

        def update(summary: Any) -> None:  # a WalkSummary
            progress.update(task, total=summary.partitions_found if summary.enumeration_complete else None,
                            completed=summary.partitions_done, keys=summary.keys, repairs=summary.repairs,
                            rate=summary.keys_per_s or "-", eta=_duration(summary.eta_s) or "-")

        return control.follow(started, on_progress=update, poll_s=0.25)


@walk.command("start")
@click.option("--agent", default=None, help="Walk only this agent's partitions (never moves the watermark).")
@click.option("--resume", is_flag=True, help="Continue the last crashed, failed or stopped walk of this scope "
                                            "within its epoch (otherwise a new epoch starts from the beginning).")
@click.option("--full", is_flag=True, help="Repair every key in full (GET, HEAD, a PUT for each missing entry), "
                                          "not only keys whose accepted-by-time entry is missing: after derived "
                                          "entries were deleted behind the system's back (verify: missing-derived).")
@click.option("--wait", is_flag=True, help="Follow the walk with a progress bar; exit 1 if it failed.")
@click.option("--page-size", type=int, default=None, help="Keys per page (1-10000, default 1000).")
@click.option("--parallelism", type=int, default=None, help="Partitions walked at once (1-40, default 4).")
@click.option("--max-rounds", type=int, default=None,
              help="Rounds of pages per execution before it continues in a new one (capped by the history bound).")
@click.option("--lease-seconds", type=int, default=None, help="Walk lease duration, renewed every page (default 900).")
@config_options
@json_option
def walk_start(agent: str | None, resume: bool, full: bool, wait: bool, page_size: int | None, parallelism: int | None,
               max_rounds: int | None, lease_seconds: int | None, settings: Settings, as_json: bool) -> None:
    """Start a bootstrap walk execution (exit 5 if another walk holds the lease)."""
    from lightmetrics.derived.walk import InvalidWalkInput, LeaseHeld, NothingToResume, NothingToWalk

    control = _control(settings, as_json)
    try:
        started = control.start(agent=agent, resume=resume, full=full, page_size=page_size, parallelism=parallelism,
                                max_rounds=max_rounds, lease_seconds=lease_seconds)
    except LeaseHeld as exc:
        fail(f"not started: {exc}", EXIT_LEASE_HELD, as_json=as_json)
    except (InvalidWalkInput, NothingToResume, NothingToWalk) as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    except (ClientError, BotoCoreError, TimeoutError) as exc:
        exit_for_error(exc, "cannot start the walk", as_json=as_json, setting="LM_STATE_MACHINE_ARNS")
    info: dict[str, Any] = {"execution_arn": started.execution_arn, "epoch": started.epoch, "scope": started.scope,
                            "resumed": resume}
    if not wait:
        if as_json:
            emit_json({**info, "status": "running"})
        else:
            console.print(kv_table("walk started", info.items()))
            console.print("follow with: lmctl walk status")
        sys.exit(EXIT_OK)
    result = _follow(control, started, as_json)
    info.update(status=result.status, executions=result.executions, detail=result.detail, summary=result.summary_json())
    if as_json:
        emit_json(info)
    else:
        style = "green" if result.status == "finished" else "red"
        console.print(kv_table(f"[{style}]walk {result.status}[/]", _summary_rows(result.summary_json())))
        if result.detail:
            console.print(f"[red]{result.detail}[/]")
    sys.exit(EXIT_OK if result.status == "finished" else EXIT_VIOLATIONS)


@walk.command("status")
@click.option("--agent", default=None, help="Status of the walk scoped to this agent.")
@click.option("--follow", is_flag=True, help="Follow a running walk with a progress bar (exit 1 if it fails).")
@config_options
@json_option
def walk_status(agent: str | None, follow: bool, settings: Settings, as_json: bool) -> None:
    """The walk lease, the checkpoint (partitions, keys, repairs, keys/s, ETA) and the watermarks."""
    from lightmetrics.derived.walk import Started, read_watermarks

    control = _control(settings, as_json)
    try:
        lease = control.lease()
        cp = control.checkpoint(agent)
        watermarks = read_watermarks(control.table)
    except (ClientError, BotoCoreError) as exc:
        fail(f"cannot read the control table: {exc}", EXIT_UNAVAILABLE, as_json=as_json)
    now = control.ctx.clock.now_ns()
    live = lease is not None and lease.is_live(now)
    lease_info = {
        "held": live,
        "epoch": lease and lease.epoch,
        "scope": lease and lease.scope,
        "execution": lease and lease.execution,
        "expires": utc_text(lease.expires_at_ns) if lease is not None and live else None,
    }
    shown = cp.to_json() if cp else None
    summary = {k: shown.get(k) for k in _SUMMARY_FIELDS} if shown else None
    if follow and live and cp and lease is not None and lease.checkpoint_pk == cp.checkpoint_pk:
        started = Started(str(lease.execution), lease.epoch, str(lease.checkpoint_pk),
                          "all" if lease.scope is None else lease.scope)
        result = _follow(control, started, as_json)
        summary = result.summary_json()
        code = EXIT_OK if result.status == "finished" else EXIT_VIOLATIONS
    else:
        code = EXIT_OK
    info = {"lease": lease_info, "walk": summary,
            "watermarks": {k: {"w_ns": v, "w": utc_text(v)} for k, v in watermarks.items()}}
    if as_json:
        emit_json(info)
    else:
        console.print(kv_table("walk lease", lease_info.items()))
        if summary:
            console.print(kv_table("walk", _summary_rows(summary)))
        else:
            console.print("no walk has run for this scope")
        console.print(grid("completeness watermarks", ["index", "W"],
                           [(k, utc_text(v) or "(none yet)") for k, v in watermarks.items()]))
    sys.exit(code)


@click.command("verify")
@click.option("--strict", is_flag=True, help="Require every derived entry, not only those before the watermark "
                                             "(for a quiet system, e.g. right after a walk).")
@click.option("--max-listed", type=int, default=20, show_default=True, help="Violations printed per rule.")
@config_options
@json_option
def verify_cmd(strict: bool, max_listed: int, settings: Settings, as_json: bool) -> None:
    """Check every bucket-wide invariant; print each violation with its keys (exit 1 on any)."""
    from lightmetrics.operator_tools.verify import verify
    from lightmetrics.protocol.errors import LightmetricsError

    ctx = configured_context(settings, as_json=as_json)
    try:
        with progress_lines("verify") as say:
            report = verify(ctx, strict=strict, progress=say)
    except (LightmetricsError, ClientError, BotoCoreError) as exc:
        exit_for_error(exc, "cannot verify", as_json=as_json)
    if as_json:
        emit_json(report.to_json())
        sys.exit(EXIT_OK if report.ok else EXIT_VIOLATIONS)
    console.print(grid("objects per prefix", ["prefix", "#objects"], sorted(report.counts.items())))
    console.print(kv_table("checked", list(report.checked.items())
                           + [(f"expected: {k}", v) for k, v in sorted(report.expected.items())]
                           + [(f"pending ({k}, after W)", v) for k, v in sorted(report.pending.items())]))
    console.print(grid("completeness watermarks", ["index", "W"],
                       [(k, utc_text(v) or "(none yet)") for k, v in report.watermarks.items()]))
    shown: dict[str, int] = {}
    for v in report.violations:
        shown[v.rule] = shown.get(v.rule, 0) + 1
        if shown[v.rule] <= max_listed:
            console.print(f"[red]violation[/] {v.rule}: {v.detail}")
            for key in v.keys:
                console.print(f"    {key}")
    for rule, n in shown.items():
        if n > max_listed:
            console.print(f"[red]... and {n - max_listed} more {rule} violations (--json lists all)[/]")
    _print_pending(report.pending_findings, max_listed)
    for w in report.warnings[:max_listed]:
        console.print(f"[yellow]warning[/] {w.rule}: {w.detail}: {', '.join(w.keys)}")
    for a in report.acknowledged:
        console.print(f"[dim]acknowledged (blocker skipped)[/] {a.rule}: {a.detail}: {', '.join(a.keys)}")
    label = "[bold green]no violations[/]" if report.ok else f"[bold red]{len(report.violations)} violations[/]"
    console.print(f"{label}, {len(report.warnings)} warnings, {len(report.acknowledged)} acknowledged")
    sys.exit(EXIT_OK if report.ok else EXIT_VIOLATIONS)


def _print_pending(pending: list[Any], max_listed: int) -> None:
    """Each ``pending`` finding with its age, the oldest first: one that keeps growing old means
    the index's watermark is held back (docs/protocol.md §13 W6)."""
    for p in pending[:max_listed]:
        console.print(f"[cyan]pending {p.index}[/]: accepted {p.to_json()['accepted_at']}, "
                      f"{p.age_text()} old")
        for key in p.keys:
            console.print(f"    {key}")
    if len(pending) > max_listed:
        console.print(f"[cyan]... and {len(pending) - max_listed} more pending (--json lists all)[/]")
