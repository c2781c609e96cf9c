"""Key ranges of an hour: how parallel workers split one hour's ``accepted-by-time`` entries
(docs/protocol.md §12 R8).

At a fleet's rate one hour holds millions of ``accepted-by-time`` entries — more than one process
can list and check in a reconciler's run, or delete in a retention pass. Workers split an hour by
**key range**: the entry names after the hour's prefix (``<manifest-id>.json``) are cut at
``cuts``; range ``i`` holds the names ``n`` with ``cuts[i-1] < n <= cuts[i]`` (the first range
has no lower bound, the last no upper bound). Listing a range is a ``ListObjectsV2`` from
``StartAfter`` = the hour prefix + its lower cut, stopped at its upper cut: its own pages only.

Manifest ids begin with the agent id's hex, which follows how operators name agents, not a uniform
distribution, so fixed cuts ("0", "8", ...) would be skewed; cuts are **equal-count** cuts of a
real listing (:func:`equal_count_cuts`), proposed by an operator (``lmctl reconcile plan``).

Plans are write-once control-table items ``plan#hour-ranges``/``from#<YYYY-MM-DDTHH>``, each
**effective from an hour** and never changed: the plan of hour H is the one with the latest
``from`` not after H, and without any, one range (the whole hour). A plan may only take effect at
least two hours after it is written (:data:`MIN_LEAD_HOURS`), so no worker has begun an hour
whose plan then changes: every worker of an hour uses the same cuts, and the ranges of every
hour cover it exactly once.

Example:
    >>> plan = RangePlan(None, ("b.json", "m.json"))
    >>> plan.ranges, plan.bounds(1), plan.range_of("c.json")
    (3, ('b.json', 'm.json'), 1)
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightmetrics.protocol.control_store import ConditionFailed, ControlStore
from lightmetrics.protocol.errors import LightmetricsError
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.own_writes import put_own

PLAN_PK = "plan#hour-ranges"
_SK_PREFIX = "from#"
#: Most ranges a plan may have: its cuts (255 names of at most ~300 bytes) stay far below
#: DynamoDB's 400 KB item limit, and one worker per range stays a plausible fleet of Lambdas.
MAX_RANGES = 256
#: Hours between writing a plan and the first hour it governs: the current hour may be under way
#: and the next one may begin before every worker has read the new plan.
MIN_LEAD_HOURS = 2


class RangePlanError(LightmetricsError):
    """A plan that cannot be written: cuts out of order, too many, or too soon."""


@dataclass(frozen=True)
class RangePlan:
    """The cuts of the hours from ``effective_from`` (None: the built-in plan, one range)."""

    effective_from: UtcHour | None
    cuts: tuple[str, ...] = ()

    @property
    def ranges(self) -> int:
        return len(self.cuts) + 1

    def bounds(self, i: int) -> tuple[str | None, str | None]:
        """Range ``i``'s (exclusive low, inclusive high) entry names; None: unbounded.
        An index past the plan's ranges is an empty range: (None, None) would be the whole hour,
        so it raises instead."""
        if not 0 <= i < self.ranges:
            raise IndexError(f"range {i} of a plan with {self.ranges} ranges")
        low = self.cuts[i - 1] if i > 0 else None
        high = self.cuts[i] if i < len(self.cuts) else None
        return low, high

    def range_of(self, name: str) -> int:
        """The range holding entry name ``name``."""
        return bisect.bisect_left(self.cuts, name)

    def key_bounds(self, hour_prefix: str, i: int) -> tuple[str | None, str | None]:
        """Range ``i`` as full keys under ``hour_prefix``: ``(start_after, end_at)`` for
        :meth:`~lightmetrics.protocol.object_store.ObjectStore.list_modified`."""
        low, high = self.bounds(i)
        return (hour_prefix + low if low is not None else None,
                hour_prefix + high if high is not None else None)


def check_cuts(cuts: Sequence[str]) -> tuple[str, ...]:
    """``cuts`` as a plan's: strictly increasing, non-empty names, at most MAX_RANGES - 1."""
    cuts = tuple(cuts)
    if len(cuts) > MAX_RANGES - 1:
        raise RangePlanError(f"a plan has at most {MAX_RANGES} ranges ({MAX_RANGES - 1} cuts), got {len(cuts) + 1}")
    if any(not isinstance(c, str) or not c or "/" in c for c in cuts):
        raise RangePlanError("every cut is a non-empty entry name (no '/')")
    if any(a >= b for a, b in zip(cuts, cuts[1:])):
        raise RangePlanError("cuts must be strictly increasing")
    return cuts


def equal_count_cuts(names: Sequence[str], ranges: int) -> tuple[str, ...]:
    """Cuts that split the sorted entry ``names`` into ``ranges`` ranges of (nearly) equal count;
    fewer when there are fewer distinct names than ranges.

    >>> equal_count_cuts([f"{i:03d}.json" for i in range(10)], 2)
    ('004.json',)
    >>> equal_count_cuts(["a.json"], 4)
    ()
    """
    if ranges < 1:
        raise RangePlanError(f"ranges must be at least 1, got {ranges}")
    names = sorted(set(names))
    cuts: list[str] = []
    for i in range(1, ranges):
        at = (len(names) * i) // ranges - 1
        if 0 <= at < len(names) - 1 and (not cuts or names[at] > cuts[-1]):
            cuts.append(names[at])
    return check_cuts(cuts)


