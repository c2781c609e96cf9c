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
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
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


def emit_json(data: Any) -> None:
    """One strict JSON document on stdout (RFC 8259: no NaN or Infinity; see :func:`strict_json`)."""
    click.echo(json.dumps(strict_json(data), indent=2, sort_keys=True, default=str, allow_nan=False))


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


def kv_table(title: str, rows: Iterable[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in rows:
        table.add_row(key, "" if value is None else str(value))
    return table


def grid(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for h in headers:
        # fold, never "…": an identifier must survive a narrow terminal whole
        table.add_column(h, justify="right" if h[:1].isdigit() or h.startswith("#") else "left", overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    return table


def fail(message: str, code: int = EXIT_USAGE, *, as_json: bool = False) -> NoReturn:
    """Report an error the user can act on and exit with ``code``."""
    if as_json:
        emit_json({"status": "error", "reason": message, "exit_code": code})
    else:
        err_console.print(f"[bold red]error:[/] {message}")
    sys.exit(code)
