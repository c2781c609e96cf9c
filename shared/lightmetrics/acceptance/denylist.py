"""The identity denylist: agents or boots an operator refused while investigating a conflict.

Records live in the control table (``pk=denylist``, ``sk=<agent-hex>#<boot-hex>``, or
``<agent-hex>#*`` for every boot of an agent; docs/control-table.md). They are written by
``lmctl conflicts resolve ID --deny-identity`` (and the admin API), lifted by
``lmctl denylist remove`` (and ``POST /denylist/remove``), and never read per request:
ingest holds the whole partition in a :class:`DenylistCache` that one ``Query`` refreshes at most
once per ``LM_DENYLIST_TTL_S`` seconds (default 60). That TTL is the documented staleness bound:
a denial takes effect in every ingest process within ``LM_DENYLIST_TTL_S`` seconds, and so
does its lift.

A lift is audited: :meth:`DenylistStore.remove` first creates a write-once **lift record**
(``pk=denylist#lifted``, ``sk=<entry>#<decided-at-ns:20>``: which entry, who denied it and why,
who lifted it, when and why), then deletes the entry on the condition that it is still the
denial the record names and no deny decision after the lift has found it. A lift cancels every
deny decision of that entry made at or before it, so re-applying an older resolution
(``resolve`` repairs side effects) does not deny again; a decision after it denies again, even
one that found the entry while the lift was on its way (the entry's ``decided_at_unix_ns``).

If the table cannot be read, the cache keeps the last list it had (or none) and tries again
after another TTL: the denylist is an investigation tool layered on top of token
authentication, so an unreachable table must not stop ingest (docs/protocol.md §14).

Example:
    >>> cache = DenylistCache(table, ttl_s=60)                                     # doctest: +SKIP
    >>> cache.denied(BatchIdentity.create("a", "b", 0, 9)) is None                 # doctest: +SKIP
    True
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.control_store import ConditionFailed, ControlStore
from lightmetrics.protocol.errors import InvalidIdentityError, LightmetricsError
from lightmetrics.protocol.identity import BatchIdentity, id_to_hex, validate_id

log = logging.getLogger(__name__)

DENYLIST_PK = "denylist"
LIFTS_PK = "denylist#lifted"
ALL_BOOTS = "*"
#: Longest operator reason kept in an audit record (resolutions, denials, lifts).
MAX_REASON = 2000


class DenylistError(LightmetricsError):
    """Base of the denylist's operator errors."""


class InvalidLift(DenylistError, ValueError):
    """Bad selection or missing reason (exit 2, HTTP 400)."""


class NotDenied(DenylistError, KeyError):
    """The selected agent/boot has no denylist entry (exit 2, HTTP 404)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not denied"


def operator_reason(reason: str | None, error: type[ValueError]) -> str:
    """The stripped reason of an audited operator action; ``error`` if empty or too long."""
    text = (reason or "").strip()
    if not text:
        raise error("a reason is required (kept in the audit trail)")
    if len(text) > MAX_REASON:
        raise error(f"reason is longer than {MAX_REASON} characters")
    return text


def lift_target(agent_id: str, boot_id: str | None, whole_agent: bool) -> str:
    """The denylist entry a lift selects: one boot, or (``whole_agent``) the every-boot entry."""
    if not isinstance(whole_agent, bool):
        raise InvalidLift("whole_agent must be a boolean")
    if (boot_id is None) == (not whole_agent):
        raise InvalidLift("select the denial to lift: one boot (--boot B, \"boot_id\") or every boot of the agent "
                          "(--whole-agent, \"whole_agent\": true), exactly one of them")
    try:
        validate_id(agent_id, "agent_id")
        if boot_id is not None:
            validate_id(boot_id, "boot_id")
    except InvalidIdentityError as exc:
        raise InvalidLift(str(exc)) from None
    return entry_sk(agent_id, boot_id)


def entry_sk(agent_id: str, boot_id: str | None) -> str:
    """``<agent-hex>#<boot-hex>``; ``boot_id=None`` denies every boot (``<agent-hex>#*``)."""
    return f"{id_to_hex(agent_id)}#{ALL_BOOTS if boot_id is None else id_to_hex(boot_id)}"


