"""Leases: the one coordination primitive of every job that must run alone (the walk, the reaps,
the rollup), in the control table (``lease#<name>`` / ``lease``; docs/control-table.md).

A lease item carries ``owner`` (a random id per holder), ``epoch`` (one more than any earlier
holder's), ``expires_at_ns`` (liveness: never the item's presence; 0 once released) and
``version`` (one more per take). The rules (docs/protocol.md §13):

* **take** — one conditional write that requires the lease absent, or *expired at the write* and
  not taken since it was read (the version read). A renewal in between keeps it held.
* **renew** — conditional on ``owner`` and ``epoch``, and never a released lease: an invocation
  still running after its execution ended stops at its next fence (L2).
* **release** — expiry 0, conditional on ``owner`` and ``epoch``.
* **fence** (:class:`Fence`) — a renewal right before every destructive or committing step (L2).
* **L1** — a lease outlasts the longest step its holder runs under one fence plus
  :data:`~lightmetrics.protocol.timing.LEASE_MARGIN_S` (:func:`lease_rule_broken`).

A holder of a lease builds on these through the job kernel (:mod:`lightmetrics.jobs.kernel`: the walk,
the reaps, and the rollup's :class:`~lightmetrics.jobs.kernel.Lease`).

Renewals and releases are :class:`~lightmetrics.protocol.control_store.Op` values, so a job puts them in
the same transaction as the checkpoint update they guard.

Example:
    >>> item = take(table, "lease#rollup", None, owner="run-1", lease_seconds=900, now_ns=0, what="rollup")  # doctest: +SKIP
    >>> item.epoch                                                                    # doctest: +SKIP
    1
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from lightmetrics.deployment.timeouts import longest_task_timeout_s
from lightmetrics.protocol.control_store import ConditionFailed, ControlStore, Op, optional, plain
from lightmetrics.protocol.own_writes import WrittenByOther, put_own
from lightmetrics.protocol.timing import LEASE_MARGIN_S

_NS = 1_000_000_000
LEASE_SK = "lease"
#: A task re-fences (renews its lease by a conditional write) before a destructive request once its
#: last fence is this old on its clock; each destructive batch starts with a fence (rule L2).
FENCE_INTERVAL_S = 10
#: the condition every renewal, release and owned checkpoint write carries
OWNED = "#own = :own AND #ep = :ep"


class LeaseError(Exception):
    """Base of the lease errors."""


class LeaseHeld(LeaseError):
    """Another owner holds the lease (the CLI exits 5)."""


class LeaseLost(LeaseError):
    """This owner no longer holds the lease (released, or expired and taken by another run)."""


def lease_pk(name: str) -> str:
    """``lease#<name>``: ``walk``, ``reap``, ``rollup``."""
    return f"lease#{name}"


