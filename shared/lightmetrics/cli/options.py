"""Shared click options: ``--json``, and the settings: one flag per configuration variable
(``lmctl --bucket B status`` ≡ ``LM_BUCKET=B lmctl status``) plus ``--profile``/``--region``, given
once on ``lmctl`` itself rather than repeated on every subcommand."""

from __future__ import annotations

import functools
import getpass
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import click

from lightmetrics.cli.output import EXIT_UNAVAILABLE, EXIT_USAGE, fail
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.errors import ConfigError, InvalidIdentityError, ResourceAccessError
from lightmetrics.protocol.identity import BatchIdentity

if TYPE_CHECKING:
    from lightmetrics.work.units import WorkContext

_CONFIG_FIELDS = list(Settings.model_fields)

#: ``ctx.meta`` key (shared by every context of one invocation): the command asked for ``--json``,
#: so an error caught above the command (:class:`lightmetrics.cli.main.Lmctl`) answers in JSON too.
AS_JSON_META = "lightmetrics.as_json"


def _remember_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta[AS_JSON_META] = value
    return value


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, callback=_remember_json,
                        help="Print one JSON document for machines.")(fn)


def output_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--output table|wide``: a table that fits 100 columns with short ids (default), or every
    column and identifier whole (``wide``; ``--json`` is always whole)."""
    return click.option("--output", "output", type=click.Choice(["table", "wide"]), default="table", show_default=True,
                        help="table: fits 100 columns, short ids the commands accept; wide: everything whole.")(fn)


def operator_name() -> str:
    """Who an operator's decision is recorded as: ``LM_OPERATOR``, else the login name."""
    try:
        return os.environ.get("LM_OPERATOR") or getpass.getuser()
    except Exception:  # no login name (a container without a passwd entry)
        return "operator"


#: AWS error codes that mean a configured resource does not exist or refuses us: retrying will not help
_CONFIGURATION_ERROR_CODES = frozenset({"ResourceNotFoundException", "StateMachineDoesNotExist", "InvalidArn",
                                        "AccessDeniedException", "AccessDenied"})


def _configuration_error_code(exc: BaseException) -> str | None:
    """The AWS error code of ``exc`` or of an error it was raised from (Powertools wraps the
    client's), when that code says a configured resource is missing or refuses us."""
    from botocore.exceptions import ClientError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ClientError):
            code = seen.response.get("Error", {}).get("Code", "")
            return code if code in _CONFIGURATION_ERROR_CODES else None
        seen = seen.__cause__ or seen.__context__
    return None


def exit_for_error(exc: BaseException, doing: str, *, as_json: bool, setting: str | None = None) -> NoReturn:
    """Exit for an error met while ``doing`` something with AWS: 2 naming the resource and its
    setting when a configured bucket, table or queue (or, given ``setting``, the resource that
    setting names) is missing or refuses us (retrying will not help), else 4 (unavailable: retry).

    Example: ``exit_for_error(exc, "cannot start the walk", as_json=False, setting="LM_STATE_MACHINE_ARNS")``.
    """
    from botocore.exceptions import NoCredentialsError, NoRegionError, PartialCredentialsError

    if isinstance(exc, (ResourceAccessError, ConfigError)):
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    if isinstance(exc, NoRegionError):
        fail("no AWS region: set AWS_REGION (or AWS_DEFAULT_REGION) to the stack's region", EXIT_USAGE,
             as_json=as_json)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        fail(f"AWS credentials: {exc}; set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", EXIT_USAGE,
             as_json=as_json)
    if setting is not None and _configuration_error_code(exc) is not None:
        fail(f"{doing}: {exc}; check {setting}, which names it (the stack's outputs: `lmctl env --stack`)",
             EXIT_USAGE, as_json=as_json)
    fail(f"{doing}: {exc}", EXIT_UNAVAILABLE, as_json=as_json)


def configured_context(settings: Settings, *, as_json: bool, component: str = "cli") -> WorkContext:
    """The work context of the configured system, or exit as :func:`exit_for_error` says (2 naming
    the setting of a missing bucket, table or queue; 4 when AWS cannot be reached).

    Example: ``ctx = configured_context(settings, as_json=as_json)`` at the top of a command.
    """
    from lightmetrics.composition.services import work_context

    try:
        return work_context(settings, component=component)
    except Exception as exc:
        exit_for_error(exc, "cannot reach AWS", as_json=as_json)