@dataclass(frozen=True)
class DenylistEntry:
    """One denial: who, when, why, and the conflict that prompted it."""

    sk: str
    agent_id: str
    boot_id: str | None  # None = every boot of the agent
    who: str
    reason: str
    at_unix_ns: int
    conflict_id: str | None = None
    #: the newest deny decision that found the entry (its creation's, or a later one's); an entry
    #: written before the field existed reads ``at_unix_ns``
    decided_at_unix_ns: int = 0

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> "DenylistEntry":
        boot = item.get("boot_id")
        at = int(item.get("at_unix_ns", 0))
        return cls(sk=item["sk"], agent_id=item.get("agent_id", ""), boot_id=None if boot in (None, ALL_BOOTS) else boot,
                   who=item.get("who", ""), reason=item.get("reason", ""), at_unix_ns=at,
                   conflict_id=item.get("conflict_id"), decided_at_unix_ns=int(item.get("decided_at_unix_ns", at)))

    def to_json(self) -> dict[str, Any]:
        return {"entry": self.sk, "agent_id": self.agent_id, "boot_id": self.boot_id, "who": self.who,
                "reason": self.reason, "at_unix_ns": self.at_unix_ns, "conflict_id": self.conflict_id,
                "decided_at_unix_ns": self.decided_at_unix_ns}

    @property
    def label(self) -> str:
        return f"{self.agent_id}/{self.boot_id if self.boot_id is not None else '(every boot)'}"


@dataclass(frozen=True)
class DenylistLift:
    """The write-once audit record of one lifted denial (``pk=denylist#lifted``)."""

    entry: str
    agent_id: str
    boot_id: str | None  # None = the every-boot entry
    denied_by: str
    denied_reason: str
    denied_at_unix_ns: int
    conflict_id: str | None
    lifted_by: str
    reason: str
    lifted_at_unix_ns: int
    #: the entry's newest decision when the lift read it: one lift per decision (a record written
    #: before the field existed reads ``denied_at_unix_ns``, which its entry then had)
    decided_at_unix_ns: int = 0

    @property
    def sk(self) -> str:
        return f"{self.entry}#{self.decided_at_unix_ns or self.denied_at_unix_ns:020d}"

    @classmethod
    def of(cls, entry: DenylistEntry, *, who: str, reason: str, at_unix_ns: int) -> "DenylistLift":
        return cls(entry=entry.sk, agent_id=entry.agent_id, boot_id=entry.boot_id, denied_by=entry.who,
                   denied_reason=entry.reason, denied_at_unix_ns=entry.at_unix_ns, conflict_id=entry.conflict_id,
                   lifted_by=who, reason=reason, lifted_at_unix_ns=at_unix_ns,
                   decided_at_unix_ns=entry.decided_at_unix_ns or entry.at_unix_ns)

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> "DenylistLift":
        boot = item.get("boot_id")
        denied = int(item["denied_at_unix_ns"])
        return cls(entry=item["entry"], agent_id=item["agent_id"], boot_id=None if boot in (None, ALL_BOOTS) else boot,
                   denied_by=item.get("denied_by", ""), denied_reason=item.get("denied_reason", ""),
                   denied_at_unix_ns=denied, conflict_id=item.get("conflict_id"),
                   lifted_by=item["lifted_by"], reason=item["reason"], lifted_at_unix_ns=int(item["lifted_at_unix_ns"]),
                   decided_at_unix_ns=int(item.get("decided_at_unix_ns", denied)))

    def to_item(self) -> dict[str, Any]:
        return {"pk": LIFTS_PK, "sk": self.sk, **self.to_json(),
                "boot_id": ALL_BOOTS if self.boot_id is None else self.boot_id}

    def to_json(self) -> dict[str, Any]:
        return {"entry": self.entry, "agent_id": self.agent_id, "boot_id": self.boot_id, "denied_by": self.denied_by,
                "denied_reason": self.denied_reason, "denied_at_unix_ns": self.denied_at_unix_ns,
                "conflict_id": self.conflict_id, "lifted_by": self.lifted_by, "reason": self.reason,
                "lifted_at_unix_ns": self.lifted_at_unix_ns, "decided_at_unix_ns": self.decided_at_unix_ns}


