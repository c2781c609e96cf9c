"""Durable retry budget: consecutive RETRY_LATER per work key, promoted to a blocker past a limit.

One item per work key in the control table (``budget#<work-key>``/``budget``): an atomic
counter plus first/last seen. Success clears it — but only when the unit is known to have failed
before (a redelivered message, a retried item), so the happy path costs no DynamoDB request.
Items carry a TTL so a budget that nobody clears expires.

Example:
    >>> budget = RetryBudget(table, max_count=5, max_age_s=3600, clock=clock)   # doctest: +SKIP
    >>> state = budget.record_failure("index-accepted:accepted/v1/...", "503")   # doctest: +SKIP
    >>> state.exhausted                                                         # doctest: +SKIP
    False
"""

from __future__ import annotations

from dataclasses import dataclass

from lightmetrics.clock import DEFAULT_CLOCK, Clock
from lightmetrics.control_table import ControlTable

_NS = 1_000_000_000


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
        self, table: ControlTable, *, max_count: int = 5, max_age_s: int = 3600, clock: Clock = DEFAULT_CLOCK
    ) -> None:
        self.table = table
        self.max_count = max_count
        self.max_age_s = max_age_s
        self.clock = clock

    @staticmethod
    def pk(work_key: str) -> str:
        return f"budget#{work_key}"

    def record_failure(self, work_key: str, reason: str) -> BudgetState:
        """Count one more consecutive failure (atomic) and say whether the budget is spent."""
        now = self.clock.now_ns()
        item = self.table.update(
            self.pk(work_key),
            "budget",
            "ADD #c :one SET #f = if_not_exists(#f, :now), #l = :now, #r = :reason, #w = :wk, #x = :exp",
            names={"#c": "count", "#f": "first_seen_ns", "#l": "last_seen_ns", "#r": "last_reason",
                   "#w": "work_key", "#x": "expires_at"},
            values={":one": 1, ":now": now, ":reason": reason[:1000], ":wk": work_key,
                    ":exp": now // _NS + 4 * max(self.max_age_s, 3600)},
        )
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
