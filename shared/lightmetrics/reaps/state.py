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

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypedDict


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


def counts_of(raw: Any) -> dict[str, int]:
    return {str(k): int(v) for k, v in dict(raw or {}).items()}


@dataclass(frozen=True)
class PendingPage:
    """A range's recorded page of marks waiting for its grace: its items' sort-key prefix, how many
    parts (items) it has, and when it was marked. Stored as ``{"p", "n", "t"}``."""

    prefix: str
    parts: int
    marked_at_ns: int

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> PendingPage:
        return cls(str(raw["p"]), int(raw["n"]), int(raw["t"]))

    def stored(self) -> dict[str, Any]:
        return {"p": self.prefix, "n": self.parts, "t": self.marked_at_ns}

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
class ReapCheckpoint:
    """The reap's summary checkpoint (``checkpoint#reap``/``current``, docs/control-table.md "Reap
    checkpoint"), as a task reads it. ``item`` is the stored item whole (plain values): the report
    and the retention outcome read its counters (``c_*``, ``kept#*``) from it. A task's changes are
    written as an owned update (:meth:`~lightmetrics.reaps.reap_job.ReapJob.commit`) and
    read back with :meth:`with_changes`."""

    item: Mapping[str, Any]
    epoch: int
    owner: str
    mode: str
    dry_run: bool
    status: str
    phase: ReapPhase
    scope: str
    source: str
    audit_run: str | None
    hour: str | None
    page_size: int
    concurrency: int
    max_pending_pages: int
    tombstone_wait_s: int
    verify_passes: int
    max_pages: int
    range_parallelism: int
    after: str
    page: int
    hours: list[str]
    hour_index: int
    passes: int
    hour_status: dict[str, str]
    wait_until_ns: int
    listing_done: bool
    closing: bool
    ranges: int
    owned_since_ns: int
    executions: int
    source_cursor: str | None
    blocked: list[str]

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> ReapCheckpoint:
        g = item.get
        return cls(item=dict(item), epoch=int(g("epoch", -1)), owner=str(g("owner") or ""), mode=str(g("mode") or ""),
                   dry_run=bool(g("dry_run")), status=str(g("status") or ""), phase=ReapPhase(g("phase") or "done"),
                   scope=str(g("scope") or "raw"), source=str(g("source") or "scan"),
                   audit_run=g("audit_run") or None, hour=g("hour") or None, page_size=int(g("page_size") or 500),
                   concurrency=int(g("concurrency") or 8), max_pending_pages=int(g("max_pending_pages") or 20),
                   tombstone_wait_s=int(g("tombstone_wait_s") or 0), verify_passes=int(g("verify_passes") or 1),
                   max_pages=int(g("max_pages") or 0), range_parallelism=int(g("range_parallelism") or 0),
                   after=str(g("after") or ""), page=int(g("page") or 0), hours=[str(h) for h in g("hours") or []],
                   hour_index=int(g("hour_index") or 0), passes=int(g("passes") or 1),
                   hour_status={str(k): str(v) for k, v in (g("hour_status") or {}).items()},
                   wait_until_ns=int(g("wait_until_ns") or 0), listing_done=bool(g("listing_done")),
                   closing=bool(g("closing")), ranges=int(g("ranges") or 1), owned_since_ns=int(g("owned_since_ns") or 0),
                   executions=int(g("executions") or 1), source_cursor=g("source_cursor") or None,
                   blocked=[str(b) for b in g("blocked") or []])

    def with_changes(self, changes: Mapping[str, Any]) -> ReapCheckpoint:
        """This checkpoint with ``changes`` (stored names and values) applied."""
        return ReapCheckpoint.of({**self.item, **changes})

    @property
    def current_hour(self) -> str:
        """Retention: the hour the checkpoint is at."""
        return self.hours[self.hour_index]


__all__ = ["MarkState", "PageOutcome", "PendingPage", "RangeIntent", "RangeItem", "RangePhase", "ReapCheckpoint",
           "ReapPhase", "ReapRun", "counts_of"]
