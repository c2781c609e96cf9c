"""Blockers: durable records of work that stopped, and the operator verbs on them (docs/protocol.md §11).

A blocker is written *before* anything reports BLOCKED. Work is paused, never silently
dropped: an operator lists blockers and chooses ``retry`` (run now against live state),
``resume`` (clear it and let the worker try again — event-sourced work is re-enqueued) or
``skip`` (audited, with a reason). Every action is appended to the record's audit trail.

Record (``pk=blockers``, ``sk=<work-key>``): ``work_key``, ``kind``, ``object_key``, ``reason``,
``status`` (``open``, ``resumed``, ``resolved``, ``skipped``), ``source`` (``event``,
``reconcile``, ``walk``, ``dlq``), ``first_seen_ns``, ``last_seen_ns``, ``attempts``,
``payload`` (the original message, for re-enqueueing), ``audit`` (list of actions).

A blocker is not a verdict: the next run that reaches its unit checks it again, and a success
resolves it by itself (:meth:`BlockerStore.resolve_by_success`, rule O4) — a refusal that passed
(an IAM or KMS change still propagating) never blocks for good.

Example:
    >>> store = BlockerStore(table, clock)                                          # doctest: +SKIP
    >>> store.block("index-accepted:accepted/v1/x", kind="index-accepted", ...)     # doctest: +SKIP
    >>> [b.work_key for b in store.list()]                                          # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.control_store import ConditionFailed, ControlStore
from lightmetrics.protocol.own_writes import put_own

PK = "blockers"


class BlockerStatus(StrEnum):
    """A blocker's status: ``open`` (work paused), ``resumed`` (cleared; the worker tries again),
    ``resolved`` (a run succeeded, rule O4), ``skipped`` (an operator gave it up, audited)."""

    OPEN = "open"
    RESUMED = "resumed"
    RESOLVED = "resolved"
    SKIPPED = "skipped"

    @property
    def pending(self) -> bool:
        """Whether the work is still owed (open, or resumed and not yet run)."""
        return self in (BlockerStatus.OPEN, BlockerStatus.RESUMED)


OPEN = BlockerStatus.OPEN
STATUSES = tuple(s.value for s in BlockerStatus)
_RESOLVED_TTL_S = 30 * 86400


class BlockerNotFound(KeyError):
    pass


@dataclass
class Blocker:
    work_key: str
    kind: str
    object_key: str
    reason: str
    status: BlockerStatus
    source: str
    first_seen_ns: int
    last_seen_ns: int
    attempts: int = 1
    payload: dict[str, Any] | None = None
    audit: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> "Blocker":
        payload = item.get("payload")
        return cls(
            work_key=item["sk"],
            kind=item.get("kind", ""),
            object_key=item.get("object_key", ""),
            reason=item.get("reason", ""),
            status=BlockerStatus(item.get("status") or OPEN),
            source=item.get("source", ""),
            first_seen_ns=int(item.get("first_seen_ns", 0)),
            last_seen_ns=int(item.get("last_seen_ns", 0)),
            attempts=int(item.get("attempts", 1)),
            payload=json.loads(payload) if payload else None,
            audit=list(item.get("audit", [])),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "work_key": self.work_key,
            "kind": self.kind,
            "object_key": self.object_key,
            "reason": self.reason,
            "status": self.status.value,
            "source": self.source,
            "first_seen_ns": self.first_seen_ns,
            "last_seen_ns": self.last_seen_ns,
            "attempts": self.attempts,
            "has_payload": self.payload is not None,
            "audit": self.audit,
        }


class BlockerStore:
    def __init__(self, table: ControlStore, clock: Clock = DEFAULT_CLOCK) -> None:
        self.table = table
        self.clock = clock

    def block(
        self,
        work_key: str,
        *,
        kind: str,
        object_key: str,
        reason: str,
        source: str,
        payload: dict[str, Any] | None = None,
    ) -> Blocker:
        """Open (or refresh) the blocker for ``work_key``; durable when this returns. A blocker an
        operator skipped stays skipped (the decision stands, as with :meth:`open_once`): work that
        checks a key again — the reconciler every run — must not undo it."""
        now = self.clock.now_ns()
        names = {"#s": "status", "#r": "reason", "#k": "kind", "#o": "object_key", "#src": "source",
                 "#f": "first_seen_ns", "#l": "last_seen_ns", "#a": "attempts", "#x": "expires_at"}
        values: dict[str, Any] = {":open": OPEN, ":r": reason[:2000], ":k": kind, ":o": object_key,
                                  ":src": source, ":now": now, ":one": 1}
        expr = "SET #s = :open, #r = :r, #k = :k, #o = :o, #src = :src, #f = if_not_exists(#f, :now), " \
               "#l = :now ADD #a :one REMOVE #x"
        if payload is not None:
            names["#p"] = "payload"
            values[":p"] = json.dumps(payload, sort_keys=True)
            expr = expr.replace("#l = :now", "#l = :now, #p = :p")
        values[":skipped"] = "skipped"
        try:
            return Blocker.from_item(self.table.update(PK, work_key, expr, names=names, values=values,
                                                       condition="attribute_not_exists(#s) OR #s <> :skipped"))
        except ConditionFailed:
            return self.get(work_key)

    def open_once(self, work_key: str, *, kind: str, object_key: str, reason: str, source: str) -> bool:
        """Open the blocker for ``work_key`` unless one exists — open, resolved or skipped: an
        operator's decision stands and is never reopened. One conditional create; True if created."""
        now = self.clock.now_ns()
        item = {"pk": PK, "sk": work_key, "status": OPEN, "reason": reason[:2000], "kind": kind,
                "object_key": object_key, "source": source, "first_seen_ns": now, "last_seen_ns": now, "attempts": 1}
        try:
            put_own(self.table, item, condition="attribute_not_exists(pk)")
        except ConditionFailed:
            return False
        return True

    def get(self, work_key: str) -> Blocker:
        item = self.table.get(PK, work_key)
        if item is None:
            raise BlockerNotFound(work_key)
        return Blocker.from_item(item)

    def list(self, *, status: BlockerStatus | str | None = OPEN) -> list[Blocker]:
        items = [Blocker.from_item(i) for i in self.table.query(PK)]
        return [b for b in items if status is None or b.status == status]

    def resolve_by_success(self, work_key: str, *, who: str, outcome: str) -> bool:
        """O4: the unit of an ``open`` (or ``resumed``) blocker just succeeded: resolve it, with an
        ``auto-resolve`` entry in its audit trail. One conditional ``UpdateItem``; False, and nothing
        written, when there is no such blocker (none, resolved, or skipped: an operator's skip stands)."""
        now = self.clock.now_ns()
        entry = {"action": "auto-resolve", "who": who, "at_ns": now,
                 "reason": f"the unit succeeded when {who} checked it again ({outcome})"}
        try:
            self.table.update(
                PK, work_key, "SET #s = :resolved, #au = list_append(if_not_exists(#au, :empty), :e), #x = :x",
                names={"#s": "status", "#au": "audit", "#x": "expires_at"},
                values={":resolved": "resolved", ":e": [entry], ":empty": [], ":x": now // 1_000_000_000 + _RESOLVED_TTL_S,
                        ":open": OPEN, ":resumed": "resumed"},
                condition="#s = :open OR #s = :resumed")
        except ConditionFailed:
            return False
        return True

    def transition(self, work_key: str, status: str, *, who: str, reason: str = "", action: str = "") -> Blocker:
        """Move a blocker to ``status`` and append the action to its audit trail."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}")
        now = self.clock.now_ns()
        entry = {"action": action or status, "who": who, "at_ns": now, "reason": reason}
        values: dict[str, Any] = {":s": status, ":e": [entry], ":empty": []}
        expr = "SET #s = :s, #au = list_append(if_not_exists(#au, :empty), :e)"
        names = {"#s": "status", "#au": "audit"}
        if status in ("resolved", "resumed"):
            # Finished blockers expire; skipped ones stay as the audit of an operator decision.
            names["#x"] = "expires_at"
            values[":x"] = now // 1_000_000_000 + _RESOLVED_TTL_S
            expr += ", #x = :x"
        try:
            item = self.table.update(PK, work_key, expr, names=names, values=values,
                                     condition="attribute_exists(pk)")
        except ConditionFailed:
            raise BlockerNotFound(work_key) from None
        return Blocker.from_item(item)
