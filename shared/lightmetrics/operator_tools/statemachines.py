"""State machine definitions: one loader and one substitution for CDK and the local runtime.

The ASL of every :class:`~lightmetrics.deployment.resource_types.StateMachineSpec` lives in
``infra/statemachines/<definition>`` with ``${Placeholder}`` markers (docs/walks.md, docs/reaps.md). The spec's
``substitutions`` map each placeholder to a function of the resource spec; this module is the
only code that reads the files and resolves that map:

* the CDK stack calls :func:`definition_and_substitutions` with a resolver that returns each
  function's ARN token and hands both to CloudFormation's ``DefinitionSubstitutions``;
* the local provisioner calls :func:`render_definition` with a resolver that returns the local
  function ARN and creates the state machine in moto from the substituted text.

Both check that the placeholders in the file are exactly the spec's (no typo survives a synth).

Example:
    >>> from lightmetrics.deployment.resources import SPEC
    >>> text = render_definition(SPEC.state_machine("bootstrap-walk"), lambda fn: lambda_arn(fn))
    >>> "${" in text
    False
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from lightmetrics.deployment.resource_types import StateMachineSpec

__all__ = [
    "DEFINITIONS_ENV",
    "DefinitionError",
    "definition_and_substitutions",
    "definitions_dir",
    "lambda_arn",
    "load_definition",
    "placeholders",
    "render_definition",
    "substitute",
]

#: Override of the directory holding the ``*.asl.json`` files (default: the repository's).
DEFINITIONS_ENV = "LM_STATEMACHINES_DIR"
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

V = TypeVar("V")


class DefinitionError(ValueError):
    """A definition file is missing, not JSON, or its placeholders differ from the spec's."""


def definitions_dir() -> Path:
    """``infra/statemachines/`` of this checkout (or ``$LM_STATEMACHINES_DIR``)."""
    override = os.environ.get(DEFINITIONS_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[3] / "infra" / "statemachines"


def load_definition(spec: StateMachineSpec) -> str:
    """The raw ASL text (with placeholders); it must already be valid JSON."""
    path = definitions_dir() / spec.definition
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DefinitionError(f"state machine {spec.name!r}: cannot read {path}: {exc}") from None
    try:
        json.loads(text)
    except ValueError as exc:
        raise DefinitionError(f"{path} is not JSON: {exc}") from None
    return text


def placeholders(text: str) -> set[str]:
    """The ``${Name}`` markers in ``text``."""
    return set(_PLACEHOLDER.findall(text))


def definition_and_substitutions(
    spec: StateMachineSpec, resolve: Callable[[str], V]
) -> tuple[str, dict[str, V]]:
    """Raw ASL text and ``{placeholder: resolve(function name)}``, checked against each other."""
    text = load_definition(spec)
    found, declared = placeholders(text), set(spec.substitution_map())
    if found != declared:
        raise DefinitionError(
            f"{spec.definition}: placeholders {sorted(found)} differ from the spec's substitutions "
            f"{sorted(declared)} (missing in file: {sorted(declared - found)}, unknown: {sorted(found - declared)})"
        )
    return text, {placeholder: resolve(fn) for placeholder, fn in spec.substitutions}


def substitute(text: str, values: dict[str, str]) -> str:
    """Replace every ``${Name}`` by ``values[Name]``, as CloudFormation's DefinitionSubstitutions does."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def render_definition(spec: StateMachineSpec, resolve: Callable[[str], str]) -> str:
    """The ASL with every placeholder filled (what the local runtime creates)."""
    text, values = definition_and_substitutions(spec, resolve)
    rendered = substitute(text, values)
    json.loads(rendered)  # still JSON: values only ever land inside strings
    return rendered


def lambda_arn(function_name: str, *, region: str = "us-east-1", account: str = "123456789012") -> str:
    """``arn:aws:lambda:<region>:<account>:function:<name>`` (the local runtime's default account)."""
    return f"arn:aws:lambda:{region}:{account}:function:{function_name}"
