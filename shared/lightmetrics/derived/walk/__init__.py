"""The bootstrap walk: complete, resumable cold reconciliation (docs/protocol.md §13; docs/walks.md).

Events and derived entries can be lost, and the steady-state reconciler cannot discover a
missing ``accepted-by-time`` entry (that index is its input). The walk can: it enumerates the
partitions of ``accepted/v1/`` and ``quarantine/v1/identity-conflict/`` (agent, then boot, with
``Delimiter``), lists each partition *from its beginning* in pages and repairs every key that needs
it with the same code as the reconciler and the event path —
:func:`~lightmetrics.derived.indexing.repair_accepted` and :func:`~lightmetrics.derived.indexing.index_quarantine`
under :func:`~lightmetrics.work.units.run_unit`. An acceptance record needs it only when its
``accepted-by-time`` entry is missing; a record of a reaped hour is not probed at all
(:class:`RecordChecks`, docs/protocol.md §13 W4, W5).

It runs on Step Functions (``infra/statemachines/bootstrap_walk.asl.json``); each Lambda task is
one method of :class:`Walker`. The package, one concept a module:

``params``   the execution input (:class:`WalkParams`), its limits, the tasks, the history bound
``checks``   what a page checks per acceptance record (W4, W5: :class:`RecordChecks`)
``checkpoint`` the checkpoint's typed records, converted at the control-store boundary: the summary item
             (:class:`WalkCheckpoint`, its enumeration queue and counters), the partition items
             (:class:`WalkPartition`) and the progress summary (:class:`WalkSummary`)
``state``    the control-table records and what is read from them: lease, checkpoint, watermarks
``walker_base`` what the tasks share (:class:`~lightmetrics.derived.walk.walker_base.WalkJob`: the job kernel of
             :mod:`lightmetrics.jobs`, the enumeration roots, the repair of one key)
``page_task`` the page task
``steps``    the Lambda tasks (:class:`Walker`: begin, plan, page, cont, end), composed of the two above
``control``  the operator side (:class:`WalkControl`: start, status, follow)
``errors``   the errors a task raises on purpose (their names are the ASL's error names)

Example (what ``lmctl walk start --wait`` does)::

    >>> control = WalkControl(ctx, executions, state_machine_arn)              # doctest: +SKIP
    >>> started = control.start(page_size=500)                                 # doctest: +SKIP
    >>> control.follow(started).status                                         # doctest: +SKIP
    'finished'
"""

from __future__ import annotations

from lightmetrics.derived.walk.checkpoint import (
    ListCursor,
    ListLevel,
    WalkCheckpoint,
    WalkCounters,
    WalkEnumeration,
    WalkSummary,
)
from lightmetrics.derived.walk.checks import (
    RecordChecks,
    boundary_margin_ns,
    candidate_hours,
    candidate_parts,
    list_beats_heads,
)
from lightmetrics.derived.walk.control import Followed, Started, WalkControl
from lightmetrics.derived.walk.errors import (
    InvalidWalkInput,
    NothingToResume,
    NothingToWalk,
    WalkError,
    WalkRetryLater,
    WalkTransient,
)
from lightmetrics.derived.walk.params import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ROUNDS,
    DEFAULT_PAGE_SIZE,
    DEFAULT_PARALLELISM,
    EVENTS_FIXED,
    EVENTS_PER_PAGE,
    EVENTS_PER_ROUND,
    HISTORY_BUDGET,
    HISTORY_LIMIT,
    INPUT_FIELDS,
    LIST_MAX_KEYS,
    MAX_LEASE_S,
    MAX_PAGE_SIZE,
    MAX_PARALLELISM,
    MIN_LEASE_S,
    STEPS,
    TASK_STEPS,
    WalkParams,
    history_bound,
    max_rounds_for,
)
from lightmetrics.derived.walk.state import (
    CHECKPOINT_SK,
    INDEXES,
    KEY_CHECKS,
    LEASE_PK,
    LEASE_SK,
    OUTCOMES,
    PART_PREFIX,
    PRESENCE_WALK_INDEXES,
    WalkPartition,
    checkpoint_pk,
    describe_lease,
    proven_before,
    read_lease,
    read_walk,
    read_watermarks,
    set_watermark,
    summarize,
    watermark_blocker,
    watermark_pk,
)
from lightmetrics.derived.walk.steps import Walker
from lightmetrics.work.leases import LeaseHeld, LeaseLost

__all__ = [
    "CHECKPOINT_SK", "DEFAULT_LEASE_S", "DEFAULT_MAX_ROUNDS", "DEFAULT_PAGE_SIZE", "DEFAULT_PARALLELISM",
    "EVENTS_FIXED", "EVENTS_PER_PAGE", "EVENTS_PER_ROUND", "HISTORY_BUDGET", "HISTORY_LIMIT", "INDEXES",
    "INPUT_FIELDS", "KEY_CHECKS", "LEASE_PK", "LEASE_SK", "LIST_MAX_KEYS", "MAX_LEASE_S", "MAX_PAGE_SIZE",
    "MAX_PARALLELISM", "MIN_LEASE_S", "OUTCOMES", "PART_PREFIX", "PRESENCE_WALK_INDEXES", "STEPS", "TASK_STEPS",
    "Followed", "InvalidWalkInput", "LeaseHeld", "LeaseLost", "ListCursor", "ListLevel", "NothingToResume", "NothingToWalk",
    "RecordChecks", "Started", "WalkCheckpoint", "WalkControl", "WalkCounters", "WalkEnumeration", "WalkError",
    "WalkParams", "WalkPartition", "WalkRetryLater", "WalkSummary", "WalkTransient", "Walker",
    "boundary_margin_ns", "candidate_hours", "candidate_parts", "checkpoint_pk", "describe_lease", "history_bound",
    "list_beats_heads", "max_rounds_for", "proven_before", "read_lease", "read_walk", "read_watermarks", "set_watermark",
    "summarize", "watermark_blocker", "watermark_pk",
]
