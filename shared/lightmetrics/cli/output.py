"""How lmctl speaks: human tables by default, one JSON document with ``--json``.

Exit codes (README, "Exit codes"), the same for every command:

=====  =====================================================
0      ok
1      violations found, or an execution failed
2      invalid input or usage (also invalid configuration)
3      identity conflict
4      unavailable: retry later
5      a lease is held by another run
=====  =====================================================
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

EXIT_OK, EXIT_VIOLATIONS, EXIT_USAGE, EXIT_CONFLICT, EXIT_UNAVAILABLE, EXIT_LEASE_HELD = 0, 1, 2, 3, 4, 5

#: Width when stdout is not a terminal (a pipe, a file, a script): wide enough that no identifier,
#: key or path is ever wrapped or cut; a terminal gets its own width, and cells fold there.
PIPE_WIDTH = 100_000
console = Console(highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def strict_json(data: Any) -> Any:
    """``data`` with every non-finite float (NaN, ±Infinity, which JSON has no spelling for) as None.

    >>> strict_json({"lag": float("inf"), "v": [1.5, float("nan")]})
    {'lag': None, 'v': [1.5, None]}
    """
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: strict_json(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [strict_json(v) for v in data]
    return data


def emit_json(data: Any, file: Any = None) -> None:
    """One strict JSON document on stdout, or ``file`` (RFC 8259: no NaN or Infinity; see :func:`strict_json`)."""
    click.echo(json.dumps(strict_json(data), indent=2, sort_keys=True, default=str, allow_nan=False), file=file)


@contextmanager
def progress_lines(what: str) -> Iterator[Callable[[str], None]]:
    """A callable that reports the phases of long work on stderr (stdout stays the result, and one
    JSON document under ``--json``): a spinner with the phase on a terminal, one timestamped line
    per phase otherwise.

    >>> with progress_lines("verify") as say:                      # doctest: +SKIP
    ...     say("listing 9 prefixes")
    """
    started = time.monotonic()
    if err_console.is_terminal:
        with err_console.status(f"{what}: starting") as status:
            yield lambda phase: status.update(f"{what}: {phase} ({time.monotonic() - started:.0f} s)")
        return

    def line(phase: str) -> None:
        err_console.print(f"{what}: {phase} ({time.monotonic() - started:.1f} s)", markup=False)

    yield line


def cell_text(value: Any) -> str:
    """How one value reads in a human table: text and numbers as they are, anything else (a list,
    dict, tuple, boolean or None) as JSON, never Python's repr.

    >>> [cell_text(v) for v in ("k/1", 3, ["cpu.usage"], {"accepted": 1}, False, None)]
    ['k/1', '3', '["cpu.usage"]', '{"accepted": 1}', 'false', 'null']
    """
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, (list, tuple, dict, bool)) or value is None:
        return json.dumps(strict_json(value), sort_keys=True, default=str, ensure_ascii=False)
    return str(value)


def kv_table(title: str, rows: Iterable[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in rows:
        table.add_row(key, cell_text(value))
    return table


def grid(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for h in headers:
        # fold, never "…": an identifier must survive a narrow terminal whole
        table.add_column(h, justify="right" if h[:1].isdigit() or h.startswith("#") else "left", overflow="fold")
    for row in rows:
        table.add_row(*(cell_text(v) for v in row))
    return table


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what in-process code writes to stdout (a Lambda handler's Powertools log lines and EMF
    metrics) to stderr, so stdout stays lmctl's own output: one JSON document under ``--json``.

    Powertools' ``Logger`` binds ``sys.stdout`` when it is constructed, so a module imported inside
    this block logs to stderr for good, and a logging handler already bound to stdout is switched to
    stderr for the block's duration.

    >>> with stdout_to_stderr():                                   # doctest: +SKIP
    ...     result = handler(event, context)
    """
    stdout = sys.stdout
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    switched = [(h, h.stream) for lg in loggers for h in lg.handlers
                if type(h) is logging.StreamHandler and h.stream in (stdout, sys.__stdout__)]
    for handler, _ in switched:
        handler.setStream(sys.stderr)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        for handler, stream in switched:
            handler.setStream(stream)


def fail(message: str, code: int = EXIT_USAGE, *, as_json: bool = False) -> NoReturn:
    """Report an error the user can act on and exit with ``code``."""
    if as_json:
        emit_json({"status": "error", "reason": message, "exit_code": code})
    else:
        err_console.print(f"[bold red]error:[/] {message}")
    sys.exit(code)