@dataclass(frozen=True)
class LeaseItem:
    """A lease item as stored at ``lease#<name>`` / ``lease``, typed; :meth:`from_item` and
    :meth:`to_item` convert at the control-store boundary (:func:`read`, :func:`take`), and
    ``to_item(from_item(x)) == x`` for every stored item. Fields an older writer did not store are
    None; an attribute this version does not know is kept in ``attributes``.

    >>> lease = LeaseItem.from_item({"pk": "lease#walk", "sk": "lease", "owner": "a1", "epoch": 2,
    ...                              "expires_at_ns": 0, "released_at_ns": 5, "scope": "all"})
    >>> (lease.epoch, lease.released, lease.scope, lease.execution)
    (2, True, 'all', None)
    """

    pk: str
    owner: str
    epoch: int
    expires_at_ns: int
    #: the highest epoch any holder took (a resume keeps an earlier epoch)
    last_epoch: int | None = None
    lease_seconds: int | None = None
    taken_at_ns: int | None = None
    #: one more per take; None on an item written before leases carried a version
    version: int | None = None
    released_at_ns: int | None = None
    #: what a job stores with its lease: the execution holding it, its scope (the walk's
    #: ``all``/``agent=..``, the reap's mode), the walk's checkpoint
    execution: str | None = None
    scope: str | None = None
    checkpoint_pk: str | None = None
    #: any other stored attribute (the write token of :func:`~lightmetrics.protocol.own_writes.put_own`)
    attributes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def released(self) -> bool:
        """Released by its holder (expiry 0): free to take at once."""
        return self.expires_at_ns == 0

    def is_live(self, now_ns: int) -> bool:
        return self.expires_at_ns > now_ns

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> LeaseItem:
        """The typed lease of a stored item (DynamoDB values or plain ones)."""
        values = plain(dict(item))

        known = {f.name for f in fields(cls)} | {"sk"}
        return cls(str(values["pk"]), str(values.get("owner", "")), int(values.get("epoch", 0)),
                   int(values.get("expires_at_ns", 0)), last_epoch=optional(values, "last_epoch", int),
                   lease_seconds=optional(values, "lease_seconds", int), taken_at_ns=optional(values, "taken_at_ns", int),
                   version=optional(values, "version", int),
                   released_at_ns=optional(values, "released_at_ns", int), execution=optional(values, "execution", str),
                   scope=optional(values, "scope", str),
                   checkpoint_pk=optional(values, "checkpoint_pk", str),
                   attributes={k: v for k, v in values.items() if k not in known})

    def to_item(self) -> dict[str, Any]:
        """The stored item: the attributes a job stores first, then the lease's own (``take``'s order)."""
        extra = {k: getattr(self, k) for k in _JOB_ATTRIBUTES if getattr(self, k) is not None}
        core: dict[str, Any] = {"pk": self.pk, "sk": LEASE_SK, "owner": self.owner, "epoch": self.epoch}
        for k in ("last_epoch", "expires_at_ns", "lease_seconds", "taken_at_ns", "version", "released_at_ns"):
            v = getattr(self, k)
            if v is not None or k == "expires_at_ns":
                core[k] = v
        return {**extra, **core, **self.attributes}


