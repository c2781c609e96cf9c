"""The Lambda handlers of the reap's tasks (``functions/reap_*/app.py`` are one line each).

Example (``functions/reap_gc/app.py``)::

    >>> handler = reap_task_handler("gc")                                      # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightmetrics.reaps.errors import ReapError, ReapTransient
from lightmetrics.reaps.params import STEPS
from lightmetrics.reaps.steps import Reaper
from lightmetrics.work import crashpoints
from lightmetrics.work.leases import LeaseError
from lightmetrics.work.outcome import PermanentWorkError
from lightmetrics.work.units import WorkContext


def reap_task_handler(step: str, *, settings_factory: Callable[[], Any] | None = None,
                      work_context_factory: Callable[..., WorkContext] | None = None,
                      sfn_factory: Callable[[], Any] | None = None,
                      ) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The Lambda handler of one reap task (configuration from ``LM_*`` unless factories are given)."""
    from lightmetrics.lambda_shell.task_handler import task_handler

    def build(metrics: Any) -> Reaper:
        from lightmetrics.composition.services import executions, work_context
        from lightmetrics.deployment.settings import Settings

        settings = settings_factory() if settings_factory else Settings.from_env()
        ctx = (work_context_factory(settings, metrics=metrics) if work_context_factory
               else work_context(settings, metrics=metrics, component="reap"))  # the host's clock
        started = None
        if step == "continue":
            started = executions(sfn_factory() if sfn_factory else None)
        return Reaper(ctx, settings, executions=started)

    return task_handler("reap", step, STEPS, build=build,
                        passthrough=(ReapError, LeaseError, crashpoints.InjectedCrash, PermanentWorkError),
                        transient=ReapTransient)


__all__ = ["reap_task_handler"]
