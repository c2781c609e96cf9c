"""``lmctl env --stack NAME``: shell exports that point ``lmctl`` at a deployed stack.

Example::

    eval "$(lmctl env --stack Lightmetrics --region eu-west-1)"
    lmctl status
"""

from __future__ import annotations

import os
import shlex
import sys

import click

from lightmetrics.cli.output import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, emit_json, fail


@click.command("env")
@click.option("--stack", "stack_name", default=None, help="The CloudFormation stack's name (cdk deploy's stack).")
@click.option("--local", "local_port", type=int, default=None, is_flag=False, flag_value=4566,
              help="Instead of a stack: the local runtime `lmctl local up` runs on this port (default 4566).")
@click.option("--region", default=None, help="Its region (default: AWS_REGION, AWS_DEFAULT_REGION or the profile's).")
@click.option("--profile", default=None, help="The AWS profile to read it with, exported as AWS_PROFILE too.")
@click.option("--json", "as_json", is_flag=True, help="The settings as one JSON object instead of export lines.")
def env_cmd(stack_name: str | None, local_port: int | None, region: str | None, profile: str | None,
            as_json: bool) -> None:
    """Print `export` lines for every setting lmctl needs, read from the stack's outputs:
    eval "$(lmctl env --stack Lightmetrics)" configures this shell (exit 2 if the stack or one of
    its outputs is missing, 4 if AWS is unavailable); eval "$(lmctl env --local)" does the same
    for a running `lmctl local up`."""
    if (stack_name is None) == (local_port is None):
        fail("give --stack NAME (a deployed stack) or --local [PORT] (lmctl local up)", EXIT_USAGE, as_json=as_json)
    if local_port is not None:
        _local(local_port, as_json)
    from botocore.exceptions import BotoCoreError, ClientError

    from lightmetrics.composition.services import aws_session
    from lightmetrics.operator_tools.stack_outputs import MissingStackOutput, settings_from_outputs
    from lightmetrics.protocol.errors import ConfigError

    # `lmctl --profile P env` exported P as AWS_PROFILE: read with it, and export it again below
    profile = profile or os.environ.get("AWS_PROFILE") or None
    try:  # a missing or unknown profile, region or credentials: exit 2 naming what to set
        session = aws_session(profile_name=profile, region_name=region)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    try:
        stacks = session.client("cloudformation").describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ValidationError":  # CloudFormation's "does not exist"
            fail(f"no stack {stack_name!r} in {session.region_name}: {exc.response['Error'].get('Message', '')}",
                 EXIT_USAGE, as_json=as_json)
        fail(f"cannot read stack {stack_name!r}: {exc}", EXIT_UNAVAILABLE, as_json=as_json)
    except BotoCoreError as exc:
        fail(f"cannot read stack {stack_name!r}: {exc}", EXIT_UNAVAILABLE, as_json=as_json)
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}
    try:
        settings = settings_from_outputs(outputs)
    except MissingStackOutput as exc:
        fail(f"stack {stack_name!r}: {exc.args[0]}", EXIT_USAGE, as_json=as_json)
    env = {"AWS_REGION": session.region_name, "AWS_DEFAULT_REGION": session.region_name,
           **({"AWS_PROFILE": profile} if profile else {}), **settings}
    if as_json:
        emit_json(env)
    else:
        click.echo("\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()))
    sys.exit(EXIT_OK)


def _local(port: int, as_json: bool) -> None:
    from lightmetrics.local.environment import local_env_file

    path = local_env_file(port)
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("export ")]
    except FileNotFoundError:
        fail(f"no local runtime on port {port} ({path} is absent): start one with `lmctl local up --port {port}`",
             EXIT_USAGE, as_json=as_json)
    if as_json:
        emit_json({name: (shlex.split(value)[0] if value else "") for name, _, value in
                   (line.removeprefix("export ").partition("=") for line in lines)})
    else:
        click.echo("\n".join(lines))
    sys.exit(EXIT_OK)


__all__ = ["env_cmd"]
