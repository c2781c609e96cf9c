"""What a reap is asked to do: its execution input (:class:`ReapParams`, docs/reaps.md "Console
input"), where it keeps its records in the control table (the lease, the checkpoint summary, GC's
durable per-source cursors), its Lambda tasks, and how many tasks one execution may run under Step
Functions' history limit (rule G-B2).

Example::

    >>> ReapParams.parse({"mode": "gc", "dry_run": True}).source
    'scan'
    >>> source_cursor_sk("audit", "20261124T063000Z-1a2b3c")
    'gc#audit#20261124T063000Z-1a2b3c'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.control_store import ControlStore
from lightmetrics.protocol.errors import KeyLayoutError
from lightmetrics.protocol.executions import HISTORY_BUDGET, ExecutionInput
from lightmetrics.protocol.keys import RUN_ID_RE, UtcHour
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.state import ReapCheckpoint
from lightmetrics.work import leases
from lightmetrics.work.leases import task_lease_rule_broken

LEASE_PK, LEASE_SK = "lease#reap", "lease"
CHECKPOINT_PK, CHECKPOINT_SK = "checkpoint#reap", "current"


def read_lease(table: ControlStore) -> leases.LeaseItem | None:
    """The reap lease's item, or None if no reap ever took it."""
    return leases.read(table, LEASE_PK)


MODES = ("gc", "retention")
SOURCES = ("scan", "by-time", "audit")
INPUT_FIELDS = ("mode", "dry_run", "hour", "scope", "source", "audit_run", "resume", "page_size", "concurrency",
                "max_pending_pages", "tombstone_wait_s", "verify_passes", "lease_seconds", "max_pages", "max_tasks_per_execution",
                "range_parallelism")
#: Durable per-source GC cursors: ``checkpoint#reap``/``gc#by-time``, ``gc#scan``, ``gc#audit#<run>``.
SOURCE_CURSOR_PREFIX = "gc#"
#: GC pages per run (rule G-B1, docs/protocol.md §15): a run stops marking after this many pages,
#: settles, and releases the lease; the next run continues from the source's durable cursor.
DEFAULT_MAX_PAGES = 400

# --- the execution history bound (rule G-B2; the walk's pattern, lightmetrics.derived.walk.history_bound) -----
#: Events outside the tasks: start, Begin, Continue or Finish, the end state, the Abort path.
EVENTS_FIXED = 100
#: Per task: its 5 events and its Route's 2, up to 6 retries of 3 events, a Wait and AfterWait before it.
EVENTS_PER_TASK = 5 + 2 + 3 * 6 + 4


#: A visit of the ``Ranges`` Map (an hour's key ranges in parallel, docs/protocol.md §16): its own
#: MapStateEntered, MapStateStarted, MapStateSucceeded and MapStateExited ...
EVENTS_PER_MAP_VISIT = 4
#: ... and per iteration: MapIterationStarted and MapIterationSucceeded, its RangeRoute Choice's 2,
#: its range task's 5, up to 6 retries of 3 events.
EVENTS_PER_RANGE_ITERATION = 2 + 2 + 5 + 3 * 6


def max_tasks_for() -> int:
    """The most Gc/Retention tasks one execution may run and stay inside HISTORY_BUDGET."""
    return (HISTORY_BUDGET - EVENTS_FIXED) // EVENTS_PER_TASK


