"""``lmctl reap gc|retention|status``: reaps on Step Functions (docs/reaps.md).

``LM_STATE_MACHINE_ARNS`` names the ``reap`` state machine (stack output ``ReapArn``). A start is
a dry run unless ``--execute`` is given: the input always states ``dry_run`` explicitly. Exit 5
when another reap holds the lease, 1 when the execution failed.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

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
    kv_table,
    progress_lines,
)
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.clock import utc_text
from lightmetrics.protocol.keys import KeyKind, layout_root

if TYPE_CHECKING:
    from lightmetrics.reaps.report import ReapReport

STATE_MACHINE = "reap"


def _control(settings: Settings, as_json: bool):  # type: ignore[no-untyped-def]
    from lightmetrics.composition.services import aws_session, executions
    from lightmetrics.reaps import ReapControl

    arn = state_machine_arn(settings, STATE_MACHINE, "ReapArn", as_json=as_json)
    return ReapControl(configured_context(settings, as_json=as_json), executions(aws_session().client("stepfunctions")), arn)


def report_rows(report: ReapReport) -> list[tuple[str, Any]]:
    rows = [
        ("mode", report.mode), ("dry run", report.dry_run), ("epoch", report.epoch),
        ("status", report.status), ("phase", report.phase.value), ("started", utc_text(report.started_at_ns)),
        ("examined", report.examined), ("deletable (proven)", report.deletable),
        ("marked", report.marked), ("purged", report.purged), ("restored", report.restored),
        ("kept", ", ".join(f"{k}: {v}" for k, v in sorted(report.kept.items())) or "-"),
    ]
    if report.would_settle:  # rule DR1: a dry run leaves a failed reap's marks as they are
        rows.append(("would settle", f"{report.would_settle} (blobs a failed reap marked; the next reap "
                                     "run with --execute settles them)"))
    if report.mode == "retention":
        rows += [("hours", ", ".join(report.hours) or "-"),
                 ("hours reaped", ", ".join(report.hours_reaped) or "-"),
                 ("hours skipped", ", ".join(f"{h} ({why})" for h, why in report.hours_skipped.items()) or "-")]
    if report.mode == "gc":
        rows.append(("source", report.source + (f" (run {report.audit_run})" if report.audit_run else "")
                     if report.source else "-"))
    if report.note:
        rows.append(("note", report.note))
    if report.error:
        rows.append(("error", report.error))
    return rows


@click.group()
def reap() -> None:
    """Reaps: GC of orphan raw blobs, retention of expired hours (Step Functions)."""


def _start(mode: str, hour: str | None, execute: bool, wait: bool, source: str | None, audit_run: str | None,
           tombstone_wait_s: int | None, settings: Settings, as_json: bool, *, scope: str | None = None) -> None:
    from lightmetrics.reaps import InvalidReapInput, LeaseHeld

    control = _control(settings, as_json)
    inp: dict[str, Any] = {"mode": mode, "dry_run": not execute, "hour": hour}
    if source:
        inp["source"] = source
    if audit_run:
        inp["audit_run"] = audit_run
    if scope:
        inp["scope"] = scope
    if tombstone_wait_s is not None:
        inp["tombstone_wait_s"] = tombstone_wait_s
    try:
        arn = control.start(**inp)
    except LeaseHeld as exc:
        fail(f"not started: {exc}", EXIT_LEASE_HELD, as_json=as_json)
    except InvalidReapInput as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    except (ClientError, BotoCoreError, TimeoutError) as exc:
        exit_for_error(exc, "cannot start the reap", as_json=as_json, setting="LM_STATE_MACHINE_ARNS")
    info: dict[str, Any] = {"execution_arn": arn, "mode": mode, "dry_run": not execute}
    if not wait:
        if as_json:
            emit_json({**info, "status": "running"})
        else:
            console.print(kv_table("reap started", info.items()))
            console.print("follow with: lmctl reap status --follow")
        sys.exit(EXIT_OK)
    _follow(control, arn, info, as_json)


def _follow(control: Any, arn: str, info: dict[str, Any], as_json: bool) -> None:
    """Follow execution ``arn`` to its end, print its report, exit 0 if it finished, else 1."""
    with progress_lines("reap") as say:
        result = control.follow(arn, on_progress=lambda r: say(
            f"{r.phase.value or r.status}: {r.pages} pages, examined {r.examined}, marked {r.marked}, "
            f"purged {r.purged}" + (f", hours reaped {len(r.hours_reaped)} of {len(r.hours)}"
                                    if r.mode == "retention" else "")))
    info.update(status=result.status, detail=result.detail, report=result.report.to_json() if result.report else {})
    if as_json:
        emit_json(info)
    else:
        style = "green" if result.status == "finished" else "red"
        console.print(kv_table(f"[{style}]reap {result.status}[/]",
                               report_rows(result.report) if result.report else [("report", "no reap checkpoint")]))
        if result.detail:
            console.print(f"[red]{result.detail}[/]")
    sys.exit(EXIT_OK if result.status == "finished" else EXIT_VIOLATIONS)


def _mode_command(mode: str, doc: str):  # type: ignore[no-untyped-def]
    @reap.command(mode, help=doc)
    @click.option("--hour", default=None, help="Only this UTC hour, YYYY-MM-DDTHH (retention: the hour to reap; "
                                               "gc with --source by-time: the raw-blobs-by-time hour).")
    @click.option("--dry-run/--execute", "dry_run", default=True,
                  help="--dry-run (the default) proves and counts but deletes nothing; --execute deletes.")
    @click.option("--wait", is_flag=True, help="Follow the execution; print the final report; exit 1 if it failed.")
    @click.option("--source", type=click.Choice(["scan", "by-time", "audit"]), default=None,
                  help=f"gc candidates: a scan of {layout_root(KeyKind.RAW_BLOB)} (default), raw-blobs-by-time "
                       "hours past the horizon, or a Spark audit's orphan-blob-candidates (with --audit-run).")
    @click.option("--audit-run", default=None, help="gc --source audit: the audit run id (lmctl pipeline audit), or "
                                                    "'latest': the newest committed audit, proven once (the schedule's).")
    @click.option("--scope", type=click.Choice(["raw", "rollup"]), default=None,
                  help="retention: raw batches by LM_RETENTION_S (default) or rollups by LM_ROLLUP_RETENTION_S.")
    @click.option("--tombstone-wait-s", type=int, default=None,
                  help="retention: seconds between the tombstone and the first delete (default 120, longer than "
                       "the writers' tombstone cache).")
    @config_options
    @json_option
    def command(hour: str | None, dry_run: bool, wait: bool, source: str | None, audit_run: str | None,
                scope: str | None, tombstone_wait_s: int | None, settings: Settings, as_json: bool) -> None:
        _start(mode, hour, not dry_run, wait, source, audit_run, tombstone_wait_s, settings, as_json, scope=scope)

    return command


_mode_command("gc", "Collect orphan raw blobs: proof from authoritative reads, delete markers, purge after the "
                    "grace (exit 5 if another reap holds the lease).")
_mode_command("retention", "Reap hours older than LM_RETENTION_S (or --hour): tombstone, blobs, derived entries, "
                           "reaped marker. Acceptance records stay (exit 5 if another reap holds the lease).")


@reap.command("status")
@click.option("--follow", is_flag=True, help="Follow the running reap to its end and print its report (exit 1 if "
                                            "it failed); without a running reap, the last report.")
@config_options
@json_option
def reap_status(follow: bool, settings: Settings, as_json: bool) -> None:
    """The reap lease and the last reap's report (counts and reasons)."""
    control = _control(settings, as_json)
    try:
        lease = control.lease_live()
        report = control.checkpoint()
    except (ClientError, BotoCoreError) as exc:
        fail(f"cannot read the control table: {exc}", EXIT_UNAVAILABLE, as_json=as_json)
    lease_info = {"held": lease is not None, "epoch": lease and lease.epoch, "mode": lease and lease.scope,
                  "execution": lease and lease.execution, "expires": utc_text(lease and lease.expires_at_ns)}
    if follow and lease is not None and lease.execution:
        _follow(control, lease.execution, {"execution_arn": lease.execution, "mode": lease.scope,
                                           "lease": lease_info}, as_json)
    if as_json:
        emit_json({"lease": lease_info, "reap": report.to_json() if report else None})
    else:
        console.print(kv_table("reap lease", lease_info.items()))
        console.print(kv_table("last reap", report_rows(report)) if report else "no reap has run")
    sys.exit(EXIT_OK)