def state_machine_arn(settings: Settings, name: str, stack_output: str, *, as_json: bool) -> str:
    """The configured ARN of state machine ``name``, or exit 2 saying which setting names it and
    which stack output holds it.

    Example: ``state_machine_arn(settings, "reap", "ReapArn", as_json=False)``.
    """
    arn = settings.state_machine_arns.get(name)
    if not arn:
        fail(f"no ARN for {name!r}: set LM_STATE_MACHINE_ARNS (--state-machine-arns) to "
             f'{{"{name}": "<stack output {stack_output}>", ...}}', EXIT_USAGE, as_json=as_json)
    return arn


#: What a configured subcommand's help says of its settings (they are listed once, on ``lmctl``).
SETTINGS_HELP = "\n\n    Settings: LM_* variables, or lmctl's flags before the command (lmctl --help)."


def _setting_flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _export(*variables: str) -> Callable[[click.Context, click.Parameter, str | None], None]:
    """A callback that exports a given flag's value as environment variables of this process, so
    every reader sees it alike: settings, boto3, and a Lambda handler run by ``lmctl invoke``."""
    def export(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        for variable in variables if value is not None else ():
            os.environ[variable] = value  # type: ignore[assignment]
    return export


def settings_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add, to the ``lmctl`` group, ``--<setting>`` for every configuration variable and
    ``--profile``/``--region`` (exported as ``AWS_PROFILE``, ``AWS_REGION`` + ``AWS_DEFAULT_REGION``).

    Example: ``lmctl --region eu-west-1 --bucket lm-prod status``.
    """
    for name in reversed(_CONFIG_FIELDS):
        env, described = Settings.env_name(name), Settings.model_fields[name].description or ""
        fn = click.option(_setting_flag(name), name, default=None, expose_value=False, is_eager=True,
                          callback=_export(env), metavar="TEXT",
                          help=described if env in described else f"{env}: {described}")(fn)
    fn = click.option("--region", default=None, expose_value=False, is_eager=True,
                      callback=_export("AWS_REGION", "AWS_DEFAULT_REGION"),
                      help="AWS region of the stack [AWS_REGION].")(fn)
    return click.option("--profile", default=None, expose_value=False, is_eager=True,
                        callback=_export("AWS_PROFILE"), help="AWS profile to use [AWS_PROFILE].")(fn)


def config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The command receives ``settings: Settings``: the environment, which includes the settings
    given on ``lmctl`` itself (:func:`settings_options`).

    The same flags after the subcommand (``lmctl status --bucket B``, how earlier releases took
    them) are still accepted but not listed in the subcommand's help, and win over the group's.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        overrides = {name: kwargs.pop(f"cfg_{name}") for name in _CONFIG_FIELDS}
        try:
            kwargs["settings"] = Settings.from_env(**overrides)
        except ConfigError as exc:
            fail(str(exc), EXIT_USAGE, as_json=kwargs.get("as_json", False))
        return fn(*args, **kwargs)

    wrapper.__doc__ = (fn.__doc__ or "").rstrip() + SETTINGS_HELP
    for name in reversed(_CONFIG_FIELDS):
        wrapper = click.option(_setting_flag(name), f"cfg_{name}", default=None, hidden=True)(wrapper)
    return wrapper


def identity_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for name, kind in reversed((("agent-id", str), ("boot-id", str), ("seq-start", str), ("seq-end", str))):
        fn = click.option(f"--{name}", required=True, type=kind, help=f"Batch identity: {name}.")(fn)
    return fn


def identity_or_exit(agent_id: str, boot_id: str, seq_start: str, seq_end: str, as_json: bool) -> BatchIdentity:
    """The batch identity of :func:`identity_options`' values, or exit 2 saying what is wrong with it."""
    try:
        return BatchIdentity.create(agent_id, boot_id, seq_start, seq_end)
    except InvalidIdentityError as exc:
        fail(f"invalid identity: {exc}", EXIT_USAGE, as_json=as_json)