def map_visit_tasks(iterations: int) -> int:
    """A visit of the ``Ranges`` Map with ``iterations`` range tasks, in tasks' worth of history
    (:data:`EVENTS_PER_TASK` events each, rounded up): what the task count of rule G-B2 charges it.

    >>> map_visit_tasks(4), map_visit_tasks(40), map_visit_tasks(256)
    (4, 38, 239)
    """
    return -(-(EVENTS_PER_MAP_VISIT + iterations * EVENTS_PER_RANGE_ITERATION) // EVENTS_PER_TASK)


def source_cursor_sk(source: str, audit_run: str | None = None) -> str:
    """The control-table sort key of a GC source's durable cursor, e.g. ``gc#by-time``."""
    return SOURCE_CURSOR_PREFIX + source + (f"#{audit_run}" if source == "audit" else "")


# --- an hour's key ranges in parallel (docs/protocol.md §16, "An hour in R ranges") ------------------
#: Range tasks of one hour in flight at once (the ``Ranges`` Map's MaxConcurrency), unless the input's
#: ``range_parallelism`` says otherwise; at most MAX_RANGE_PARALLELISM.
DEFAULT_RANGE_PARALLELISM, MAX_RANGE_PARALLELISM = 16, 40
#: One range task does at most this many units (a page marked, a page's marks settled, or a page of
#: derived entries deleted) and starts none after RANGE_TASK_SECONDS, so one Map iteration's events
#: and one Lambda's time stay bounded (the reap functions' timeout is 600 s).
RANGE_TASK_UNITS = 8
RANGE_TASK_SECONDS = 240

#: ``audit_run`` value of the scheduled GC: the newest committed audit run (rule G-B3).
LATEST_AUDIT = "latest"


def latest_audit_run(store: Any, codec: Any) -> str | None:
    """Rule G-B3: the run id of the newest committed audit (the last of the write-once markers
    ``audit/v1/committed/<commit time>.<run>.json``, which sort by commit time), or None.

    >>> latest_audit_run(ctx.store, ctx.codec)                    # doctest: +SKIP
    '20261124T063000Z-1a2b3c'
    """
    newest: str | None = None
    after: str | None = None
    while True:  # one LIST per 1,000 audits: a weekly audit fills a page in 19 years
        page = store.list_page(codec.audit_committed_root(), max_keys=1000, start_after=after)
        for key in reversed(page.keys):  # the page's newest marker; a stray object names no run
            try:
                parsed = codec.parse(key)
            except KeyLayoutError:
                continue
            if parsed.run_id and key.startswith(codec.audit_committed_root()):
                newest = parsed.run_id
                break
        if not page.truncated or not page.keys:
            return newest
        after = page.keys[-1]


# --- the Lambda tasks (functions/reap_*/app.py are one line each) ------------------------------------
STEPS = {"begin": "begin", "gc": "gc", "retention": "retention", "continue": "cont", "end": "end"}
#: function name in the resource spec -> reap step (functions/reap_<step>/app.py)
TASK_STEPS = {f"reap-{step}": step for step in STEPS}


@dataclass(frozen=True)
class ReapParams:
    """A validated execution input; ``dry_run`` is required (docs/reaps.md, "Console input")."""

    mode: str
    dry_run: bool
    hour: UtcHour | None = None
    scope: str = "raw"
    source: str = "scan"
    audit_run: str | None = None
    resume: bool = False
    page_size: int = 500
    concurrency: int = 8
    max_pending_pages: int = 20
    tombstone_wait_s: int = 120
    verify_passes: int = 3
    lease_seconds: int = 900
    max_pages: int = DEFAULT_MAX_PAGES
    max_tasks_per_execution: int = 0  # 0: max_tasks_for()
    range_parallelism: int = DEFAULT_RANGE_PARALLELISM

    @classmethod
    def parse(cls, raw: Any) -> "ReapParams":
        integer = ExecutionInput(raw, INPUT_FIELDS, InvalidReapInput).integer
        if raw.get("mode") not in MODES:
            raise InvalidReapInput(f"mode must be one of {list(MODES)}")
        if not isinstance(raw.get("dry_run"), bool):
            raise InvalidReapInput("dry_run must be stated explicitly: true or false")
        hour = None
        if raw.get("hour") not in (None, ""):
            try:
                hour = UtcHour.parse(str(raw["hour"]))
            except ValueError as exc:
                raise InvalidReapInput(str(exc)) from None
        source = raw.get("source") or "scan"
        if source not in SOURCES:
            raise InvalidReapInput(f"source must be one of {list(SOURCES)}")
        scope = raw.get("scope") or "raw"
        if scope not in ("raw", "rollup") or (scope == "rollup" and raw["mode"] != "retention"):
            raise InvalidReapInput("scope is 'raw' (default) or 'rollup' (retention only: LM_ROLLUP_RETENTION_S)")
        audit_run = raw.get("audit_run") or None
        if (source == "audit") != (audit_run is not None):
            raise InvalidReapInput("source 'audit' needs audit_run (the audit's run id, or 'latest'), and only it does")
        if audit_run is not None and (not isinstance(audit_run, str) or not RUN_ID_RE.fullmatch(audit_run)):
            raise InvalidReapInput("audit_run must be an audit run id (1-128 of [A-Za-z0-9_.-]) or 'latest'")

        lease_seconds = integer("lease_seconds", 900, 60, 86400)
        broken = task_lease_rule_broken(lease_seconds, TASK_STEPS)
        if broken:
            raise InvalidReapInput(broken)
        return cls(mode=raw["mode"], dry_run=raw["dry_run"], hour=hour, scope=scope, source=source, audit_run=audit_run,
                   resume=bool(raw.get("resume", False)),
                   page_size=integer("page_size", 500, 1, 1000), concurrency=integer("concurrency", 8, 1, 64),
                   max_pending_pages=integer("max_pending_pages", 20, 1, 1000),
                   tombstone_wait_s=tombstone_wait(integer("tombstone_wait_s", 120, 0, 3600)),
                   verify_passes=integer("verify_passes", 3, 1, 10),
                   lease_seconds=lease_seconds, max_pages=integer("max_pages", DEFAULT_MAX_PAGES, 1, 10**6),
                   max_tasks_per_execution=integer("max_tasks_per_execution", max_tasks_for(), 1, max_tasks_for()),
                   range_parallelism=range_parallelism(integer))


def check_resume(params: ReapParams, checkpoint: ReapCheckpoint | None) -> None:
    """Rule DR1 with ``resume`` (docs/protocol.md §16.1): a resume carries on the unfinished reap as it
    was started, so its input must say the same ``mode`` and ``dry_run``; anything else is refused
    before any write — a dry run never settles a failed reap's marks by resuming it."""
    if checkpoint is None or checkpoint.status == JobStatus.FINISHED:
        raise InvalidReapInput("resume: no unfinished reap to resume")
    was = (checkpoint.mode, checkpoint.dry_run)
    if (params.mode, params.dry_run) != was:
        raise InvalidReapInput(
            f"resume: the unfinished reap (epoch {checkpoint.epoch}) is mode {was[0]} with dry_run "
            f"{str(was[1]).lower()}, the input says mode {params.mode} with dry_run {str(params.dry_run).lower()}: "
            f"a resume carries on that reap as it was started. Resume it with mode {was[0]} and dry_run "
            f"{str(was[1]).lower()}, or start a new reap without resume")


def range_parallelism(integer: Any) -> int:
    """The input's ``range_parallelism`` (``integer``: :meth:`ExecutionInput.integer`), with why it is bounded."""
    try:
        return int(integer("range_parallelism", DEFAULT_RANGE_PARALLELISM, 1, MAX_RANGE_PARALLELISM))
    except InvalidReapInput as exc:
        raise InvalidReapInput(f"{exc}: the range tasks of one hour in flight at once (the Ranges Map's "
                               f"MaxConcurrency; default {DEFAULT_RANGE_PARALLELISM}). Each is a Lambda of "
                               "reap-gc or reap-retention, so this bounds their concurrency") from None


def tombstone_wait(seconds: int) -> int:
    """Rule D1 (docs/protocol.md §16): the wait must outlast the writers' tombstone cache."""
    from lightmetrics.protocol.errors import ConfigError
    from lightmetrics.protocol.timing import check_tombstone_wait

    try:
        return check_tombstone_wait(seconds)
    except ConfigError as exc:
        raise InvalidReapInput(str(exc)) from None


__all__ = ["CHECKPOINT_PK", "CHECKPOINT_SK", "DEFAULT_MAX_PAGES", "DEFAULT_RANGE_PARALLELISM", "EVENTS_FIXED",
           "EVENTS_PER_MAP_VISIT", "EVENTS_PER_RANGE_ITERATION", "EVENTS_PER_TASK", "INPUT_FIELDS", "LATEST_AUDIT",
           "LEASE_PK", "LEASE_SK", "MAX_RANGE_PARALLELISM", "MODES", "RANGE_TASK_SECONDS", "RANGE_TASK_UNITS",
           "ReapParams", "SOURCES", "SOURCE_CURSOR_PREFIX", "STEPS", "TASK_STEPS", "check_resume", "latest_audit_run",
           "map_visit_tasks",
           "max_tasks_for", "range_parallelism", "read_lease", "source_cursor_sk", "tombstone_wait"]
