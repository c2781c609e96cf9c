"""lmctl — the operator CLI. Every command has ``--json``; exit codes are in :mod:`.output`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from lightmetrics.cli.options import (
    AS_JSON_META,
    config_options,
    exit_for_error,
    identity_options,
    identity_or_exit,
    json_option,
    settings_options,
)
from lightmetrics.cli.output import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_VIOLATIONS,
    console,
    emit_json,
    err_console,
    fail,
    kv_table,
    stdout_to_stderr,
)
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.errors import (
    ConfigError,
    InvalidIdentityError,
    LightmetricsError,
    ResourceAccessError,
)


class Lmctl(click.Group):
    """The top-level group: a configured bucket, table or queue that does not exist or refuses us
    exits 2 naming it and its setting, whichever command met it (never a traceback, never "empty")."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ResourceAccessError as exc:
            fail(str(exc), EXIT_USAGE, as_json=bool(ctx.meta.get(AS_JSON_META)))


@click.group(cls=Lmctl, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="lightmetrics-ingest")
@settings_options
def cli() -> None:
    """Operate the Lightmetrics acceptance plane (AWS or the embedded local runtime).

    Configuration comes from LM_* variables or the matching flags given before the command
    (lmctl --bucket B status = LM_BUCKET=B lmctl status); `lmctl env` prints the exports.
    AWS_ENDPOINT_URL points every AWS call at the local runtime.
    Exit codes: 0 ok, 1 violations/failed, 2 invalid input or configuration (also a configured
    bucket, table or queue that does not exist or refuses access), 3 identity conflict,
    4 unavailable (retry), 5 lease held by another run.
    """


# -------------------------------------------------------------------------------------- accept
@cli.command("accept")
@identity_options
@click.option("--frame", "frame_path", required=True, type=click.Path(dir_okay=False), help="Frame file.")
@config_options
@json_option
def accept_cmd(agent_id, boot_id, seq_start, seq_end, frame_path, settings: Settings, as_json) -> None:  # type: ignore[no-untyped-def]
    """Run the accept algorithm for one frame directly against S3 (no HTTP, no token).

    Exit 0 accepted or duplicate, 2 invalid, 3 identity conflict, 4 unavailable.
    """
    from lightmetrics.acceptance.accept import accept_batch
    from lightmetrics.aws.request_counter import RequestCounter
    from lightmetrics.composition.services import accept_context

    ident = identity_or_exit(agent_id, boot_id, seq_start, seq_end, as_json)
    try:
        data = Path(frame_path).read_bytes()
    except OSError as exc:
        fail(f"cannot read {frame_path}: {exc}", EXIT_USAGE, as_json=as_json)
    counter = RequestCounter()
    ctx = accept_context(settings, counter=counter)
    with counter.operation("accept") as op:
        result = accept_batch(ctx, ident, data)
    if as_json:
        emit_json(result.to_json())
    else:
        rows = list(result.to_json().items()) + [("s3_requests", op.total)]
        style = "green" if result.exit_code == 0 else "red"
        console.print(kv_table(f"[{style}]{result.status.value}[/]", rows))
    sys.exit(result.exit_code)


# ---------------------------------------------------------------------------------------- show
@cli.command("show")
@identity_options
@config_options
@json_option
def show_cmd(agent_id, boot_id, seq_start, seq_end, settings: Settings, as_json) -> None:  # type: ignore[no-untyped-def]
    """Show one identity: its acceptance record, blob state, frame summary and conflicts.

    Exit 0 if accepted, 1 if no acceptance record exists, 4 if S3 is unavailable.
    """
    from lightmetrics.composition.services import accept_context
    from lightmetrics.operator_tools.identity_view import describe_identity

    ident = identity_or_exit(agent_id, boot_id, seq_start, seq_end, as_json)
    ctx = accept_context(settings)
    try:
        info = describe_identity(ctx.store, ctx.codec, ident)
    except LightmetricsError as exc:
        fail(f"S3 unavailable: {exc}", EXIT_UNAVAILABLE, as_json=as_json)
    code = EXIT_OK if info["accepted"] else EXIT_VIOLATIONS
    if as_json:
        emit_json(info)
    else:
        manifest = info.get("manifest") or {}
        rows: list[tuple[str, Any]] = [("identity", str(ident)), ("manifest_key", info["manifest_key"])]
        rows += [("accepted", info["accepted"])] + [(f"manifest.{k}", v) for k, v in manifest.items()]
        rows += [(f"blob.{k}", v) for k, v in (info.get("blob") or {}).items()]
        rows += [(f"frame.{k}", v) for k, v in (info.get("frame") or {}).items()]
        rows += [("conflicts", len(info["conflicts"]))]
        console.print(kv_table("identity", rows))
    sys.exit(code)


