"""The reap's typed state: its phases (enums) and the records a page of marks and a key range keep in
the control table (docs/control-table.md), converted to and from the stored items here, at the
control-store boundary. The stored form is unchanged: a phase is stored as its string, a record
as the attributes (and short names) the table has always held, and an attribute this version does
not know is carried through a rewrite untouched.

Example::

    >>> ReapPhase("blobs").role, RangePhase("derived").role
    ('gc', 'retention')
    >>> RangeItem.of({"epoch": 3, "owner": "o", "hour": "2026-08-01T13", "pass": 1, "range": 2,
    ...               "phase": "blobs", "pending": [{"p": "marks#x#", "n": 1, "t": 7}]}).pending[0].parts
    1
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, TypedDict

from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.control_store import counts_of, optional


class ReapRun(TypedDict):
    """The reap's run as Step Functions carries it from task to task (``reap`` in every task's input
    and output): its lease (``owner``, ``epoch``, ``lease_seconds``), mode, the tasks this execution
    ran against its budget (rule G-B2), and its executions so far."""

    epoch: int
    owner: str
    mode: str
    dry_run: bool
    lease_seconds: int
    max_tasks: int
    tasks: int
    executions: int
    state_machine_arn: str


class ReapPhase(StrEnum):
    """The phase of a reap's summary checkpoint (``checkpoint#reap``/``current``)."""

    MARK = "mark"  # GC: prove and mark pages of candidates
    BLOBS = "blobs"  # retention: an hour's blobs, through GC's handshake
    SETTLE = "settle"  # purge or restore recorded marks (also a closing settle, G-I8)
    COMMIT = "commit"  # retention: an hour's tombstone
    RANGES = "ranges"  # retention: an hour's key ranges in parallel (the Ranges Map)
    CHUNKS = "chunks"  # retention of rollups: chunks and their index
    MANIFESTS = "manifests"  # retention of rollups: manifests
    DERIVED = "derived"  # retention: an hour's derived entries
    BY_TIME = "by-time"  # a checkpoint of a version that deleted accepted-by-time entries apart
    VERIFY = "verify"  # retention: the hour is empty, or another pass
    DONE = "done"

    @property
    def role(self) -> str:
        """The task that runs this phase: ``gc`` (the GC role), ``retention``, or ``finish``."""
        if self is ReapPhase.DONE:
            return "finish"
        return "gc" if self in (ReapPhase.MARK, ReapPhase.BLOBS, ReapPhase.SETTLE) else "retention"


class RangePhase(StrEnum):
    """The phase of one key range of an hour reaped in ranges."""

    BLOBS = "blobs"
    DERIVED = "derived"
    DONE = "done"

    @property
    def role(self) -> str:
        return "retention" if self is RangePhase.DERIVED else "gc"


class MarkState(StrEnum):
    """A ``marks#`` item's state: recorded before its markers (``intent``), or after (``marked``)."""

    INTENT = "intent"
    MARKED = "marked"


@dataclass(frozen=True)
class PendingPage:
    """A recorded page of marks waiting for its grace (a range's, or the summary's): its items' prefix,
    parts, time marked, and whether they are under their marks shard (``sharded``, stored ``"k": 1``;
    an older writer's are under ``checkpoint#reap``, §17 E8: :func:`~lightmetrics.reaps.marks_keys.pending_keys`)."""

    prefix: str
    parts: int
    marked_at_ns: int
    sharded: bool = True

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> PendingPage:
        return cls(str(raw["p"]), int(raw["n"]), int(raw["t"]), bool(raw.get("k")))

    def stored(self) -> dict[str, Any]:
        return {"p": self.prefix, "n": self.parts, "t": self.marked_at_ns, **({"k": 1} if self.sharded else {})}

    def sks(self) -> list[str]:
        return [f"{self.prefix}{k:03d}" for k in range(self.parts)]


@dataclass(frozen=True)
class PageOutcome:
    """What a proven page moves its home on to: the source's cursor after it, whether more follow,
    its counters, and (GC's ``by-time`` source) the first hour not yet proven."""

    cursor: str
    more: bool
    counts: dict[str, int]
    through: str | None = None


