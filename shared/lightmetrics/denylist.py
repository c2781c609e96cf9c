"""The identity denylist: agents or boots an operator refused while investigating a conflict.

Records live in the control table (``pk=denylist``, ``sk=<agent-hex>#<boot-hex>``, or
``<agent-hex>#*`` for every boot of an agent; docs/control-table.md). They are written by
``lmctl conflicts resolve ID --deny-identity`` (and the admin API) and never read per request:
ingest holds the whole partition in a :class:`DenylistCache` that one ``Query`` refreshes at most
once per ``LM_DENYLIST_TTL_S`` seconds (default 60). That TTL is the documented staleness bound:
a denial takes effect in every ingest process within ``LM_DENYLIST_TTL_S`` seconds.

If the table cannot be read, the cache keeps the last list it had (or none) and tries again
after another TTL: the denylist is an investigation tool layered on top of token
authentication, so an unreachable table must not stop ingest (docs/protocol.md §14).

Example:
    >>> cache = DenylistCache(table, ttl_s=60)                                     # doctest: +SKIP
    >>> cache.denied(BatchIdentity.create("a", "b", 0, 9)) is None                 # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightmetrics.clock import DEFAULT_CLOCK, Clock
from lightmetrics.control_table import ConditionFailed, ControlTable
from lightmetrics.identity import BatchIdentity, id_to_hex

log = logging.getLogger(__name__)

DENYLIST_PK = "denylist"
ALL_BOOTS = "*"


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

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> "DenylistEntry":
        boot = item.get("boot_id")
        return cls(sk=item["sk"], agent_id=item.get("agent_id", ""), boot_id=None if boot in (None, ALL_BOOTS) else boot,
                   who=item.get("who", ""), reason=item.get("reason", ""), at_unix_ns=int(item.get("at_unix_ns", 0)),
                   conflict_id=item.get("conflict_id"))

    def to_json(self) -> dict[str, Any]:
        return {"entry": self.sk, "agent_id": self.agent_id, "boot_id": self.boot_id, "who": self.who,
                "reason": self.reason, "at_unix_ns": self.at_unix_ns, "conflict_id": self.conflict_id}


class DenylistStore:
    """Writes and lists denylist records (operators, the admin API)."""

    def __init__(self, table: ControlTable, clock: Clock = DEFAULT_CLOCK) -> None:
        self.table, self.clock = table, clock

    def add(self, agent_id: str, boot_id: str | None, *, who: str, reason: str,
            conflict_id: str | None = None) -> DenylistEntry:
        """Deny ``agent_id``/``boot_id`` (every boot when None). Idempotent: the first denial's
        audit fields are kept if the entry already exists."""
        sk = entry_sk(agent_id, boot_id)
        values = {"pk": DENYLIST_PK, "sk": sk, "agent_id": agent_id, "boot_id": ALL_BOOTS if boot_id is None else boot_id,
                  "who": who, "reason": reason[:2000], "at_unix_ns": self.clock.now_ns(), "conflict_id": conflict_id}
        try:
            self.table.put(values, condition="attribute_not_exists(pk)")
        except ConditionFailed:
            item = self.table.get(DENYLIST_PK, sk)
            if item is not None:
                return DenylistEntry.from_item(item)
        return DenylistEntry.from_item(values)

    def list(self) -> list[DenylistEntry]:
        return [DenylistEntry.from_item(i) for i in self.table.query(DENYLIST_PK)]


class DenylistCache:
    """The denylist as ingest sees it: at most one ``Query`` per ``ttl_s`` per process.

    ``now`` is a monotonic clock in seconds (injectable, so tests advance time instead of sleeping).
    """

    def __init__(self, table: ControlTable, ttl_s: float = 60.0, now: Callable[[], float] = time.monotonic) -> None:
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


__all__ = ["ALL_BOOTS", "DENYLIST_PK", "DenylistCache", "DenylistEntry", "DenylistStore", "entry_sk"]