# --------------------------------------------------------------------------------- agent-token
@cli.command("agent-token")
@click.option("--agent-id", required=True, help="The agent the token is for.")
@click.option("--key-id", default=None, help="Mint with this active key instead of the current one.")
@config_options
@json_option
def agent_token_cmd(agent_id: str, key_id: str | None, settings: Settings, as_json: bool) -> None:
    """Print an ingest token for an agent, minted with the current key of the token secret."""
    from lightmetrics.acceptance.auth import mint_token
    from lightmetrics.composition.services import token_keys
    from lightmetrics.protocol.identity import validate_id

    try:
        validate_id(agent_id, "agent_id")
    except InvalidIdentityError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    try:
        keys = token_keys(settings).get()
    except LightmetricsError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    except Exception as exc:  # a missing secret: exit 2 naming LM_AUTH_SECRET_ID; unreachable: 4
        exit_for_error(exc, f"cannot read secret {settings.auth_secret_id}", as_json=as_json,
                       setting="LM_AUTH_SECRET_ID")
    try:
        token = mint_token(keys, agent_id, key_id)
    except LightmetricsError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    if as_json:
        emit_json({"agent_id": agent_id, "key_id": key_id or keys.current, "token": token})
    else:
        click.echo(token)


# -------------------------------------------------------------------------------------- invoke
@cli.command("invoke")
@click.argument("function")
@click.option("--event", "event_path", required=True, type=click.Path(dir_okay=False), help="Event JSON file.")
@json_option
def invoke_cmd(function: str, event_path: str, as_json: bool) -> None:
    """Run one Lambda handler in-process with a sample event (see events/). FUNCTION is a
    function's name (index-accepted) or its folder under functions/ (index_accepted). Against the
    local runtime it runs as the function's role, IAM enforced, as deployed."""
    from lightmetrics.deployment.resources import SPEC
    from lightmetrics.local.function_host import LambdaContext

    by_folder = {f.module.split(".")[-2]: f for f in SPEC.functions if f.module.startswith("functions.")}
    try:
        spec = by_folder[function] if function in by_folder else SPEC.function(function)
    except (KeyError, ValueError):
        fail(f"unknown function {function!r}; known: {', '.join(f.name for f in SPEC.functions)} "
             f"(or their folders under functions/)", as_json=as_json)
    try:
        event = json.loads(Path(event_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"cannot read event {event_path}: {exc}", EXIT_USAGE, as_json=as_json)
    from lightmetrics.local.function_code import import_handler_module

    system = _configured_context()  # one context for the looks before and after the run
    absent = _absent_objects(system, event)
    if absent:  # said before the run: the handler will not find them, and records that as a blocker
        err_console.print(f"note: this event names {len(absent)} object(s) the configured bucket does not hold "
                          f"({', '.join(absent)}): the handler will report each as an invariant violation and "
                          f"open a blocker for it — on a deployed stack that raises the InvariantViolation alarm "
                          f"(a sample event names the objects of the sample bucket)", markup=False)
    blockers_before = _open_blockers(system)
    failure: LightmetricsError | None = None
    # Import and call under the redirect: the module's Powertools Logger binds stdout when built.
    with stdout_to_stderr(), _as_function_role(spec):
        handler = getattr(import_handler_module(spec.module), spec.attr)
        try:
            result = handler(event, LambdaContext(function))
        except LightmetricsError as exc:
            failure = exc
    if failure is not None:  # configuration is the operator's to fix (2); anything else failed the run (1)
        fail(f"{function} failed: {failure}", EXIT_USAGE if isinstance(failure, ConfigError) else EXIT_VIOLATIONS,
             as_json=as_json)
    opened = sorted((_open_blockers(system) or set()) - (blockers_before or set()))
    if opened:  # a sample event names objects a live bucket may not hold: say what it left behind
        err_console.print(f"note: this event opened {len(opened)} blocker(s) in the configured control table: "
                          f"{', '.join(opened)} (lmctl blockers list; lmctl blockers skip WORK_KEY --reason ...)",
                          markup=False)
    if isinstance(result, dict) and result.get("statusCode") == 401 and "ingest" in Path(event_path).parts:
        err_console.print("note: the sample ingest events carry tokens signed with the keys of "
                          "events/ingest/secret.json; to replay them, put that JSON (without _comment) in the "
                          "configured LM_AUTH_SECRET_ID secret, or mint a token with lmctl agent-token", markup=False)
    emit_json(result) if as_json else console.print_json(json.dumps(result, default=str))


def _as_function_role(spec: Any) -> Any:
    """Pointed at the local runtime, the function's code signs as its role (assumed with the deployer's
    key, as Lambda would), whatever the shell's credentials: IAM enforced, as deployed. Elsewhere, or on
    a system without roles, the caller's credentials."""
    from contextlib import nullcontext
    from dataclasses import replace

    from lightmetrics.local.principals import local_role_credentials
    from lightmetrics.operator_tools.policies import function_principal
    from lightmetrics.protocol.hosting import current, hosted

    try:
        queue_urls = Settings.from_env().queue_urls
    except Exception:  # no configured system: nothing to assume
        return nullcontext()
    credentials = local_role_credentials(function_principal(spec), queue_urls)
    return hosted(replace(current(), aws_credentials=credentials)) if credentials else nullcontext()


def _configured_context() -> Any:
    """The work context of the configured system, or None when none is configured (``lmctl
    invoke`` without a runtime: nothing to look at before or after the run)."""
    try:
        from lightmetrics.composition.services import work_context

        return work_context(Settings.from_env(), component="cli")
    except Exception:
        return None


def _absent_objects(ctx: Any, event: Any) -> list[str]:
    """The S3 objects an SQS-wrapped S3 notification event names that the configured bucket does
    not hold (HEAD each); [] for any other event, or when no bucket is configured or reachable."""
    records = event.get("Records") if isinstance(event, dict) else None
    if ctx is None or not isinstance(records, list) or not all(isinstance(r, dict) and "body" in r for r in records):
        return []
    try:
        from lightmetrics.derived.event_path import parse_notification

        named = [o for r in records for o in (parse_notification(r["body"]) or [])]
        return [f"s3://{o.bucket}/{o.key}" for o in named
                if o.bucket != ctx.store.bucket or ctx.store.head(o.key) is None]
    except Exception:  # unreachable, or not a notification: nothing to say before the run
        return []


def _open_blockers(ctx: Any) -> set[str] | None:
    """The open blockers' work keys of the configured system, or None when there is none or it
    cannot be read."""
    try:
        return {b.work_key for b in ctx.blockers.list()} if ctx is not None else None
    except Exception:
        return None


# ------------------------------------------------------------------- the other command groups
# Imported after ``cli`` exists; each module holds one concern's commands.
import lightmetrics.cli.bench_cmds  # noqa: E402,F401  (adds accept|indexing|walk|cost-table to `bench`)
from lightmetrics.cli.agent_cmds import agent  # noqa: E402
from lightmetrics.cli.conflict_cmds import conflicts, denylist_cmd  # noqa: E402
from lightmetrics.cli.cost_cmds import cost_cmd  # noqa: E402
from lightmetrics.cli.env_cmds import env_cmd  # noqa: E402
from lightmetrics.cli.frame_cmds import frame  # noqa: E402
from lightmetrics.cli.local_cmds import demo_cmd, local  # noqa: E402
from lightmetrics.cli.ops_cmds import blockers, reconcile_cmd, status_cmd  # noqa: E402
from lightmetrics.cli.pipeline_cmds import bench, inventory, pipeline, query_cmd  # noqa: E402
from lightmetrics.cli.reap_cmds import reap  # noqa: E402
from lightmetrics.cli.sim_cmds import sim_cmd  # noqa: E402
from lightmetrics.cli.soak_cmds import soak_cmd  # noqa: E402
from lightmetrics.cli.walk_cmds import verify_cmd, walk  # noqa: E402

for command in (frame, local, demo_cmd, soak_cmd, sim_cmd, blockers, status_cmd, reconcile_cmd, walk, verify_cmd, reap, conflicts,
                denylist_cmd, agent, inventory, pipeline, query_cmd, bench, cost_cmd, env_cmd):
    cli.add_command(command)


def main(args: list[str] | None = None) -> None:
    """Run lmctl; a usage error under ``--json`` answers the same error document :func:`fail`
    prints (exit 2), otherwise click's usage text on stderr."""
    argv = sys.argv[1:] if args is None else args
    as_json = "--json" in argv[:argv.index("--")] if "--" in argv else "--json" in argv
    try:
        code = cli.main(args=argv, prog_name="lmctl", standalone_mode=False)
    except click.ClickException as exc:  # a usage error (exit 2), a file argument that cannot be opened
        if not as_json:
            exc.show()
            sys.exit(exc.exit_code)
        ctx = getattr(exc, "ctx", None)
        fail(exc.format_message() + (f" (see `{ctx.command_path} --help`)" if ctx is not None else ""),
             exc.exit_code, as_json=True)
    except click.Abort:  # Ctrl-C, or the end of input at a prompt
        if as_json:
            fail("aborted", EXIT_VIOLATIONS, as_json=True)
        err_console.print("Aborted!", markup=False)
        sys.exit(EXIT_VIOLATIONS)
    # click returns a command's return value, or the code of click.exceptions.Exit (--help, --version)
    sys.exit(code if type(code) is int else EXIT_OK)


if __name__ == "__main__":
    main()
