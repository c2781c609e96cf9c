"""``lmctl local ...`` (the embedded runtime) and ``lmctl demo`` (the main job)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from lightmetrics.cli.options import config_options, json_option
from lightmetrics.cli.output import (
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VIOLATIONS,
    console,
    emit_json,
    fail,
    stdout_to_stderr,
    strict_json,
)
from lightmetrics.local.function_code import import_functions


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
@click.option("--reconcile-every", default=60.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds between reconciler runs (EventBridge schedule stand-in).")
@json_option
def local_up(port: int, bucket: str, table: str, prefix: str, reconcile_every: float, as_json: bool) -> None:
    """Run the whole system locally until Ctrl-C/SIGTERM.

    moto as AWS (S3, SQS, DynamoDB, Secrets Manager, Step Functions) on --port, the ingest endpoint
    on port + 1, the admin API on port + 2 (SigV4-signed requests only), the event pump feeding the
    indexers, and the reconciler and DLQ sweeper on a schedule. Prints `export ...` lines that
    point lmctl and any boto3 client here.
    """
    from lightmetrics.local.environment import local_env_file
    from lightmetrics.local.ingest_endpoint import IngestHTTPServer
    from lightmetrics.local.server import LocalRuntime, env_exports
    from lightmetrics.local.system import LocalSystem
    from lightmetrics.protocol.errors import ConfigError

    try:
        runtime = LocalRuntime(port=port).start()
    except OSError as exc:
        fail(f"cannot listen on port {port}: {exc}", EXIT_USAGE, as_json=as_json)
    ingest = admin = None
    system = LocalSystem(runtime, bucket=bucket, table=table, prefix=prefix)
    out = sys.stdout  # every line written here is a shell comment or an export (eval-safe), or the JSON
    try:
        try:
            system.provision()
        except ConfigError as exc:
            fail(str(exc), EXIT_USAGE, as_json=as_json)
        os.environ.update(system.environment())
        with stdout_to_stderr():  # the handlers' Powertools logs, now and while it runs: stderr
            import_functions()
            from functions.ingest.app import handler

            assert system.settings is not None
            ingest = IngestHTTPServer(system.hosted_as("ingest", handler), port=runtime.ingest_port,
                                      max_body_bytes=system.settings.max_frame_bytes).start()
            operator = system.operator_credentials()
            admin = _admin_server(system, runtime.port, operator).start()
            system.start(reconcile_every_s=reconcile_every, sweep_every_s=reconcile_every)
            values = {f"LM_{k.upper()}": v for k, v in system.setting_values().items()}
            # lmctl in the shell these configure runs as the operators' role (docs/deploy.md, "Operators")
            exports = env_exports(runtime, values | {"LM_INGEST_URL": ingest.url}, credentials=operator)
            env_file = local_env_file(runtime.port)  # `lmctl env --local` prints it while this runs
            env_file.parent.mkdir(parents=True, exist_ok=True)
            env_file.write_text("\n".join(exports) + "\n", encoding="utf-8")
            if as_json:
                emit_json({"endpoint_url": runtime.endpoint_url, "ingest_url": ingest.url, "admin_url": admin.url,
                           "exports": exports, **system.made}, file=out)
            else:
                click.echo("\n".join(up_lines(runtime.port, runtime.endpoint_url, ingest.url, admin.url, exports)),
                           file=out)
            out.flush()
            _wait_for_signal()
    finally:
        local_env_file(runtime.port).unlink(missing_ok=True)
        system.stop()
        if ingest is not None:
            ingest.stop()
        if admin is not None:
            admin.stop()
        runtime.stop()


def _admin_server(system: Any, port: int, operator: dict[str, str]) -> Any:
    """The admin API's stand-in: signed by the deployer's key or the operators' role's."""
    from functions.admin.app import handler as admin_handler
    from lightmetrics.local.admin_endpoint import ADMIN_PORT_OFFSET, admin_server, local_credentials

    signers = {**local_credentials(), **({operator["aws_access_key_id"]: operator["aws_secret_access_key"]}
                                         if operator else {})}
    return admin_server(system.hosted_as("admin", admin_handler), port=port + ADMIN_PORT_OFFSET, credentials=signers)


def up_lines(port: int, endpoint_url: str, ingest_url: str, admin_url: str, exports: list[str]) -> list[str]:
    """What ``lmctl local up`` prints: shell comments and ``export`` lines only, so its whole output
    can be eval'd (``lmctl local up > up.sh &``, then ``. up.sh``); ``lmctl env --local PORT`` prints
    the exports alone while it runs.

    >>> up_lines(4566, "http://127.0.0.1:4566", "http://127.0.0.1:4567", "http://127.0.0.1:4568", ["export A=1"])[1:3]
    ['# configure a shell: eval "$(lmctl env --local 4566)"  (or eval these lines)', 'export A=1']
    """
    return [f"# local runtime up: AWS at {endpoint_url}, ingest at {ingest_url}, admin (SigV4, service lambda) "
            f"at {admin_url}",
            f'# configure a shell: eval "$(lmctl env --local {port})"  (or eval these lines)',
            *exports,
            "# Ctrl-C stops it (state is in memory and is lost)."]


@local.command("drain")
@click.option("--timeout", "timeout_s", default=120.0, show_default=True, type=click.FloatRange(min=0))
@config_options
@json_option
def local_drain(timeout_s: float, settings: Any, as_json: bool) -> None:
    """Wait until every index queue and DLQ is empty and no Step Functions execution runs.

    Exit 0 when drained, 1 on timeout. Reads LM_QUEUE_URLS (printed by `lmctl local up`).
    """
    import boto3

    from lightmetrics.local.pump import drain, queue_depth

    session = boto3.session.Session()
    sqs, sfn = session.client("sqs"), session.client("stepfunctions")
    urls = list(settings.queue_urls.values())
    if not urls:
        fail("LM_QUEUE_URLS is empty: run the exports printed by `lmctl local up`", EXIT_USAGE, as_json=as_json)
    try:
        # the state machines it names: an operator lists their executions, not every machine's
        ok = drain(sqs, urls, sfn=sfn, timeout_s=timeout_s, machines=list(settings.state_machine_arns.values()) or None)
        depths = {name: queue_depth(sqs, url) for name, url in sorted(settings.queue_urls.items())}
    except Exception as exc:
        fail(f"cannot reach the local runtime: {exc}", 4, as_json=as_json)
    if as_json:
        emit_json({"drained": ok, "queues": depths})
    else:
        console.print("drained" if ok else f"[red]not drained after {timeout_s:.0f} s[/]: {depths}")
    sys.exit(EXIT_OK if ok else EXIT_VIOLATIONS)


@local.command("collector", hidden=False)
@click.option("--port", required=True, type=click.IntRange(0, 65535), help="Port of this collector's ingest endpoint.")
@click.option("--ready-file", default=None, help="Write the bound port here once serving.")
def local_collector(port: int, ready_file: str | None) -> None:
    """Serve the ingest function over HTTP in this process (a collector), against AWS_ENDPOINT_URL.

    Configured entirely by LM_* variables, like the Lambda. Used by the demo's collector processes.
    """
    from lightmetrics.deployment.settings import Settings
    from lightmetrics.local.hosting import install_from_env
    from lightmetrics.local.ingest_endpoint import IngestHTTPServer
    from lightmetrics.protocol.errors import ConfigError

    try:
        install_from_env()  # this process hosts the ingest function: LM_FAULTS etc. are read here
        settings = Settings.from_env()
    except (ConfigError, ValueError) as exc:
        fail(str(exc), EXIT_USAGE)
    import_functions()
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
    from lightmetrics.local.server import exit_served_process

    exit_served_process(EXIT_OK)  # the demo waits for its collectors to exit: no finalization to wait for


@click.command("demo")
@click.option(
    "--scale",
    type=click.Choice(["quick", "small", "full"]),
    default=None,
    help="quick: 250 batches (about a minute on 2 idle cores); small: 1,000; full: 3,000 (16 minutes). "
         "Default from LM_DEMO_SCALE, else quick.",
)
@click.option("--port", default=0, type=click.IntRange(0, 65530), help="moto's port (0 = any free port).")
@click.option("--report-json", "report_json", default=None, type=click.Path(dir_okay=False),
              help="Also write the report as one JSON document to this file (a CI artifact).")
@json_option
def demo_cmd(scale: str | None, port: int, report_json: str | None, as_json: bool) -> None:
    """The main job: collectors, agents, resends, a conflict and a killed collector, then a ledger check.

    Exit 0 when every acknowledged batch has its manifest (same hash) and blob; 1 otherwise.
    """
    from lightmetrics.harness.demo import SCALES, run_demo

    scale = scale or os.environ.get("LM_DEMO_SCALE") or "quick"
    if scale not in SCALES:
        fail(f"LM_DEMO_SCALE must be one of {sorted(SCALES)}, got {scale!r}", EXIT_USAGE, as_json=as_json)
    from lightmetrics_pipeline.session import JavaMissing, require_java

    try:
        require_java()  # the pipeline phase needs it: say so before minutes of work, not after
    except JavaMissing as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    report = run_demo(SCALES[scale], port=port, show_progress=not as_json)
    if report_json:
        Path(report_json).write_text(json.dumps(strict_json(report.to_json()), sort_keys=True, default=str,
                                                allow_nan=False) + "\n", encoding="utf-8")
    if as_json:
        emit_json(report.to_json())
    else:
        report.print(console)
    sys.exit(EXIT_OK if report.ok else EXIT_VIOLATIONS)


__all__: list[Any] = ["local", "demo_cmd"]