@dataclass(frozen=True)
class RangeIntent:
    """A range page's intent, recorded in the range item before its first marker: the page
    (:class:`PendingPage`'s fields; ``marked_at_ns`` is when the intent was recorded), its writer,
    and what the page moves the range on to. Stored as ``{"p", "n", "t", "owner", "after", "more",
    "counts"}``."""

    page: PendingPage
    owner: str
    outcome: PageOutcome

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> RangeIntent:
        return cls(PendingPage.of(raw), str(raw["owner"]),
                   PageOutcome(str(raw["after"]), bool(raw["more"]), counts_of(raw.get("counts"))))

    def stored(self) -> dict[str, Any]:
        return {**self.page.stored(), "owner": self.owner, "after": self.outcome.cursor, "more": self.outcome.more,
                "counts": dict(self.outcome.counts)}


_RANGE_FIELDS = ("epoch", "owner", "hour", "pass", "range", "start_after", "end_at", "phase", "after", "listing_done",
                 "page", "pending", "wait_until_ns", "version", "counts", "intent")


@dataclass
class RangeItem:
    """One key range of an hour in one pass (``checkpoint#reap#range``/``<epoch>#<hour>#<pass>#<range>``):
    its bounds, cursor, phase, recorded pages waiting for their grace, an intent not yet recorded
    as marks, its counters, and the version its writes are conditional on."""

    epoch: int
    owner: str
    hour: str
    passes: int
    r: int
    start_after: str = ""
    end_at: str = ""
    phase: RangePhase = RangePhase.BLOBS
    after: str = ""
    listing_done: bool = False
    page: int = 0
    pending: list[PendingPage] = field(default_factory=list)
    wait_until_ns: int = 0
    version: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    intent: RangeIntent | None = None
    #: attributes this version does not model (pk, sk, updated_at_ns, expires_at, a write token):
    #: written back as they were read
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> RangeItem:
        return cls(epoch=int(raw.get("epoch") or 0), owner=str(raw.get("owner") or ""), hour=str(raw.get("hour") or ""),
                   passes=int(raw.get("pass") or 0), r=int(raw["range"]), start_after=str(raw.get("start_after") or ""),
                   end_at=str(raw.get("end_at") or ""), phase=RangePhase(raw.get("phase") or "blobs"),
                   after=str(raw.get("after") or ""), listing_done=bool(raw.get("listing_done")),
                   page=int(raw.get("page") or 0), pending=[PendingPage.of(p) for p in raw.get("pending") or []],
                   wait_until_ns=int(raw.get("wait_until_ns") or 0), version=int(raw.get("version") or 0),
                   counts=counts_of(raw.get("counts")),
                   intent=RangeIntent.of(raw["intent"]) if raw.get("intent") else None,
                   extra={k: v for k, v in raw.items() if k not in _RANGE_FIELDS})

    def stored(self) -> dict[str, Any]:
        out = {**self.extra, "epoch": self.epoch, "owner": self.owner, "hour": self.hour, "pass": self.passes,
               "range": self.r, "start_after": self.start_after, "end_at": self.end_at, "phase": self.phase.value,
               "after": self.after, "listing_done": self.listing_done, "page": self.page,
               "pending": [p.stored() for p in self.pending], "wait_until_ns": self.wait_until_ns,
               "version": self.version, "counts": dict(self.counts)}
        if self.intent is not None:
            out["intent"] = self.intent.stored()
        return out

    def add(self, counts: Mapping[str, int]) -> None:
        for k, v in counts.items():
            if v:
                self.counts[k] = self.counts.get(k, 0) + int(v)




@dataclass(frozen=True)
class CheckpointChange:
    """What one owned write of a reap task changes in its summary checkpoint: each field is the
    checkpoint's field of that name, None leaves it as it is. Converted to the stored names and
    values here only (:meth:`stored`, a phase as its string); the counters (``c_*``, ``kept#*``)
    are added apart (``add``, :meth:`~lightmetrics.reaps.reap_job.ReapJob.commit`).

    >>> CheckpointChange(phase=ReapPhase.SETTLE, wait_until_ns=0).stored()
    {'phase': 'settle', 'wait_until_ns': 0}
    >>> CheckpointChange(after="k").then(CheckpointChange(phase=ReapPhase.DONE)).phase
    <ReapPhase.DONE: 'done'>
    """

    phase: ReapPhase | None = None
    after: str | None = None
    page: int | None = None
    passes: int | None = None
    hour_index: int | None = None
    hour_status: Mapping[str, str] | None = None
    listing_done: bool | None = None
    wait_until_ns: int | None = None
    closing: bool | None = None
    ranges: int | None = None
    blocked: Sequence[str] | None = None
    through: str | None = None
    budget_exhausted: bool | None = None
    pending: Sequence[PendingPage] | None = None
    execution: str | None = None
    executions: int | None = None
    next_execution: str | None = None
    status: JobStatus | None = None
    finished_at_ns: int | None = None
    error: str | None = None

    def set_fields(self) -> dict[str, Any]:
        """The fields this change sets (typed values), in field order."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def then(self, later: CheckpointChange) -> CheckpointChange:
        """This change, then ``later``'s (its fields win)."""
        return replace(self, **later.set_fields())

    def stored(self) -> dict[str, Any]:
        """The attributes this change sets, as stored (the control-store boundary)."""
        return {k: _stored(v) for k, v in self.set_fields().items()}