class DenylistStore:
    """Writes, lifts and lists denylist records (operators, the admin API)."""

    def __init__(self, table: ControlStore, clock: Clock = DEFAULT_CLOCK) -> None:
        self.table, self.clock = table, clock

    def add(self, agent_id: str, boot_id: str | None, *, who: str, reason: str, conflict_id: str | None = None,
            decided_at_unix_ns: int | None = None) -> DenylistEntry:
        """Deny ``agent_id``/``boot_id`` (every boot when None) by a decision made at
        ``decided_at_unix_ns`` (default now). Idempotent: the first denial's audit fields are kept
        if the entry already exists, and the decision is recorded on it (``decided_at_unix_ns``,
        raised only), so a lift on its way when it landed leaves the entry unless the lift is at
        or after the decision (C6). A lift of this decision that landed while the entry was being
        created is honoured: the entry this call created goes again."""
        sk = entry_sk(agent_id, boot_id)
        decided = self.clock.now_ns() if decided_at_unix_ns is None else decided_at_unix_ns
        values = {"pk": DENYLIST_PK, "sk": sk, "agent_id": agent_id, "boot_id": ALL_BOOTS if boot_id is None else boot_id,
                  "who": who, "reason": reason[:MAX_REASON], "at_unix_ns": decided, "conflict_id": conflict_id,
                  "decided_at_unix_ns": decided}
        for _ in range(3):  # the entry may be lifted (deleted) between a failed create and its update
            try:
                self.table.put(values, condition="attribute_not_exists(pk)")
                entry = DenylistEntry.from_item(values)
            except ConditionFailed:
                try:
                    self.table.update(DENYLIST_PK, sk, "SET decided_at_unix_ns = :d", values={":d": decided},
                                      condition="attribute_exists(pk) AND (attribute_not_exists(decided_at_unix_ns) "
                                                "OR decided_at_unix_ns < :d)")
                except ConditionFailed:
                    pass  # gone (created again below), or a decision as new (perhaps this one, retried) is on it
                item = self.table.get(DENYLIST_PK, sk)
                if item is None:
                    continue
                entry = DenylistEntry.from_item(item)
            if entry.at_unix_ns == decided:  # perhaps created by this call (or its lost attempt)
                self.withdraw(sk, decided)  # ... after a lift that cancels this decision had read the entry
            return entry
        raise ConditionFailed(f"denylist entry {sk} was created and lifted three times while this denial was written")

    def withdraw(self, sk: str, decided_at_unix_ns: int) -> bool:
        """Honour the lifts of the decision made at ``decided_at_unix_ns``: when one is recorded (at
        or after it), the entry that decision created goes, unless a newer decision has found it.
        Re-applying a lifted decision calls it too: an earlier attempt whose answer was lost may
        have created the entry after the lift had deleted the one before. True if the decision is
        lifted."""
        if not self.lifted_since(sk, decided_at_unix_ns):
            return False
        self._delete_if(sk, at_unix_ns=decided_at_unix_ns, decided_by_ns=decided_at_unix_ns)
        return True

    def list(self) -> list[DenylistEntry]:
        return [DenylistEntry.from_item(i) for i in self.table.query(DENYLIST_PK)]

    def lifts(self) -> builtins.list[DenylistLift]:
        """Every lift record, by entry then denial time."""
        return [DenylistLift.from_item(i) for i in self.table.query(LIFTS_PK)]

    def lifted_since(self, sk: str, at_unix_ns: int) -> bool:
        """True if entry ``sk`` was lifted at or after ``at_unix_ns`` (a decision of that time is void).
        One ``Query`` of that entry's lift records only (their keys start ``<entry>#``)."""
        return any(int(i["lifted_at_unix_ns"]) >= at_unix_ns for i in self.table.query(LIFTS_PK, sk_prefix=f"{sk}#"))

    def remove(self, agent_id: str, boot_id: str | None, *, whole_agent: bool = False, who: str,
               reason: str) -> DenylistLift:
        """Lift one denial: the lift record first (write-once), then the entry.

        Raises :class:`InvalidLift` (selection, reason) or :class:`NotDenied`. Safe to repeat after a
        crash between the two writes: the existing lift record of the same denial is reused and the
        delete completed. The delete is conditional on the entry still being that denial, so a
        denial re-created meanwhile (a new decision) stays.
        """
        sk = lift_target(agent_id, boot_id, whole_agent)
        reason = operator_reason(reason, InvalidLift)
        if not who.strip():
            raise InvalidLift("who must not be empty")
        item = self.table.get(DENYLIST_PK, sk)
        if item is None:
            denied = [e.label for e in self.list() if e.agent_id == agent_id]
            raise NotDenied(f"{agent_id}/{boot_id if boot_id is not None else '(every boot)'} is not denied "
                            f"(no denylist entry {sk}); denied for this agent: {', '.join(denied) or 'nothing'}")
        entry = DenylistEntry.from_item(item)
        lift = DenylistLift.of(entry, who=who.strip(), reason=reason, at_unix_ns=self.clock.now_ns())
        try:
            self.table.put(lift.to_item(), condition="attribute_not_exists(pk)")
        except ConditionFailed:  # recorded by an earlier attempt (or a concurrent operator): finish it
            existing = self.table.get(LIFTS_PK, lift.sk)
            if existing is not None:
                lift = DenylistLift.from_item(existing)
        self._delete_if(sk, at_unix_ns=entry.at_unix_ns, decided_by_ns=lift.lifted_at_unix_ns)
        return lift

    def _delete_if(self, sk: str, *, at_unix_ns: int, decided_by_ns: int) -> None:
        """Delete entry ``sk`` if it is still the denial created at ``at_unix_ns`` and no decision
        after ``decided_by_ns`` (a lift's time) has found it."""
        try:
            self.table.delete(DENYLIST_PK, sk,
                              condition="at_unix_ns = :at AND (attribute_not_exists(decided_at_unix_ns) "
                                        "OR decided_at_unix_ns <= :by)",
                              values_for_condition={":at": at_unix_ns, ":by": decided_by_ns})
        except ConditionFailed:
            log.info("denylist entry %s changed since it was read; the newer denial stays", sk)


