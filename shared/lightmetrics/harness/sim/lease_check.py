"""Safety check: nothing destructive is done by a reap actor that no longer holds its lease.

At each destructive request of a reap actor (an S3 ``DeleteObject``/``DeleteObjects``: delete markers,
purges, retention's deletes; a conditional ``DeleteItem``; a transaction that deletes items), once it
landed, :class:`LeaseWatch` reads the authoritative ``lease#reap`` item straight from the in-memory table
and takes the TRUE clock (not the actor's skewed one). The request is allowed when

* the item names the epoch and owner of the execution the actor runs (``hold``), and has not expired
  more than ``LEASE_MARGIN_S`` ago (docs/protocol.md §13 L1: the margin for clock skew and a request
  in flight; a fence renews the lease for ``lease_seconds``, so a fenced request is far inside it); or
* otherwise, within the fence margin of rule L2: the actor's own last successful renewal of that
  epoch's lease (a fence, or a transaction that renews it) landed at most ``FENCE_INTERVAL_S`` plus
  ``LEASE_MARGIN_S`` ago on the true clock (an invocation whose execution ended or was taken over may
  send deletes for at most ``FENCE_INTERVAL_S`` after its last fence; the margin again for skew and flight).

One case is outside the protocol's premise and is noted in the trace, not flagged: a clock jump (the
sim's world pause, minutes long) that fell while the actor's request was in flight, or between the
actor's renewal and its very next request (the destructive one). L1 assumes no request is in flight
longer than ``LEASE_MARGIN_S``; a pause longer than the lease right after a fence outruns any fence
(no fencing token reaches S3). A pause anywhere else — a task that went on deleting minutes after its
last fence without fencing again — is flagged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightmetrics.protocol.timing import LEASE_MARGIN_S
from lightmetrics.reaps.params import LEASE_PK, LEASE_SK
from lightmetrics.work import leases
from lightmetrics.work.leases import FENCE_INTERVAL_S

_NS = 1_000_000_000
LEASE_KEY = f"{LEASE_PK}/{LEASE_SK}"


@dataclass
class _Renewal:
    owner: str
    epoch: int
    landed_ns: int  # true clock
    sent_jumps: int  # the scheduler's clock jumps when the renewal was sent


class LeaseWatch:
    """The check of the module docstring; the proxies report each call to it, the reap driver what
    execution each actor runs."""

    def __init__(self, table: Any, scheduler: Any) -> None:
        self.table, self.scheduler = table, scheduler
        self.holders: dict[str, tuple[str, int]] = {}  # actor name -> (owner, epoch) of its execution
        self.renewed: dict[str, _Renewal] = {}  # actor name -> its last successful renewal
        self.previous_renewed: dict[str, bool] = {}  # actor name -> its previous call was that renewal

    def hold(self, actor: Any, reap: dict[str, Any] | None) -> None:
        """The driver: ``actor`` runs the execution of ``reap`` (None: none)."""
        if reap is None:
            self.holders.pop(actor.name, None)
        else:
            self.holders[actor.name] = (str(reap["owner"]), int(reap["epoch"]))

    def _lease(self) -> leases.LeaseItem | None:
        return leases.read(self.table, LEASE_PK)

    def landed(self, actor: Any, operation: str, key: str, sent_jumps: int, *, destructive: bool) -> None:
        """A call of ``actor`` landed (it did not raise before its effect)."""
        if actor is None:
            return
        previous = self.previous_renewed.get(actor.name, False)
        self.previous_renewed[actor.name] = False
        if destructive and actor.name in self.holders:
            self._check(actor, operation, key, sent_jumps, previous)
        if LEASE_KEY in key and operation in ("UpdateItem", "TransactWriteItems"):
            lease = self._lease()
            if lease is not None and lease.expires_at_ns > 0 and self.holders.get(actor.name) == (lease.owner, lease.epoch):
                self.renewed[actor.name] = _Renewal(lease.owner, lease.epoch, self.scheduler.clock.now_ns(), sent_jumps)
                self.previous_renewed[actor.name] = True

    def _check(self, actor: Any, operation: str, key: str, sent_jumps: int, after_renewal: bool) -> None:
        owner, epoch = self.holders[actor.name]
        now, lease = self.scheduler.clock.now_ns(), self._lease()
        margin = LEASE_MARGIN_S * _NS
        if lease is not None and (lease.owner, lease.epoch) == (owner, epoch) and lease.expires_at_ns + margin >= now:
            return
        last = self.renewed.get(actor.name)
        if last is not None and (last.owner, last.epoch) == (owner, epoch) \
                and now - last.landed_ns <= FENCE_INTERVAL_S * _NS + margin:
            return
        paused_since = last.sent_jumps if after_renewal and last is not None else sent_jumps
        if self.scheduler.jumps > paused_since:
            self.scheduler.note(f"lease check: {operation} {key} outran by a clock jump in flight (beyond L1)")
            return
        holder = "absent" if lease is None else f"epoch {lease.epoch} owner {lease.owner[:8]} expires {lease.expires_at_ns}"
        since = "never" if last is None else f"{(now - last.landed_ns) / _NS:.0f} s ago"
        self.scheduler.flag(f"{actor.name} (epoch {epoch}, owner {owner[:8]}) sent {operation} {key} without "
                            f"its lease: the lease is {holder} at true time {now}; its last renewal {since}")


__all__ = ["LeaseWatch"]
