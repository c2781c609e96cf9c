"""Reaps on Step Functions: GC of orphan raw blobs and retention of expired hours (docs/reaps.md).

``infra/statemachines/reap.asl.json`` loops over Lambda tasks, each one method of :class:`Reaper`
(begin, gc, retention, continue, end); every task returns ``{"reap": ..., "next": ...}`` and the
state machine routes on ``next``. One lease ``lease#reap`` serves both modes; the checkpoint
``checkpoint#reap``/``current`` and a GC page's ``marks#`` items (spread over ``MARKS_SHARDS``
partitions) make every task resumable, and
every S3 delete is sent right after a fence (docs/protocol.md §13, L1-L3). The package, one
concept a module:

``params``      the execution input (:class:`ReapParams`), the control-table keys, GC's durable
                source cursors, the newest audit run (G-B3), the history bound (G-B2)
``state``       the typed state: phases (enums), the summary checkpoint and its changes, a key range's item,
                its pages, converted at the table
``gc``          the one raw-blob deleter: proof, mark, settle (:class:`BlobCollector`)
``gc_proof``    what a proof says of one blob: the reasons it is deleted or kept (:class:`Proof`)
``gc_marks``    a mark and a ``marks#`` item, typed (:class:`Mark`, :class:`MarksItem`) and converted at
                the table; a page's items, split under DynamoDB's item size limit (G-I6)
``marks_keys``  where the marks items live: their sort keys, marks shards and partitions (G-I10, E8)
``mark_settle`` the mark-and-settle pipeline (intent, markers, record, settle) over where a page lives
``gc_sources``  GC's candidate sources: scan, by-time, audit
``gc_tasks``    the GC role's task over the summary's pages (:class:`SummaryPages`)
``retention``   one expired hour's steps
``retention_tasks`` the retention role's task over the summary's phases
``retention_ranges`` an expired hour reaped in key ranges, in parallel (the ``Ranges`` Map's tasks)
``reap_job``    the job the tasks share (on :mod:`lightmetrics.jobs`): summary, owned writes, routing, budget, fence
``steps``       the Lambda tasks (:class:`Reaper`: begin, gc, retention, continue, end)
``report``      the operator's report from a checkpoint (:class:`ReapReport`, :func:`report_of`)
``dry_run``     what keeps a dry run from writing (DR1) and how it counts an hour whole (DR2)
``control``     the operator side (:class:`ReapControl`: start, status, follow)
``errors``      the errors a task raises on purpose (their names are the ASL's error names)

Example (what ``lmctl reap gc --execute --wait`` does)::

    >>> control = ReapControl(ctx, executions, state_machine_arn)            # doctest: +SKIP
    >>> control.follow(control.start(mode="gc", dry_run=False)).report       # doctest: +SKIP
"""

from __future__ import annotations

from lightmetrics.reaps.control import Followed, ReapControl
from lightmetrics.reaps.errors import InvalidReapInput, ReapError, ReapTransient
from lightmetrics.reaps.gc_marks import (
    LEGACY_MARKS_PK,
    MARKS_ITEM_MAX_BYTES,
    MARKS_PREFIX,
    MARKS_SHARDS,
    dynamodb_item_bytes,
    marks_pk,
    marks_pks,
    split_marks,
)
from lightmetrics.reaps.params import (
    CHECKPOINT_PK,
    CHECKPOINT_SK,
    DEFAULT_MAX_PAGES,
    DEFAULT_RANGE_PARALLELISM,
    EVENTS_FIXED,
    EVENTS_PER_MAP_VISIT,
    EVENTS_PER_RANGE_ITERATION,
    EVENTS_PER_TASK,
    INPUT_FIELDS,
    LATEST_AUDIT,
    LEASE_PK,
    LEASE_SK,
    MAX_RANGE_PARALLELISM,
    MODES,
    RANGE_TASK_SECONDS,
    RANGE_TASK_UNITS,
    SOURCE_CURSOR_PREFIX,
    SOURCES,
    STEPS,
    TASK_STEPS,
    ReapParams,
    latest_audit_run,
    map_visit_tasks,
    max_tasks_for,
    source_cursor_sk,
    tombstone_wait,
)
from lightmetrics.reaps.reap_job import (
    CP_CONTINUATION_BEGUN,
    CP_CONTINUED,
    CP_INTENT,
    CP_PAGE_DONE,
    CP_SETTLE_RECORDED,
    CP_STEP_DONE,
    REPORT_BLOCKED_MAX,
)
from lightmetrics.reaps.report import COUNTERS, ReapReport, report_of
from lightmetrics.reaps.retention_ranges import RANGE_PK, RangeTask
from lightmetrics.reaps.steps import Reaper
from lightmetrics.work.leases import LeaseHeld, LeaseLost

__all__ = [
    "CHECKPOINT_PK", "CHECKPOINT_SK", "COUNTERS", "CP_CONTINUATION_BEGUN", "CP_CONTINUED", "CP_INTENT",
    "CP_PAGE_DONE", "CP_SETTLE_RECORDED", "CP_STEP_DONE", "DEFAULT_MAX_PAGES", "DEFAULT_RANGE_PARALLELISM",
    "EVENTS_FIXED", "EVENTS_PER_MAP_VISIT", "EVENTS_PER_RANGE_ITERATION", "EVENTS_PER_TASK",
    "INPUT_FIELDS", "LATEST_AUDIT", "LEASE_PK", "LEASE_SK", "LEGACY_MARKS_PK", "MARKS_ITEM_MAX_BYTES", "MARKS_PREFIX",
    "MARKS_SHARDS", "marks_pk", "marks_pks",
    "MAX_RANGE_PARALLELISM", "MODES", "RANGE_PK", "RANGE_TASK_SECONDS", "RANGE_TASK_UNITS", "RangeTask",
    "REPORT_BLOCKED_MAX", "SOURCES", "SOURCE_CURSOR_PREFIX", "STEPS", "TASK_STEPS", "map_visit_tasks",
    "Followed", "InvalidReapInput", "LeaseHeld", "LeaseLost", "ReapControl", "ReapError", "ReapParams", "ReapReport",
    "ReapTransient", "Reaper", "dynamodb_item_bytes", "latest_audit_run", "max_tasks_for",
    "report_of", "source_cursor_sk", "split_marks", "tombstone_wait",
]
