"""What every walk task shares (:class:`WalkJob`): the context, the job kernel (the lease ``lease#walk``
and owned writes: :class:`~lightmetrics.jobs.kernel.JobKernel`), the enumeration roots, the repair of
one key under the outcome contract, and the counters' update expressions. The tasks are composed of
it: :class:`lightmetrics.derived.walk.page_task.PageTask` (page) and
:class:`lightmetrics.derived.walk.steps.Walker` (begin, plan, continue, end).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lightmetrics.derived.hour_entries import HourReader
from lightmetrics.derived.indexing import KIND_QUARANTINE, KIND_REPAIR, index_quarantine, repair_accepted
from lightmetrics.derived.walk.checkpoint import KEY_CHECKS, ListCursor, ListLevel
from lightmetrics.jobs.kernel import JobKernel
from lightmetrics.protocol.control_store import ControlStore
from lightmetrics.protocol.errors import SegmentConflictError, SegmentError
from lightmetrics.protocol.segment_keys import SegmentIndex
from lightmetrics.work.outcome import Outcome, PermanentWorkError
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
        self._v2_parts: tuple[int, tuple[int, ...]] | None = None
        self._v2_lock = threading.Lock()

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

    def v2_parts(self, epoch: int) -> tuple[int, ...]:
        """The ``accepted-by-time`` v2 parts that exist (rule W5 over v2): one delimited LIST per
        walk epoch per warm container, asked only when a key is absent from v1, so a v1-only bucket
        whose entries are present never pays it. A part first written during the epoch is not
        seen by it: a key of it is repaired in v1, an equal duplicate (§9.1 V-D7)."""
        with self._v2_lock:
            if self._v2_parts is None or self._v2_parts[0] != epoch:
                parts = HourReader(self.ctx.store, self.codec).v2_parts(SegmentIndex.ACCEPTED_BY_TIME)
                self._v2_parts = (epoch, parts)
            return self._v2_parts[1]

    def refuse(self, refused: SegmentError) -> Outcome:
        """The blocker of a refused v2 object (docs/protocol.md §9.1): kind ``segment`` (or
        ``segment-conflict``, with the *invariant violation* signal), work key ``<kind>:<key>``.
        Opening it is idempotent, so every record that met the object may report it."""

        def refused_now() -> Outcome:
            alarm = "InvariantViolation" if isinstance(refused, SegmentConflictError) else None
            raise PermanentWorkError(refused.reason, kind=refused.kind, alarm=alarm)

        return run_unit(self.ctx, kind=refused.kind, object_key=refused.key, source="walk", fn=refused_now).outcome

