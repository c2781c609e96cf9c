"""What every walk task shares (:class:`WalkJob`): the context, the job kernel (the lease ``lease#walk``
and owned writes: :class:`~lightmetrics.jobs.kernel.JobKernel`), the enumeration roots, the repair of
one key under the outcome contract, and the counters' update expressions. The tasks are composed of
it: :class:`lightmetrics.derived.walk.page_task.PageTask` (page) and
:class:`lightmetrics.derived.walk.steps.Walker` (begin, plan, continue, end).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lightmetrics.derived.indexing import KIND_QUARANTINE, KIND_REPAIR, index_quarantine, repair_accepted
from lightmetrics.derived.walk.checkpoint import KEY_CHECKS, ListCursor, ListLevel
from lightmetrics.jobs.kernel import JobKernel
from lightmetrics.protocol.control_store import ControlStore
from lightmetrics.work.outcome import Outcome
from lightmetrics.work.units import WorkContext, run_unit

log = logging.getLogger(__name__)
#: One pool for every page task of the process: a page repairs up to 16 keys at a time.
POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="lm-walk")
NS = 1_000_000_000


def add_counts(names: dict[str, str], values: dict[str, Any], adds: list[str], settled: Mapping[str, int],
                outcomes: Mapping[str, int]) -> None:
    """The ``ADD`` clauses (appended to ``adds``) of a summary's or partition's counters: the keys
    settled by each check (``keys_<check>``) and the outcomes (a map attribute, by outcome)."""
    for check in KEY_CHECKS:
        names[f"#c{check}"], values[f":c{check}"] = f"keys_{check}", settled[check]
        adds.append(f"#c{check} :c{check}")
    if outcomes:
        names["#o"] = "outcomes"
    for i, (outcome, n) in enumerate(sorted(outcomes.items())):
        names[f"#oc{i}"], values[f":oc{i}"] = outcome, n
        adds.append(f"#o.#oc{i} :oc{i}")


class WalkJob:
    """The state and plumbing the walk's Lambda tasks share over a :class:`WorkContext`."""

    def __init__(self, ctx: WorkContext, settings: Any) -> None:
        self.ctx, self.settings = ctx, settings
        self.table: ControlStore = ctx.table
        self.codec = ctx.codec
        self.kernel = JobKernel(self.table, "walk", ctx.clock)

    # -- helpers -----------------------------------------------------------------------------------
    def now(self) -> int:
        return self.ctx.clock.now_ns()

    def roots(self, agent_hex: str | None) -> list[ListCursor]:
        """The enumeration queue's start: the two roots, at the agents level or one agent's boots."""
        roots = [self.codec.accepted_root(), self.codec.quarantine_root()]
        if agent_hex is None:
            return [ListCursor(r, ListLevel.AGENTS) for r in roots]
        return [ListCursor(self.codec.agent_prefix(r, agent_hex), ListLevel.BOOTS) for r in roots]

    def kind(self, partition: str) -> str:
        return "quarantine" if partition.startswith(self.codec.quarantine_root()) else "accepted"

    def unit_kind(self, key: str) -> str:
        """The work kind the walk repairs ``key`` under: the only blockers its success resolves."""
        return KIND_QUARANTINE if key.startswith(self.codec.quarantine_root()) else KIND_REPAIR

    def repair(self, key: str, *, previously_failed: bool = False) -> Outcome:
        kind = self.unit_kind(key)
        fn: Callable[[WorkContext, str], Outcome] = index_quarantine if kind == KIND_QUARANTINE else repair_accepted
        return run_unit(self.ctx, kind=kind, object_key=key, source="walk", fn=lambda: fn(self.ctx, key),
                        previously_failed=previously_failed).outcome