#: stored attributes a fresh checkpoint leaves out while they are at these values
_ABSENT_AT_DEFAULT = {"closing": False, "ranges": 1, "budget_exhausted": False}


@dataclass(frozen=True)
class ReapCheckpoint:
    """The reap's summary checkpoint (``checkpoint#reap``/``current``, docs/control-table.md "Reap
    checkpoint"). Read with :meth:`of`, stored with :meth:`to_item` (a new reap's, put whole) or
    changed by an owned update of a :class:`CheckpointChange` (:meth:`~lightmetrics.reaps.reap_job.ReapJob.commit`),
    read back with :meth:`with_changes`. ``counters`` are the ``c_*`` and ``kept#*`` attributes,
    ``params`` the input it was started with; ``extra`` the attributes this version does not model
    (pk, sk, a write token), written back as they were read.

    >>> cp = ReapCheckpoint.of({"epoch": 2, "mode": "gc", "phase": "mark", "c_marked": 3})
    >>> cp.with_changes(CheckpointChange(phase=ReapPhase.SETTLE)).phase, cp.counters
    (<ReapPhase.SETTLE: 'settle'>, {'c_marked': 3})
    """

    epoch: int
    owner: str
    mode: str
    dry_run: bool
    status: str
    phase: ReapPhase
    started_at_ns: int | None = None
    updated_at_ns: int | None = None
    owned_since_ns: int = 0
    execution: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    scope: str = "raw"
    source: str = "scan"
    audit_run: str | None = None
    hour: str | None = None
    page_size: int = 500
    concurrency: int = 8
    max_pending_pages: int = 20
    tombstone_wait_s: int = 0
    verify_passes: int = 1
    after: str = ""
    page: int = 0
    hours: list[str] = field(default_factory=list)
    hour_index: int = 0
    passes: int = 1
    hour_status: dict[str, str] = field(default_factory=dict)
    wait_until_ns: int = 0
    listing_done: bool = False
    max_pages: int = 0
    executions: int = 1
    range_parallelism: int = 0
    note: str | None = None
    closing: bool = False
    counters: dict[str, int] = field(default_factory=dict)
    source_cursor: str | None = None
    through: str | None = None
    ranges: int = 1
    blocked: list[str] = field(default_factory=list)
    budget_exhausted: bool = False
    pending: list[PendingPage] = field(default_factory=list)
    next_execution: str | None = None
    finished_at_ns: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> ReapCheckpoint:
        """The checkpoint from its stored item (plain values)."""
        g = item.get

        return cls(
            epoch=int(g("epoch", -1)), owner=str(g("owner") or ""), mode=str(g("mode") or ""),
            dry_run=bool(g("dry_run")), status=str(g("status") or ""), phase=ReapPhase(g("phase") or "done"),
            started_at_ns=optional(item, "started_at_ns", int), updated_at_ns=optional(item, "updated_at_ns", int),
            owned_since_ns=int(g("owned_since_ns") or 0), execution=optional(item, "execution", str),
            params=dict(g("params") or {}),
            scope=str(g("scope") or "raw"), source=str(g("source") or "scan"), audit_run=g("audit_run") or None,
            hour=g("hour") or None, page_size=int(g("page_size") or 500), concurrency=int(g("concurrency") or 8),
            max_pending_pages=int(g("max_pending_pages") or 20), tombstone_wait_s=int(g("tombstone_wait_s") or 0),
            verify_passes=int(g("verify_passes") or 1), after=str(g("after") or ""), page=int(g("page") or 0),
            hours=[str(h) for h in g("hours") or []], hour_index=int(g("hour_index") or 0), passes=int(g("passes") or 1),
            hour_status={str(k): str(v) for k, v in (g("hour_status") or {}).items()},
            wait_until_ns=int(g("wait_until_ns") or 0), listing_done=bool(g("listing_done")),
            max_pages=int(g("max_pages") or 0), executions=int(g("executions") or 1),
            range_parallelism=int(g("range_parallelism") or 0), note=optional(item, "note", str), closing=bool(g("closing")),
            counters={k: int(v) for k, v in item.items() if k.startswith(("c_", "kept#"))},
            source_cursor=g("source_cursor") or None, through=optional(item, "through", str), ranges=int(g("ranges") or 1),
            blocked=[str(b) for b in g("blocked") or []], budget_exhausted=bool(g("budget_exhausted")),
            pending=[PendingPage.of(p) for p in g("pending") or []],
            next_execution=optional(item, "next_execution", str), finished_at_ns=optional(item, "finished_at_ns", int),
            error=optional(item, "error", str),
            extra={k: v for k, v in item.items() if k not in _CHECKPOINT_FIELDS and not k.startswith(("c_", "kept#"))})

    def to_item(self) -> dict[str, Any]:
        """The stored item: ``extra``'s pk and sk, every field a new reap's checkpoint writes, its
        counters, then what it writes only when set (``note``, ``closing``, ``source_cursor`` with its
        ``through``, ...)."""
        out: dict[str, Any] = {k: self.extra[k] for k in ("pk", "sk") if k in self.extra}
        out.update((k, _stored(getattr(self, k))) for k in _ALWAYS_STORED)
        if self.note is not None:
            out["note"] = self.note
        if self.closing:
            out["closing"] = True
        out.update(self.counters)
        if self.source_cursor is not None:  # with the source's cursor, its saved ``through`` (None: none yet)
            out.update(source_cursor=self.source_cursor, through=self.through)
        for k in _STORED_WHEN_SET:
            v = getattr(self, k)
            if v is not None and v != _ABSENT_AT_DEFAULT.get(k) and v != [] and k not in out:
                out[k] = _stored(v)
        out.update((k, v) for k, v in self.extra.items() if k not in ("pk", "sk"))
        return out

    def with_changes(self, change: CheckpointChange) -> ReapCheckpoint:
        """This checkpoint with ``change`` applied (what a task's commit wrote)."""
        values = change.set_fields()
        if change.status is not None:
            values["status"] = change.status.value
        if change.blocked is not None:
            values["blocked"] = list(change.blocked)
        if change.hour_status is not None:
            values["hour_status"] = dict(change.hour_status)
        if change.pending is not None:
            values["pending"] = list(change.pending)
        return replace(self, **values)

    @property
    def current_hour(self) -> str:
        """Retention: the hour the checkpoint is at."""
        return self.hours[self.hour_index]


