"""``lmctl agent run|enqueue|parked``: the agent client (:mod:`lightmetrics.client`) from a shell.

Exit codes of ``lmctl agent run`` (the README's exit-code numbering), first match wins:

* 2 — usage, unreadable token file or spool, or ingest rejected the token (401, or 403
  ``unauthorized``: the client stopped; nothing was deleted): fix the token;
* 4 — batches are still pending when ``--timeout`` ran out (every endpoint unavailable): retry;
* 3 — nothing is pending but identity conflicts are parked: an operator must resolve them
  (``lmctl conflicts``); the next run drops them once resolved ``accept_existing``;
* 2 — nothing is pending but batches are parked as denied (403 ``denied``; sent again once the
  denial is lifted) or invalid (400/413 ...), or spool files were set aside as unreadable:
  inspect ``lmctl agent parked``;
* 0 — the spool is empty.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from lightmetrics.cli.options import identity_options, json_option
from lightmetrics.cli.output import (
    EXIT_CONFLICT,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    console,
    emit_json,
    err_console,
    fail,
    grid,
    kv_table,
)


@click.group("agent")
def agent() -> None:
    """The agent client: a durable spool of encoded frames, sent to ingest with failover.

    See docs/agent-client.md. `lmctl agent-token` mints the token an agent uses.
    """


def exit_code_for(report: Any) -> int:
    """The exit code of a finished ``agent run`` (module docstring)."""
    if report.pending:
        return EXIT_UNAVAILABLE
    if report.parked_conflicts:
        return EXIT_CONFLICT
    if report.parked or report.unreadable:
        return EXIT_USAGE
    return EXIT_OK


def _read_token(path: str, as_json: bool) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read token file {path}: {exc}", EXIT_USAGE, as_json=as_json)
    if not token or any(c.isspace() for c in token):
        fail(f"token file {path} must hold one token (<key-id>.<64 hex>)", EXIT_USAGE, as_json=as_json)
    return token


@agent.command("run")
@click.option("--agent-id", required=True, help="The agent whose batches this client sends.")
@click.option("--token-file", required=True, type=click.Path(dir_okay=False), help="File holding the agent's token.")
@click.option("--spool", "spool_dir", required=True, type=click.Path(file_okay=False), help="Spool directory.")
@click.option("--endpoint", "endpoints", multiple=True, envvar="LM_INGEST_URL",
              help="Ingest URL; repeat for failover, tried in order (default LM_INGEST_URL).")
@click.option("--follow", is_flag=True, help="Keep watching the spool for new batches until SIGINT/SIGTERM.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=None,
              help="Give up after this many seconds (default: 300 without --follow, none with it).")
@click.option("--parked-retry-s", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="Cadence of retries of parked identity conflicts.")
@click.option("--retry-parked", is_flag=True,
              help="Retry every parked conflict and denial once now, whatever the cadence.")
@click.option("--request-timeout-s", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Per-request connect/read timeout.")
@click.option("--backoff-base-s", type=click.FloatRange(min=0), default=0.5, show_default=True)
@click.option("--backoff-max-s", type=click.FloatRange(min=0), default=30.0, show_default=True)
@json_option
def agent_run(agent_id: str, token_file: str, spool_dir: str, endpoints: tuple[str, ...], follow: bool,
              timeout_s: float | None, parked_retry_s: float, retry_parked: bool, request_timeout_s: float,
              backoff_base_s: float, backoff_max_s: float, as_json: bool) -> None:
    """Send the spool's batches to ingest until it is empty (or keep watching with --follow).

    200 deletes a batch; 409 identity_conflict, 403 denied (that boot only) and other 4xx park it
    under SPOOL/parked/ (an alert line on stderr) and later batches continue; files that are not
    valid batches are set aside under SPOOL/unreadable/; 503/429/5xx/timeouts fail over to the
    next endpoint with jittered exponential backoff; a rejected token (401, 403 unauthorized)
    stops the client.

    Exit 0 spool empty; 2 usage, bad token file, or a rejected token (nothing deleted), or only
    denied/invalid batches parked or unreadable files set aside; 3 identity conflicts parked
    (resolve with `lmctl conflicts`); 4 batches still pending at --timeout (endpoints
    unavailable: retry).
    """
    from lightmetrics.client import AgentClient, Alert, AuthRejected, BackoffPolicy, ClientError

    endpoint_list = [u for e in endpoints for u in e.replace(",", " ").split()]
    if not endpoint_list:
        fail("no endpoint: pass --endpoint URL (repeatable) or set LM_INGEST_URL", EXIT_USAGE, as_json=as_json)
    token = _read_token(token_file, as_json)

    def alert(a: Alert) -> None:
        err_console.print(f"[bold yellow]alert:[/] {a.message}")

    try:
        client = AgentClient(
            agent_id=agent_id, token=token, endpoints=endpoint_list, spool=spool_dir,
            backoff=BackoffPolicy(base_s=backoff_base_s, max_s=backoff_max_s), parked_retry_s=parked_retry_s,
            request_timeout_s=request_timeout_s, on_alert=alert,
        )
    except ClientError as exc:  # ClientConfigError, SpoolError
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    stop = threading.Event()
    if follow:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    if timeout_s is None and not follow:
        timeout_s = 300.0

    def progress(r: Any) -> None:
        if not as_json:
            err_console.print(f"pass {r.passes}: accepted {r.accepted}, duplicates {r.duplicates}, "
                              f"parked {r.newly_parked}, pending {r.pending}, failovers {r.failovers}")

    from lightmetrics.client import DrainReport

    report = DrainReport()
    try:
        with client:
            if retry_parked:
                report.merge(client.retry_parked())
            report.merge(client.drain(until_empty=not follow, timeout_s=timeout_s, stop=stop, on_progress=progress))
            parked = client.parked()
            unreadable = client.spool.unreadable()
    except AuthRejected as exc:
        fail(f"client stopped: {exc}", EXIT_USAGE, as_json=as_json)
    except ClientError as exc:
        fail(f"spool error: {exc}", EXIT_USAGE, as_json=as_json)
    code = exit_code_for(report)
    summary = {**report.to_json(), "agent_id": agent_id, "spool": spool_dir, "endpoints": endpoint_list,
               "parked_batches": [p.to_json() for p in parked],
               "unreadable_files": [u.to_json() for u in unreadable], "exit_code": code}
    if as_json:
        emit_json(summary)
    else:
        console.print(kv_table("agent run", [(k, v) for k, v in summary.items()
                                             if k not in ("parked_batches", "unreadable_files")]))
        _print_parked(parked, unreadable)
    sys.exit(code)


def _print_parked(parked: list[Any], unreadable: list[Any]) -> None:
    if parked:
        console.print(grid("parked batches", ["identity", "kind", "http", "resolution", "attempts", "frame_sha256"],
                           [(str(p.identity), p.kind, p.http_status, p.resolution, p.attempts, p.frame_sha256)
                            for p in parked]))
    if unreadable:
        console.print(grid("unreadable files (set aside)", ["original name", "reason", "bytes", "path"],
                           [(u.original_name, u.reason, u.frame_bytes, str(u.path)) for u in unreadable]))


@agent.command("enqueue")
@identity_options
@click.option("--frame", "frame_path", required=True, type=click.Path(dir_okay=False), help="Encoded frame file.")
@click.option("--spool", "spool_dir", required=True, type=click.Path(file_okay=False), help="Spool directory.")
@json_option
def agent_enqueue(agent_id: str, boot_id: str, seq_start: str, seq_end: str, frame_path: str, spool_dir: str,
                  as_json: bool) -> None:
    """Put one encoded frame (e.g. from `lmctl frame encode`) into a spool, byte for byte.

    Exit 0 spooled (or already spooled with the same bytes); 2 invalid identity or frame;
    3 the spool holds different bytes for this identity.
    """
    import hashlib

    from lightmetrics.client import Spool, SpoolConflictError, SpoolError
    from lightmetrics.protocol.errors import FrameError, InvalidIdentityError
    from lightmetrics.protocol.frame import validate_frame
    from lightmetrics.protocol.identity import BatchIdentity

    try:
        ident = BatchIdentity.create(agent_id, boot_id, seq_start, seq_end)
        data = Path(frame_path).read_bytes()
        validate_frame(data, ident)
        batch = Spool(spool_dir).put(ident, data)
    except (InvalidIdentityError, FrameError) as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    except OSError as exc:
        fail(f"cannot read {frame_path}: {exc}", EXIT_USAGE, as_json=as_json)
    except SpoolConflictError as exc:
        fail(str(exc), EXIT_CONFLICT, as_json=as_json)
    except SpoolError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    info = {"path": str(batch.path), "parked": batch.parked, "frame_bytes": len(data),
            "frame_sha256": hashlib.sha256(data).hexdigest()}
    emit_json(info) if as_json else console.print(kv_table("spooled", info.items()))


@agent.command("parked")
@click.option("--spool", "spool_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="Spool directory.")
@json_option
def agent_parked(spool_dir: str, as_json: bool) -> None:
    """List a spool's parked batches and set-aside unreadable files, with why (no network, no token).

    Exit 0 none parked or set aside; 3 identity conflicts parked; 2 only denied or invalid batches
    parked, or unreadable files set aside.
    """
    from lightmetrics.client import Spool, SpoolError

    try:
        spool = Spool(spool_dir)
        parked = spool.parked()
        unreadable = spool.unreadable()
        pending = len(spool.pending())
    except SpoolError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    conflicts = sum(1 for p in parked if p.kind == "identity_conflict")
    code = EXIT_CONFLICT if conflicts else (EXIT_USAGE if parked or unreadable else EXIT_OK)
    if as_json:
        emit_json({"pending": pending, "parked": [p.to_json() for p in parked],
                   "unreadable": [u.to_json() for u in unreadable], "exit_code": code})
    else:
        console.print(f"{pending} pending, {len(parked)} parked ({conflicts} identity conflicts), "
                      f"{len(unreadable)} unreadable files set aside")
        _print_parked(parked, unreadable)
    sys.exit(code)


__all__ = ["agent", "exit_code_for"]