#: the attributes a job stores with its lease (:func:`take`'s ``attributes``)
_JOB_ATTRIBUTES = ("execution", "scope", "checkpoint_pk")


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its renewals and fence name it: a run's ``owner``, ``epoch`` and
    ``lease_seconds`` (the walk's and the reap's run state carry them; :meth:`of` reads them).

    >>> Holder.of({"owner": "a1", "epoch": 3, "lease_seconds": 360, "round": 7})
    Holder(owner='a1', epoch=3, lease_seconds=360)
    """

    owner: str
    epoch: int
    lease_seconds: int

    @classmethod
    def of(cls, run: Mapping[str, Any]) -> Holder:
        return cls(str(run["owner"]), int(run["epoch"]), int(run["lease_seconds"]))


def read(table: ControlStore, pk: str) -> LeaseItem | None:
    """The lease item at ``pk``, or None if nobody ever took it."""
    item = table.get(pk, LEASE_SK)
    return LeaseItem.from_item(item) if item else None


def is_live(item: LeaseItem | None, now_ns: int) -> bool:
    return item is not None and item.is_live(now_ns)


#: How long after its lease lapsed a job whose summary still says ``running`` is called stopped
#: (R9): longer than Step Functions takes to retry a crashed task, whose first write renews it.
STOPPED_MARGIN_S = 300


def stopped_at(item: LeaseItem | None, now_ns: int, margin_s: int = STOPPED_MARGIN_S) -> int | None:
    """When the lease of a job still recorded ``running`` lapsed (expired, or released), if that
    was more than ``margin_s`` ago: its execution stopped without its End task (StopExecution, a
    timeout). None while the lease is live or lapsed only just.

    >>> lapsed = LeaseItem("lease#reap", "a1", 1, expires_at_ns=1)
    >>> stopped_at(lapsed, 400 * 10**9), stopped_at(lapsed, 2)
    (1, None)
    """
    if item is None:
        return None
    at = item.expires_at_ns or item.released_at_ns or 0
    return at if at and at + margin_s * _NS <= now_ns else None


def stopped_cause(item: LeaseItem | None, now_ns: int, what: str, next_step: str) -> list[str]:
    """``lmctl status``'s cause (R9) for a job whose summary says ``running`` and whose lease
    ``item`` lapsed more than :data:`STOPPED_MARGIN_S` ago; [] otherwise."""
    from lightmetrics.protocol.clock import utc_text

    at = stopped_at(item, now_ns)
    return [] if at is None else [f"{what} stopped without finishing: its lease expired at {utc_text(at)} "
                                  f"(aborted or timed out; {next_step})"]


def describe(item: LeaseItem, now_ns: int, what: str) -> str:
    """``the <what> lease is held by epoch N (<scope or owner>), execution E, for another S s``."""
    left = (item.expires_at_ns - now_ns) / _NS
    holder = item.scope or f"owner {item.owner[:8]}"
    execution = f", execution {item.execution}" if item.execution else ""
    return f"the {what} lease is held by epoch {item.epoch} ({holder}){execution}, for another {max(0.0, left):.0f} s"


def take(table: ControlStore, pk: str, current: LeaseItem | None, *, owner: str, lease_seconds: int,
         now_ns: int, what: str, epoch: int | None = None, **attributes: str) -> LeaseItem:
    """Take the lease ``pk`` whose item was read as ``current`` (None: absent): one conditional
    write (absent; or unchanged since the read and expired at the write). ``epoch`` continues an
    earlier epoch (a resume); by default it is one more than any before. ``attributes`` are stored
    with it (execution, scope, ...). Raises :class:`LeaseHeld` naming the holder.

    Example:
        >>> take(table, "lease#walk", None, owner="a1", lease_seconds=360, now_ns=0, what="walk").epoch  # doctest: +SKIP
        1
    """
    if current is not None and current.is_live(now_ns):
        raise LeaseHeld(describe(current, now_ns, what))
    last = 0 if current is None else max(current.epoch, current.last_epoch or 0)
    new_epoch = last + 1 if epoch is None else int(epoch)
    item = {**attributes, "pk": pk, "sk": LEASE_SK, "owner": owner, "epoch": new_epoch,
            "last_epoch": max(new_epoch, last), "expires_at_ns": now_ns + int(lease_seconds) * _NS,
            "lease_seconds": int(lease_seconds), "taken_at_ns": now_ns,
            "version": (0 if current is None else current.version or 0) + 1}
    # put_own: a take whose answer was lost, retried against its own write, is still ours (§11.1)
    try:
        if current is None:
            return LeaseItem.from_item(put_own(table, item, condition="attribute_not_exists(pk)"))
        if current.version is not None:
            return LeaseItem.from_item(put_own(table, item, condition="#v = :v AND #x <= :now",
                                               names={"#v": "version", "#x": "expires_at_ns"},
                                               values_for_condition={":v": current.version, ":now": now_ns}))
        # an item written before leases carried a version
        return LeaseItem.from_item(put_own(table, item, condition="attribute_not_exists(#v) AND #x <= :now",
                                           names={"#v": "version", "#x": "expires_at_ns"},
                                           values_for_condition={":now": now_ns}))
    except WrittenByOther as lost:
        if lost.current is None:  # never: a lease item is never deleted
            raise LeaseHeld(f"the {what} lease was taken by another run") from None
        raise LeaseHeld(describe(LeaseItem.from_item(lost.current), now_ns, what)) from None


def renewal(pk: str, owner: str, epoch: int, lease_seconds: int, now_ns: int, **extra: Any) -> Op:
    """The renewal by its holder: ``expires_at_ns = now + lease_seconds``, conditional on
    ``owner`` and ``epoch`` and on the lease not being released (``extra`` attributes are set with it)."""
    names = {"#own": "owner", "#ep": "epoch", "#x": "expires_at_ns"}
    values: dict[str, Any] = {":own": owner, ":ep": epoch, ":x": now_ns + int(lease_seconds) * _NS, ":released": 0}
    expr = "SET #x = :x"
    for i, (k, v) in enumerate(extra.items()):
        names[f"#e{i}"], values[f":e{i}"] = k, v
        expr += f", #e{i} = :e{i}"
    # A released lease (expiry 0: the execution ended) is never renewed again (rule L2).
    return Op("Update", pk, LEASE_SK, expr, names, values, f"{OWNED} AND #x > :released")


def renewal_of(pk: str, holder: Holder, now_ns: int, **extra: Any) -> Op:
    """:func:`renewal` by ``holder`` for its ``lease_seconds``."""
    return renewal(pk, holder.owner, holder.epoch, holder.lease_seconds, now_ns, **extra)


def release(pk: str, owner: str, epoch: int, now_ns: int) -> Op:
    """The release by its holder: expiry 0 (and ``released_at_ns``), conditional on owner and epoch."""
    return Op("Update", pk, LEASE_SK, "SET #x = :zero, #ra = :now",
              {"#own": "owner", "#ep": "epoch", "#x": "expires_at_ns", "#ra": "released_at_ns"},
              {":own": owner, ":ep": epoch, ":zero": 0, ":now": now_ns}, OWNED)


class Fence:
    """Rule L2: a task re-checks that it still owns its lease right before destructive requests.

    :meth:`renew` fences unconditionally (the start of a destructive batch); calling the fence
    (``fence()``, before each destructive request) renews only once the last renewal is
    ``interval_s`` old. A renewal is one conditional write (:func:`renewal`); if the run lost the
    lease it raises ``lost(message)`` and the request is not sent. Thread-safe (the GC's requests
    run in a pool). With rule L1 no other run can take the lease while this task runs after a
    successful fence: the renewal lasts longer than the task can.

    ``holder`` is who holds the lease (:class:`Holder`: ``owner``, ``epoch``, ``lease_seconds``).
    """

    def __init__(self, table: ControlStore, pk: str, holder: Holder, clock: Any,
                 lost: Callable[[str], Exception] = LeaseLost, *, interval_s: int = FENCE_INTERVAL_S) -> None:
        self.table, self.pk, self.holder, self.clock, self.lost = table, pk, holder, clock, lost
        self.interval_ns = interval_s * _NS
        self._last: int | None = None
        self._lock = threading.Lock()

    def renew(self) -> None:
        with self._lock:
            self._renew(self.clock.now_ns())

    def __call__(self) -> None:
        with self._lock:
            now = self.clock.now_ns()
            if self._last is None or now - self._last >= self.interval_ns:
                self._renew(now)

    def _renew(self, now: int) -> None:
        holder = self.holder
        try:
            renewal_of(self.pk, holder, now).apply(self.table)
        except ConditionFailed:
            raise self.lost(f"epoch {holder.epoch} (owner {holder.owner[:8]}) no longer owns "
                            f"{self.pk}: stopped before a destructive request") from None
        self._last = now


# --- rule L1 -------------------------------------------------------------------------------------------
def lease_rule_broken(lease_s: int, longest_s: int, holder: str, setting: str) -> str | None:
    """Why ``lease_s`` breaks rule L1 — a lease outlasts the longest step that acts under one fence
    (``longest_s``, described by ``holder``) plus ``LEASE_MARGIN_S`` — or None if it does not."""
    need = longest_s + LEASE_MARGIN_S
    if lease_s >= need:
        return None
    return (f"{setting}={lease_s} breaks rule L1 (docs/protocol.md §13): a lease must outlast the longest step "
            f"that holds it ({longest_s} s: {holder}) plus {LEASE_MARGIN_S} s; use at least {need}")


def task_lease_rule_broken(lease_s: int, task_functions: Iterable[str], setting: str = "lease_seconds") -> str | None:
    """Rule L1 for a job of Lambda tasks (the walk, the reap)."""
    names = sorted(task_functions)
    return lease_rule_broken(lease_s, longest_task_timeout_s(names),
                             f"the Lambda timeout of {', '.join(names)} in lightmetrics.deployment.resources", setting)


__all__ = ["FENCE_INTERVAL_S", "LEASE_SK", "OWNED", "STOPPED_MARGIN_S", "Fence", "Holder", "LeaseError", "LeaseHeld",
           "LeaseItem", "LeaseLost",
           "describe", "is_live", "lease_pk", "lease_rule_broken",
           "release", "renewal", "renewal_of", "stopped_at", "stopped_cause", "take",
           "task_lease_rule_broken"]
