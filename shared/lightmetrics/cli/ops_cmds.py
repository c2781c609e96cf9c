"""Operator commands on background work: ``blockers``, ``status``, ``reconcile``."""

from __future__ import annotations

import getpass
import os
import sys
from datetime import datetime, timezone
from typing import Any

import click

from lightmetrics.cli.options import config_options, exit_for_error, json_option
from lightmetrics.cli.output import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS, console, emit_json, fail, grid, kv_table
from lightmetrics.config import Settings


def _who() -> str:
    try:
        return os.environ.get("LM_OPERATOR") or getpass.getuser()
    except Exception:
        return "operator"


def _ts(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ") if ns else ""


def _ctx(settings: Settings, as_json: bool):  # type: ignore[no-untyped-def]
    from lightmetrics.services import work_context

    try:
        return work_context(settings)
    except Exception as exc:
        exit_for_error(exc, "cannot reach AWS", as_json=as_json)


@click.group()
def blockers() -> None:
    """Work that stopped: list it and decide (retry, resume, skip, redrive)."""


@blockers.command("list")
@click.option("--all", "show_all", is_flag=True, help="Also resumed, resolved and skipped blockers.")
@config_options
@json_option
def blockers_list(show_all: bool, settings: Settings, as_json: bool) -> None:
    """Open blockers (exit 1 if there are any, so scripts can gate on it)."""
    ctx = _ctx(settings, as_json)
    items = ctx.blockers.list(status=None if show_all else "open")
    open_count = sum(1 for b in items if b.status == "open")
    if as_json:
        emit_json({"blockers": [b.to_json() for b in items], "open": open_count})
    else:
        rows = [(b.status, b.kind, b.object_key, b.attempts, _ts(b.first_seen_ns), b.reason[:120]) for b in items]
        console.print(grid(f"blockers ({open_count} open)", ["status", "kind", "object", "#attempts", "first seen",
                                                             "reason"], rows))
        if items:
            console.print("act with: lmctl blockers retry|resume|skip WORK_KEY  (WORK_KEY = kind:object)")
    sys.exit(EXIT_VIOLATIONS if open_count else EXIT_OK)


def _act(fn_name: str, work_key: str, settings: Settings, as_json: bool, **kwargs: Any) -> None:
    from lightmetrics import blocker_actions
    from lightmetrics.blockers import BlockerNotFound

    ctx = _ctx(settings, as_json)
    try:
        result = getattr(blocker_actions, fn_name)(ctx, work_key, who=_who(), **kwargs)
    except BlockerNotFound:
        fail(f"no blocker {work_key!r}; see `lmctl blockers list`", EXIT_USAGE, as_json=as_json)
    except blocker_actions.ActionError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    if as_json:
        emit_json(result.to_json())
    else:
        console.print(kv_table(f"{result.action}: {result.status}", result.to_json().items()))
    sys.exit(EXIT_OK if result.status != "open" else EXIT_VIOLATIONS)


@blockers.command("retry")
@click.argument("work_key")
@config_options
@json_option
def blockers_retry(work_key: str, settings: Settings, as_json: bool) -> None:
    """Run the work now against live state; resolves the blocker on success (exit 1 if still failing)."""
    _act("retry", work_key, settings, as_json)


@blockers.command("resume")
@click.argument("work_key")
@config_options
@json_option
def blockers_resume(work_key: str, settings: Settings, as_json: bool) -> None:
    """Clear the blocker and its retry budget; the worker tries again (queued work is re-sent)."""
    _act("resume", work_key, settings, as_json)


@blockers.command("skip")
@click.argument("work_key")
@click.option("--reason", required=True, help="Why it is safe to skip (kept in the audit trail).")
@config_options
@json_option
def blockers_skip(work_key: str, reason: str, settings: Settings, as_json: bool) -> None:
    """Stop working on it; audited with who, when and why."""
    _act("skip", work_key, settings, as_json, reason=reason)


@blockers.command("redrive")
@config_options
@json_option
def blockers_redrive(settings: Settings, as_json: bool) -> None:
    """Send every open DLQ blocker's message back to its queue."""
    from lightmetrics.blocker_actions import redrive

    results = redrive(_ctx(settings, as_json), who=_who())
    if as_json:
        emit_json({"redriven": [r.to_json() for r in results]})
    else:
        console.print(grid("redriven", ["work key", "detail"], [(r.work_key, r.detail) for r in results]))


@click.command("status")
@config_options
@json_option
def status_cmd(settings: Settings, as_json: bool) -> None:
    """Queue and DLQ depths, reconciler checkpoint and lag, open blockers, completeness watermarks
    (exit 1 if anything is stuck)."""
    import boto3

    from lightmetrics.status import system_status

    ctx = _ctx(settings, as_json)
    try:
        info = system_status(ctx, settings, boto3.session.Session().client("sqs"))
    except Exception as exc:
        exit_for_error(exc, "cannot read status", as_json=as_json)
    stuck = not info.pop("ok")
    depths, open_blockers = info["queues"], info["open_blockers"]
    if as_json:
        emit_json({**info, "ok": not stuck})
    else:
        console.print(grid("queues", ["queue", "#messages"], depths.items()))
        console.print(kv_table("reconciler", info["reconciler"].items()))
        console.print(kv_table("completeness watermarks (W)", ((k, v or "(no clean full walk yet)")
                                                                for k, v in info["watermarks"].items())))
        console.print(f"open blockers: {open_blockers}")
        console.print(f"unresolved identity conflicts: {info['unresolved_conflicts']}  (lmctl conflicts list)")
    sys.exit(EXIT_VIOLATIONS if stuck else EXIT_OK)


@click.command("reconcile")
@config_options
@json_option
def reconcile_cmd(settings: Settings, as_json: bool) -> None:
    """Run one steady-state reconcile pass now (what the schedule runs)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from lightmetrics.errors import LightmetricsError
    from lightmetrics.reconcile import Reconciler
    from lightmetrics.services import queue_probe

    try:
        report = Reconciler(_ctx(settings, as_json), settings, queue_probe(settings)).run().to_json()
    except (LightmetricsError, ClientError, BotoCoreError) as exc:
        exit_for_error(exc, "cannot run the reconciler", as_json=as_json)
    if as_json:
        emit_json(report)
    else:
        console.print(kv_table("reconcile", report.items()))
    sys.exit(EXIT_VIOLATIONS if report["outcomes"].get("BLOCKED") else EXIT_OK)