def _stored(value: Any) -> Any:
    """A field's value as stored: an enum as its string, a mapping a dict, a sequence a list."""
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], PendingPage):
        return [p.stored() for p in value]
    if isinstance(value, Mapping):
        return dict(value)
    return list(value) if isinstance(value, (list, tuple)) else value


_ALWAYS_STORED = ("epoch", "owner", "mode", "dry_run", "status", "started_at_ns", "updated_at_ns", "owned_since_ns",
                  "execution", "params", "scope", "source", "audit_run", "hour", "page_size", "concurrency",
                  "max_pending_pages", "tombstone_wait_s", "verify_passes", "phase", "after", "page", "hours",
                  "hour_index", "passes", "hour_status", "wait_until_ns", "listing_done", "max_pages", "executions",
                  "range_parallelism")
_STORED_WHEN_SET = ("through", "ranges", "blocked", "budget_exhausted", "pending", "next_execution", "finished_at_ns",
                    "error")
_CHECKPOINT_FIELDS = frozenset(f.name for f in fields(ReapCheckpoint)) - {"counters", "extra"}


__all__ = ["CheckpointChange", "MarkState", "PageOutcome", "PendingPage", "RangeIntent", "RangeItem", "RangePhase",
           "ReapCheckpoint", "ReapPhase", "ReapRun"]