class TooFewEntries(RangePlanError):
    """The listed hour has fewer distinct entries than the ranges asked for (a plan is permanent)."""


def hour_entry_names(store: Any, codec: Any, hour: UtcHour) -> list[str]:
    """The names (``<manifest-id>.json``) of ``hour``'s ``accepted-by-time`` entries: only keys of
    the layout (a stray key under the hour is never a cut)."""
    from lightmetrics.protocol.errors import KeyLayoutError
    from lightmetrics.protocol.keys import KeyKind

    prefix = codec.accepted_by_time_hour(hour)
    names = []
    for key in store.list_keys(prefix, limit=10**9):
        try:
            if codec.parse(key).kind is KeyKind.ACCEPTED_BY_TIME:
                names.append(key[len(prefix):])
        except KeyLayoutError:
            continue
    return names


class RangePlans:
    """The write-once plans in the control table; one Query per instance (plans are few).

    Example:
        >>> plans = RangePlans(table)                                         # doctest: +SKIP
        >>> plans.plan_for(UtcHour.parse("2026-11-26T13")).ranges             # doctest: +SKIP
        32
    """

    def __init__(self, table: ControlStore) -> None:
        self.table = table
        self._plans: list[RangePlan] | None = None

    def all(self) -> list[RangePlan]:
        """Every written plan, oldest ``effective_from`` first."""
        if self._plans is None:
            plans = []
            for item in self.table.query(PLAN_PK):
                sk = str(item.get("sk", ""))
                if not sk.startswith(_SK_PREFIX):
                    continue
                plans.append(RangePlan(UtcHour.parse(sk[len(_SK_PREFIX):]), tuple(item.get("cuts") or ())))
            self._plans = sorted(plans, key=lambda p: p.effective_from.start_unix_s)  # type: ignore[union-attr]
        return self._plans

    def plan_for(self, hour: UtcHour) -> RangePlan:
        """The plan of ``hour``: the latest one effective at or before it, else one range."""
        current = RangePlan(None)
        for plan in self.all():
            if plan.effective_from is not None and plan.effective_from <= hour:
                current = plan
        return current

    def propose(self, cuts: Sequence[str], *, effective_from: UtcHour, now_ns: int) -> RangePlan:
        """Write a plan effective from ``effective_from`` (at least :data:`MIN_LEAD_HOURS` after
        the hour of ``now_ns``); write-once: a plan already written for that hour is never replaced."""
        cuts = check_cuts(cuts)
        earliest = UtcHour.of_unix_ns(now_ns) + MIN_LEAD_HOURS
        if effective_from < earliest:
            raise RangePlanError(f"a plan takes effect at least {MIN_LEAD_HOURS} hours after it is written: "
                                 f"the earliest is {earliest}, asked for {effective_from}")
        if any(p.effective_from is not None and p.effective_from > effective_from for p in self.all()):
            raise RangePlanError("a later plan is already written; plans take effect in order")
        try:
            put_own(self.table, {"pk": PLAN_PK, "sk": _SK_PREFIX + str(effective_from), "cuts": list(cuts) or None,
                                 "ranges": len(cuts) + 1, "written_at_ns": now_ns},
                    condition="attribute_not_exists(pk)")
        except ConditionFailed:  # another proposal's plan: this one's own write is no failure (§11.1)
            raise RangePlanError(f"a plan effective from {effective_from} is already written "
                                 f"(plans are write-once)") from None
        self._plans = None
        return RangePlan(effective_from, cuts)

    def earliest(self, now_ns: int) -> UtcHour:
        """The first hour a new plan may govern: :data:`MIN_LEAD_HOURS` on, and after every plan written."""
        earliest = UtcHour.of_unix_ns(now_ns) + MIN_LEAD_HOURS
        latest = max((p.effective_from for p in self.all() if p.effective_from is not None),
                     key=lambda h: h.start_unix_s, default=None)
        return latest + 1 if latest is not None and earliest < latest + 1 else earliest

    def propose_from_hour(self, store: Any, codec: Any, *, hour: UtcHour, ranges: int, effective_from: UtcHour,
                          now_ns: int) -> tuple[RangePlan, list[str]]:
        """Equal-count cuts of ``hour``'s entries into ``ranges`` ranges, written as the plan from
        ``effective_from`` (:meth:`propose`); the plan and the names it was cut from.
        :class:`TooFewEntries` (nothing written) when the hour cannot give that many ranges."""
        names = hour_entry_names(store, codec, hour)
        cuts = equal_count_cuts(names, ranges)
        if len(cuts) + 1 < ranges:
            raise TooFewEntries(f"{hour} has {len(names)} accepted-by-time entries, too few for {ranges} "
                                f"equal-count ranges; list a busier hour")
        return self.propose(cuts, effective_from=effective_from, now_ns=now_ns), names


__all__ = ["MAX_RANGES", "MIN_LEAD_HOURS", "PLAN_PK", "RangePlan", "RangePlanError", "RangePlans", "TooFewEntries",
           "check_cuts", "equal_count_cuts", "hour_entry_names"]
