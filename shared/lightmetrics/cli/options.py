"""Shared click options: ``--json`` and one flag per configuration variable (``--bucket`` ≡ LM_BUCKET)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from lightmetrics.cli.output import EXIT_USAGE, fail
from lightmetrics.config import Settings
from lightmetrics.errors import ConfigError

_CONFIG_FIELDS = list(Settings.model_fields)


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document for machines.")(fn)


def config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--<field>`` for every setting; the command receives ``settings: Settings``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        overrides = {name: kwargs.pop(f"cfg_{name}") for name in _CONFIG_FIELDS}
        try:
            kwargs["settings"] = Settings.from_env(**overrides)
        except ConfigError as exc:
            fail(str(exc), EXIT_USAGE, as_json=kwargs.get("as_json", False))
        return fn(*args, **kwargs)

    for name in reversed(_CONFIG_FIELDS):
        field = Settings.model_fields[name]
        wrapper = click.option(
            f"--{name.replace('_', '-')}",
            f"cfg_{name}",
            default=None,
            help=field.description,
            show_envvar=False,
        )(wrapper)
    return wrapper


def identity_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for name, kind in reversed((("agent-id", str), ("boot-id", str), ("seq-start", str), ("seq-end", str))):
        fn = click.option(f"--{name}", required=True, type=kind, help=f"Batch identity: {name}.")(fn)
    return fn
