"""A real process kill at a named crash point, for tests (``tests/reap_worker.py``).

``LM_CRASH_AT=<point>`` makes the process exit at once (``os._exit(137)``, like a SIGKILL) when it
reaches that :mod:`lightmetrics.work.crashpoints` point. Test code only: no deployed function imports
this module, so no deployed function reads the variable (docs/protocol.md §18).

Example::

    with killed_at_from_env():      # LM_CRASH_AT=gc.proved in the environment
        drive(reaper, inp, clock)   # exits with 137 when the GC reaches "gc.proved"
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from lightmetrics.work import crashpoints

CRASH_ENV = "LM_CRASH_AT"


@contextmanager
def killed_at_from_env(env: Mapping[str, str] | None = None) -> Iterator[None]:
    """While the block runs, reaching the point named by ``LM_CRASH_AT`` kills the process."""
    target = (os.environ if env is None else env).get(CRASH_ENV)
    if not target:
        yield
        return
    if target not in crashpoints.REGISTRY:
        raise ValueError(f"{CRASH_ENV}={target!r} is not a registered crash point")

    def kill(name: str) -> None:
        if name == target:
            os._exit(137)

    with crashpoints.hooked(kill):
        yield


__all__ = ["CRASH_ENV", "killed_at_from_env"]
