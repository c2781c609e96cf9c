"""Durable retry budget: consecutive RETRY_LATER per work key, promoted to a blocker past a limit.

One item per work key in the control table (``budget#<work-key>``/``budget``): an atomic
counter plus first/last seen. Success clears it whenever a failure may have been recorded: the
caller says so (a redelivered message, a retried walk page, an entry the reconciler's checkpoint
lists as failed, an operator retry) or this process recorded one — so the happy path costs no
DynamoDB request, and a unit that failed costs one ``DeleteItem`` when it succeeds.

An expired item counts as absent. DynamoDB's TTL deletes lazily (up to days late), so an item
whose ``expires_at`` has passed, or whose last failure is older than the age window, would
otherwise lend its old ``first_seen_ns`` to a new failure and make it look like an hour-long
outage. :meth:`RetryBudget.record_failure` resets such an item with a conditional update, so
concurrent failures are each counted once; and each update carries its call's token, so a
request retried after its answer was lost counts once too (docs/protocol.md §11.1).

Example:
    >>> budget = RetryBudget(table, max_count=5, max_age_s=3600, clock=clock)   # doctest: +SKIP
    >>> state = budget.record_failure("index-accepted:accepted/v1/...", "503")   # doctest: +SKIP
    >>> state.exhausted                                                         # doctest: +SKIP
    False
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.control_store import ConditionFailed, ControlStore
from lightmetrics.protocol.own_writes import update_own

_NS = 1_000_000_000
#: work keys this process recorded failures for, remembered for clearing on success (bounded:
#: past it the set starts over, and a forgotten item only waits for its expiry)
_RECORDED_MAX = 10_000


@dataclass(frozen=True)
class BudgetState:
    work_key: str
    count: int
    first_seen_ns: int
    last_seen_ns: int
    exhausted: bool
    last_reason: str = ""


class RetryBudget:
    def __init__(
        self, table: ControlStore, *, max_count: int = 5, max_age_s: int = 3600, clock: Clock = DEFAULT_CLOCK
    ) -> None:
        self.table = table
        self.max_count = max_count
        self.max_age_s = max_age_s
        self.clock = clock
        self._recorded: set[str] = set()
        self._lock = threading.Lock()

    @staticmethod
    def pk(work_key: str) -> str:
        return f"budget#{work_key}"

    def record_failure(self, work_key: str, reason: str) -> BudgetState:
        """Count one more consecutive failure (atomic) and say whether the budget is spent.

        The first update counts onto a live item (or creates one); if the item is expired (its TTL
        passed, or its last failure is older than ``max_age_s``) that update's condition fails and
        a second one, conditional on the item still being expired, starts the count over.
        Whichever of two concurrent writers resets, the other then counts onto the fresh item.
        """
        self.remember_failure(work_key)
        now = self.clock.now_ns()
        names = {"#c": "count", "#f": "first_seen_ns", "#l": "last_seen_ns", "#r": "last_reason",
                 "#w": "work_key", "#x": "expires_at"}
        values = {":one": 1, ":now": now, ":reason": reason[:1000], ":wk": work_key,
                  ":exp": now // _NS + 4 * max(self.max_age_s, 3600), ":stale": now - self.max_age_s * _NS,
                  ":now_s": now // _NS}
        live = "attribute_not_exists(pk) OR (#l >= :stale AND (attribute_not_exists(#x) OR #x > :now_s))"
        expired = "#l < :stale OR #x <= :now_s"
        stamp = "#l = :now, #r = :reason, #w = :wk, #x = :exp"
        count_on = ("ADD #c :one SET #f = if_not_exists(#f, :now), " + stamp, live)
        start_over = ("SET #c = :one, #f = :now, " + stamp, expired)
        item = None
        # a writer that loses the reset to another one counts onto the fresh item in the next round
        for _round in range(5):
            for expression, condition in (count_on, start_over):
                try:  # once: a retried request that landed is this call's one count (§11.1 CW1)
                    item = update_own(self.table, self.pk(work_key), "budget", expression, names=names,
                                      values=values, condition=condition, once=True)
                    break
                except ConditionFailed:
                    continue
            if item is not None:
                break
        if item is None:
            raise ConditionFailed(f"retry budget {work_key}: the item changed under every attempt")
        count, first = int(item["count"]), int(item["first_seen_ns"])
        exhausted = count >= self.max_count or (now - first) >= self.max_age_s * _NS
        return BudgetState(work_key, count, first, now, exhausted, reason)

    def get(self, work_key: str) -> BudgetState | None:
        item = self.table.get(self.pk(work_key), "budget")
        if item is None:
            return None
        return BudgetState(work_key, int(item["count"]), int(item["first_seen_ns"]), int(item["last_seen_ns"]),
                           False, str(item.get("last_reason", "")))

    def clear(self, work_key: str) -> None:
        self.table.delete(self.pk(work_key), "budget")
        with self._lock:
            self._recorded.discard(work_key)

    def clear_after_success(self, work_key: str, *, previously_failed: bool) -> bool:
        """Clear the budget of a unit that just succeeded, if a failure may have been recorded for
        it: ``previously_failed`` (the caller knows) or this process recorded one. True if it
        sent the ``DeleteItem``; the happy path sends nothing."""
        if not (previously_failed or self.failed_here(work_key)):
            return False
        self.clear(work_key)
        return True

    def failed_here(self, work_key: str) -> bool:
        """Whether this process recorded a failure of ``work_key`` (and no success cleared it)."""
        with self._lock:
            return work_key in self._recorded

    def remember_failure(self, work_key: str) -> None:
        """Note in this process that ``work_key`` failed (a refusal blocks it without a budget item)."""
        with self._lock:
            if len(self._recorded) >= _RECORDED_MAX:
                self._recorded.clear()
            self._recorded.add(work_key)
