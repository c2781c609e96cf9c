"""The Lambda handlers of the walk's tasks (``functions/walk_*/app.py`` are one line each).

Example (``functions/walk_page/app.py``)::

    >>> handler = walk_task_handler("page")                                    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightmetrics.derived.walk.errors import WalkError, WalkTransient
from lightmetrics.derived.walk.params import STEPS
from lightmetrics.derived.walk.steps import Walker
from lightmetrics.work.leases import LeaseError
from lightmetrics.work.units import WorkContext


def walk_task_handler(
    step: str,
    *,
    settings_factory: Callable[[], Any] | None = None,
    work_context_factory: Callable[..., WorkContext] | None = None,
    sfn_factory: Callable[[], Any] | None = None,
) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The Lambda handler of one walk task. Configuration comes from ``LM_*`` unless factories are
    given (the local runtime passes them so several systems can share a process)."""
    from lightmetrics.lambda_shell.task_handler import task_handler

    def build(metrics: Any) -> Walker:
        from lightmetrics.composition.services import executions, work_context
        from lightmetrics.deployment.settings import Settings

        settings = settings_factory() if settings_factory else Settings.from_env()
        if work_context_factory:
            ctx = work_context_factory(settings, metrics=metrics)
        else:
            ctx = work_context(settings, metrics=metrics, component="walk")
        started = executions(sfn_factory() if sfn_factory else None) if step == "continue" else None
        return Walker(ctx, settings, executions=started)

    return task_handler("walk", step, STEPS, build=build, passthrough=(WalkError, LeaseError), transient=WalkTransient)


__all__ = ["walk_task_handler"]
