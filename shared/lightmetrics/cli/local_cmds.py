"""``lmctl local ...`` (the embedded runtime) and ``lmctl demo`` (the main job)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import click

from lightmetrics.cli.options import json_option
from lightmetrics.cli.output import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS, console, emit_json, fail


def _wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


@click.group()
def local() -> None:
    """The embedded local runtime: moto as AWS, in-process Lambda handlers, the ingest endpoint."""


@local.command("up")
@click.option("--port", default=4566, show_default=True, type=click.IntRange(0, 65534), help="moto's port.")
@click.option("--bucket", default="lightmetrics-local", show_default=True, help="LM_BUCKET to provision.")
@click.option("--table", default="lightmetrics-control", show_default=True, help="LM_TABLE to provision.")
@click.option("--prefix", default="", help="LM_PREFIX namespace.")
@json_option
def local_up(port: int, bucket: str, table: str, prefix: str, as_json: bool) -> None:
    """Run moto + the function host + the ingest endpoint (port + 1) until Ctrl-C/SIGTERM.

    Prints `export ...` lines that point the other lmctl commands and any boto3 client here.
    """
    from lightmetrics.config import Settings
    from lightmetrics.errors import ConfigError
    from lightmetrics.local.environment import local_environment
    from lightmetrics.local.provision import provision
    from lightmetrics.local.server import IngestHTTPServer, LocalRuntime, env_exports
    from lightmetrics.resources import SPEC

    try:
        settings = Settings.from_env({}, bucket=bucket, table=table, prefix=prefix)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    try:
        runtime = LocalRuntime(port=port).start()
    except OSError as exc:
        fail(f"cannot listen on port {port}: {exc}", EXIT_USAGE, as_json=as_json)
    ingest = None
    try:
        made = provision(
            runtime, SPEC, bucket=bucket, table=table, secret_name=settings.auth_secret_id, namespace=prefix
        )
        values = {"bucket": bucket, "table": table, "prefix": prefix, "auth_secret_id": settings.auth_secret_id}
        os.environ.update(local_environment(runtime.endpoint_url, values))
        from functions.ingest.app import handler

        ingest = IngestHTTPServer(handler, port=runtime.ingest_port, max_body_bytes=settings.max_frame_bytes).start()
        exports = env_exports(runtime, {f"LM_{k.upper()}": v for k, v in values.items()} | {"LM_INGEST_URL": ingest.url})
        if as_json:
            emit_json({"endpoint_url": runtime.endpoint_url, "ingest_url": ingest.url, "exports": exports, **made})
        else:
            console.print(f"[bold green]local runtime up[/]: AWS at {runtime.endpoint_url}, ingest at {ingest.url}")
            console.print("# configure a shell with:")
            click.echo("\n".join(exports))
            console.print("# Ctrl-C stops it (state is in memory and is lost).")
        sys.stdout.flush()
        _wait_for_signal()
    finally:
        if ingest is not None:
            ingest.stop()
        runtime.stop()


@local.command("collector", hidden=False)
@click.option("--port", required=True, type=click.IntRange(0, 65535), help="Port of this collector's ingest endpoint.")
@click.option("--ready-file", default=None, help="Write the bound port here once serving.")
def local_collector(port: int, ready_file: str | None) -> None:
    """Serve the ingest function over HTTP in this process (a collector), against AWS_ENDPOINT_URL.

    Configured entirely by LM_* variables, like the Lambda. Used by the demo's collector processes.
    """
    from lightmetrics.config import Settings
    from lightmetrics.errors import ConfigError
    from lightmetrics.local.server import IngestHTTPServer

    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    from functions.ingest.app import handler, service

    service()  # fail fast on configuration, before taking traffic
    server = IngestHTTPServer(handler, port=port, max_body_bytes=settings.max_frame_bytes).start()
    if ready_file:
        with open(ready_file, "w", encoding="utf-8") as fh:
            fh.write(str(server.port))
    try:
        _wait_for_signal()
    finally:
        server.stop()


@click.command("demo")
@click.option(
    "--scale",
    type=click.Choice(["small", "full"]),
    default=None,
    help="small: 1,000 batches (about a minute); full: 3,000. Default from LM_DEMO_SCALE, else full.",
)
@click.option("--port", default=0, type=click.IntRange(0, 65530), help="moto's port (0 = any free port).")
@json_option
def demo_cmd(scale: str | None, port: int, as_json: bool) -> None:
    """The main job: collectors, agents, resends, a conflict and a killed collector, then a ledger check.

    Exit 0 when every acknowledged batch has its manifest (same hash) and blob; 1 otherwise.
    """
    from lightmetrics.demo import SCALES, run_demo

    scale = scale or os.environ.get("LM_DEMO_SCALE") or "full"
    if scale not in SCALES:
        fail(f"LM_DEMO_SCALE must be one of {sorted(SCALES)}, got {scale!r}", EXIT_USAGE, as_json=as_json)
    report = run_demo(SCALES[scale], port=port, show_progress=not as_json)
    if as_json:
        emit_json(report.to_json())
    else:
        report.print(console)
    sys.exit(EXIT_OK if report.ok else EXIT_VIOLATIONS)


__all__: list[Any] = ["local", "demo_cmd"]