class DenylistCache:
    """The denylist as ingest sees it: at most one ``Query`` per ``ttl_s`` per process.

    ``now`` is a monotonic clock in seconds (injectable, so tests advance time instead of sleeping).
    """

    def __init__(self, table: ControlStore, ttl_s: float = 60.0, now: Callable[[], float] = time.monotonic) -> None:
        self.table, self.ttl_s, self._now = table, ttl_s, now
        self._lock = threading.Lock()
        self._entries: frozenset[str] = frozenset()
        self._checked_at: float | None = None
        self.refreshes = 0  # reads issued (success or failure), for tests and logs

    def _current(self) -> frozenset[str]:
        with self._lock:  # one refresh at a time; concurrent requests wait for it and share it
            if self._checked_at is not None and self._now() - self._checked_at < self.ttl_s:
                return self._entries
            self._checked_at = self._now()
            self.refreshes += 1
            try:
                self._entries = frozenset(i["sk"] for i in self.table.query(DENYLIST_PK))
            except Exception as exc:  # keep the last known list; try again after another TTL
                log.warning("denylist refresh failed, keeping %d known entries: %s", len(self._entries), exc)
            return self._entries

    def denied(self, identity: BatchIdentity) -> str | None:
        """The matching denylist entry (``<agent-hex>#<boot-hex>`` or ``<agent-hex>#*``), or None."""
        entries = self._current()
        for sk in (f"{identity.agent_hex}#{identity.boot_hex}", f"{identity.agent_hex}#{ALL_BOOTS}"):
            if sk in entries:
                return sk
        return None


__all__ = [
    "ALL_BOOTS", "DENYLIST_PK", "LIFTS_PK", "MAX_REASON", "DenylistCache", "DenylistEntry", "DenylistError",
    "DenylistLift", "DenylistStore", "InvalidLift", "NotDenied", "entry_sk", "lift_target", "operator_reason",
]
