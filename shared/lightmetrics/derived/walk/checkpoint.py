"""The walk's typed checkpoint: the summary item ``checkpoint#walk[...]``/``current``, its enumeration
queue, its counters, the partition items ``part#<partition>`` and the progress summary read from them
(docs/control-table.md). Converted to and from the stored items here, at the control-store boundary:
the stored form is unchanged (the status is stored as its string, the enumeration as the map the
table has always held), and an attribute this version does not know is carried through a rewrite.

Example::

    >>> cp = WalkCheckpoint.of({"pk": "checkpoint#walk", "sk": "current", "epoch": 2, "status": "running",
    ...                         "enum": {"queue": [{"prefix": "accepted/v1/", "level": "agents", "token": None}],
    ...                                  "done": False}})
    >>> cp.status is JobStatus.RUNNING, cp.enum.queue[0].level is ListLevel.AGENTS
    (True, True)
    >>> WalkCounters().stored()["outcomes"]["DONE"]
    0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.control_store import counts_of, optional

CHECKPOINT_SK = "current"
PART_PREFIX = "part#"
#: Outcome counters of a walk (``SKIPPED``: an operator skipped the key's blocker).
OUTCOMES = ("DONE", "NOOP_RESOLVED", "RETRY_LATER", "BLOCKED", "SKIPPED")
#: How a key counted NOOP_RESOLVED was settled without a unit of work (rules W4, W5): ``present``
#: — its ``accepted-by-time`` entry exists; ``reaped`` — its hour is tombstoned, nothing probed.
#: Partition items and the summary keep them as ``keys_present`` and ``keys_reaped``.
KEY_CHECKS = ("present", "reaped")


@dataclass(frozen=True)
class WalkCounters:
    """The counters a summary and a partition item keep: keys walked, pages, each outcome (the map
    ``outcomes``) and the keys each check settled (``keys_<check>``, as ``settled``)."""

    keys: int = 0
    pages: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {o: 0 for o in OUTCOMES})
    settled: dict[str, int] = field(default_factory=lambda: {c: 0 for c in KEY_CHECKS})

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> WalkCounters:
        return cls(keys=int(item.get("keys") or 0), pages=int(item.get("pages") or 0),
                   outcomes=counts_of(item.get("outcomes")),
                   settled={c: int(item.get(f"keys_{c}") or 0) for c in KEY_CHECKS})

    def stored(self) -> dict[str, Any]:
        return {"keys": self.keys, "pages": self.pages, "outcomes": dict(self.outcomes),
                **{f"keys_{c}": self.settled.get(c, 0) for c in KEY_CHECKS}}


class ListLevel(StrEnum):
    """What an enumeration cursor's prefix lists: agents (under a root) or boots (under an agent),
    whose common prefixes are the partitions."""

    AGENTS = "agents"
    BOOTS = "boots"


@dataclass
class ListCursor:
    """One prefix of the enumeration queue, listed with ``Delimiter``: its level and the listing's
    continuation token (None: from the start). Stored as ``{"prefix", "level", "token"}``."""

    prefix: str
    level: ListLevel
    token: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> ListCursor:
        return cls(str(raw["prefix"]), ListLevel(raw["level"]), raw.get("token") or None,
                   {k: v for k, v in raw.items() if k not in ("prefix", "level", "token")})

    def stored(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "level": self.level.value, "token": self.token, **self.extra}


@dataclass
class WalkEnumeration:
    """The enumeration's state (``enum`` of the summary): the prefixes still to list, depth first,
    and whether every partition has been found."""

    queue: list[ListCursor] = field(default_factory=list)
    done: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> WalkEnumeration:
        return cls([ListCursor.of(c) for c in raw.get("queue") or []], bool(raw.get("done")),
                   {k: v for k, v in raw.items() if k not in ("queue", "done")})

    def stored(self) -> dict[str, Any]:
        return {"queue": [c.stored() for c in self.queue], "done": self.done, **self.extra}


_CHECKPOINT_FIELDS = ("pk", "sk", "epoch", "owner", "scope", "agent", "status", "started_at_ns", "updated_at_ns",
                      "rate_since_ns", "rate_keys_base", "page_size", "full", "parallelism", "execution", "executions",
                      "resumes", "enum", "partitions_found", "partitions_done", "keys_accepted", "keys_quarantine",
                      "keys", "pages", "outcomes", *(f"keys_{c}" for c in KEY_CHECKS), "finished_at_ns",
                      "failed_at_ns", "watermark_ns", "watermark_withheld", "error", "next_execution")
#: Written after the checkpoint was created (End, Continue): stored only when set.
_LATER = ("finished_at_ns", "failed_at_ns", "watermark_ns", "watermark_withheld", "error", "next_execution")


@dataclass(frozen=True)
class WalkCheckpoint:
    """The walk's summary checkpoint (``checkpoint#walk[...]``/``current``) as read: epoch and owner,
    status, the run's parameters, the enumeration, the totals of the partitions folded in so far,
    and what End recorded. Begin creates it (:meth:`stored`); every later write is an owned update.
    Fields a planted or older item lacks read as None where the summary shows them as missing."""

    pk: str
    epoch: int | None = None
    owner: str = ""
    scope: str | None = None
    agent: str | None = None
    status: JobStatus | None = None
    started_at_ns: int | None = None
    updated_at_ns: int | None = None
    rate_since_ns: int | None = None
    rate_keys_base: int = 0
    page_size: int | None = None
    full: bool = False
    parallelism: int | None = None
    execution: str | None = None
    executions: int | None = None
    resumes: int = 0
    #: None: the item has no enumeration (it never enumerated)
    enum: WalkEnumeration | None = None
    partitions_found: int = 0
    partitions_done: int = 0
    keys_accepted: int = 0
    keys_quarantine: int = 0
    counters: WalkCounters = field(default_factory=WalkCounters)
    finished_at_ns: int | None = None
    failed_at_ns: int | None = None
    watermark_ns: int | None = None
    watermark_withheld: str | None = None
    error: str | None = None
    next_execution: str | None = None
    #: attributes this version does not model: written back as they were read
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> WalkCheckpoint:
        g = item.get

        status, enum = g("status"), g("enum")

        return cls(pk=str(g("pk") or ""), epoch=optional(item, "epoch", int), owner=str(g("owner") or ""),
                   scope=optional(item, "scope", str),
                   agent=optional(item, "agent", str), status=None if status is None else JobStatus(status),
                   started_at_ns=optional(item, "started_at_ns", int), updated_at_ns=optional(item, "updated_at_ns", int),
                   rate_since_ns=optional(item, "rate_since_ns", int), rate_keys_base=int(g("rate_keys_base") or 0),
                   page_size=optional(item, "page_size", int), full=bool(g("full")),
                   parallelism=optional(item, "parallelism", int),
                   execution=optional(item, "execution", str), executions=optional(item, "executions", int),
                   resumes=int(g("resumes") or 0),
                   enum=WalkEnumeration.of(enum) if enum else None,
                   partitions_found=int(g("partitions_found") or 0), partitions_done=int(g("partitions_done") or 0),
                   keys_accepted=int(g("keys_accepted") or 0), keys_quarantine=int(g("keys_quarantine") or 0),
                   counters=WalkCounters.of(item), finished_at_ns=optional(item, "finished_at_ns", int),
                   failed_at_ns=optional(item, "failed_at_ns", int), watermark_ns=optional(item, "watermark_ns", int),
                   watermark_withheld=optional(item, "watermark_withheld", str), error=optional(item, "error", str),
                   next_execution=optional(item, "next_execution", str),
                   extra={k: v for k, v in item.items() if k not in _CHECKPOINT_FIELDS})

    def stored(self) -> dict[str, Any]:
        """The item as the table holds it (Begin's Put of a new epoch's checkpoint)."""
        out: dict[str, Any] = {
            "pk": self.pk, "sk": CHECKPOINT_SK, "epoch": self.epoch, "owner": self.owner, "scope": self.scope,
            "agent": self.agent, "status": None if self.status is None else self.status.value,
            "started_at_ns": self.started_at_ns, "updated_at_ns": self.updated_at_ns,
            "rate_since_ns": self.rate_since_ns, "rate_keys_base": self.rate_keys_base, "page_size": self.page_size,
            "full": self.full, "parallelism": self.parallelism, "execution": self.execution,
            "executions": self.executions, "resumes": self.resumes,
            "enum": None if self.enum is None else self.enum.stored(),
            "partitions_found": self.partitions_found, "partitions_done": self.partitions_done,
            "keys_accepted": self.keys_accepted, "keys_quarantine": self.keys_quarantine, **self.counters.stored(),
        }
        out.update({k: getattr(self, k) for k in _LATER if getattr(self, k) is not None})
        return {**out, **self.extra}

    def owned_by(self, epoch: int, owner: str) -> bool:
        """Whether this checkpoint is still epoch ``epoch`` of the run ``owner``."""
        return self.owner == owner and (-1 if self.epoch is None else self.epoch) == epoch


@dataclass(frozen=True)
class WalkPartition:
    """A partition in progress (``part#<partition>`` under the walk's checkpoint), as read: its cursor
    (``after``), whether its last page was listed (``done``), the epoch and run that own it, its counters
    (``keys``, ``pages``, ``outcomes``, ``keys_<check>`` as ``settled``) and ``failed_through`` (rule O1a)."""

    partition: str
    kind: str = "accepted"
    after: str = ""
    done: bool = False
    epoch: int | None = None
    keys: int = 0
    pages: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    settled: dict[str, int] = field(default_factory=dict)
    failed_through: str = ""
    owner: str = ""

    @property
    def sk(self) -> str:
        return PART_PREFIX + self.partition

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> WalkPartition:
        epoch = item.get("epoch")
        counters = WalkCounters.of(item)
        return cls(partition=str(item.get("partition") or str(item["sk"])[len(PART_PREFIX):]),
                   kind=str(item.get("kind") or "accepted"), after=str(item.get("after") or ""),
                   done=bool(item.get("done")), epoch=None if epoch is None else int(epoch),
                   keys=counters.keys, pages=counters.pages, outcomes=counters.outcomes, settled=counters.settled,
                   failed_through=str(item.get("failed_through") or ""), owner=str(item.get("owner") or ""))

    def owned_by(self, epoch: int, owner: str) -> bool:
        """Whether this partition is still epoch ``epoch`` of the run ``owner``'s."""
        return self.owner == owner and (-1 if self.epoch is None else self.epoch) == epoch


@dataclass(frozen=True)
class WalkSummary:
    """A walk's progress (``lmctl walk status``, End's answer): the summary plus the partitions in
    progress, keys/s and an ETA. :meth:`to_json` is the form the CLI prints and End returns;
    ``checkpoint_pk`` names the checkpoint it was read from (not part of that form).

    Example::

        >>> WalkSummary(checkpoint_pk="checkpoint#walk", status=JobStatus.FINISHED).to_json()["status"]
        'finished'
    """

    checkpoint_pk: str
    scope: str | None = None
    epoch: int | None = None
    status: JobStatus | None = None
    started_at_ns: int | None = None
    updated_at_ns: int | None = None
    executions: int | None = None
    resumes: int = 0
    execution: str | None = None
    partitions_found: int = 0
    partitions_done: int = 0
    enumeration_complete: bool = False
    in_progress: list[str] = field(default_factory=list)
    keys: int = 0
    keys_accepted: int = 0
    keys_quarantine: int = 0
    pages: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {o: 0 for o in OUTCOMES})
    #: NOOP_RESOLVED keys settled without a repair: entry present (W5), hour reaped (W4)
    settled: dict[str, int] = field(default_factory=lambda: {c: 0 for c in KEY_CHECKS})
    keys_per_s: float | None = None
    eta_s: float | None = None
    watermark_ns: int | None = None
    watermark_withheld: str | None = None
    error: str | None = None

    @property
    def repairs(self) -> int:
        return self.outcomes.get("DONE", 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope, "epoch": self.epoch, "status": None if self.status is None else self.status.value,
            "started_at_ns": self.started_at_ns, "updated_at_ns": self.updated_at_ns,
            "executions": self.executions, "resumes": self.resumes, "execution": self.execution,
            "partitions_found": self.partitions_found, "partitions_done": self.partitions_done,
            "enumeration_complete": self.enumeration_complete, "in_progress": list(self.in_progress),
            "keys": self.keys, "keys_accepted": self.keys_accepted, "keys_quarantine": self.keys_quarantine,
            "pages": self.pages, "repairs": self.repairs, "outcomes": dict(self.outcomes),
            **{f"keys_{c}": self.settled.get(c, 0) for c in KEY_CHECKS},
            "keys_per_s": self.keys_per_s, "eta_s": self.eta_s,
            "watermark_ns": self.watermark_ns, "watermark_withheld": self.watermark_withheld, "error": self.error,
        }


__all__ = ["CHECKPOINT_SK", "KEY_CHECKS", "OUTCOMES", "PART_PREFIX", "ListCursor", "ListLevel", "WalkCheckpoint",
           "WalkCounters", "WalkEnumeration", "WalkPartition", "WalkSummary"]
