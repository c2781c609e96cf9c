"""The soak's plan (how hard to push: rates, periods, the collectors' injected S3 faults) and its report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.protocol.keys import KeyKind, layout_root


@dataclass(frozen=True)
class SoakPlan:
    """How hard to push. Rates are "every Nth" (deterministic), not probabilities."""

    minutes: float
    agents: int = 4
    collectors: int = 3
    batch_pause_s: float = 0.05  # between two batches of one agent
    samples_per_batch: int = 8
    conflict_every: int = 97  # every Nth batch of an agent is followed by other bytes for an earlier identity
    kill_every_s: float = 12.0
    restart_after_s: float = 1.5
    walk_every_s: float = 25.0
    gc_every_s: float = 45.0
    reconcile_every_s: float = 8.0
    drop_event_every: int = 37
    duplicate_delivery_every: int = 11
    s3_fault_every: int = 19  # base period of the collectors' injected S3 faults
    gc_grace_s: int = 12  # longer than the longest accept here (client timeout 10 s)
    retry_horizon_s: int = 60
    settle_timeout_s: float = 240.0
    seed: int = 7

    def __post_init__(self) -> None:
        if not 0 < self.minutes <= 24 * 60:
            raise ValueError("minutes must be > 0 and at most one day")
        if self.agents < 1 or self.collectors < 2:
            raise ValueError("a soak needs at least 1 agent and 2 collectors (failover)")


def collector_faults(plan: SoakPlan, i: int) -> list[dict[str, Any]]:
    """Collector i's ``LM_FAULTS``: a steady rate of each S3 fault kind, offset per collector."""
    n = plan.s3_fault_every
    return [
        {"fault": "409", "operation": "PutObject", "key_contains": layout_root(KeyKind.ACCEPTED), "every": n, "after": i,
         "times": -1},
        {"fault": "503", "operation": "PutObject", "key_contains": layout_root(KeyKind.RAW_BLOB), "every": n + 2, "after": i,
         "times": -1},
        {"fault": "timeout_after_landing", "operation": "PutObject", "key_contains": layout_root(KeyKind.ACCEPTED),
         "every": 2 * n + 1, "after": i, "times": -1},
        {"fault": "timeout_after_landing", "operation": "PutObject", "key_contains": layout_root(KeyKind.RAW_BLOB),
         "every": 2 * n + 3, "after": i, "times": -1},
        {"fault": "500", "operation": "GetObject", "every": n - 2, "after": i, "times": -1},
        {"fault": "timeout", "operation": "HeadObject", "every": n - 4, "after": i, "times": -1},
    ]


@dataclass
class SoakReport:
    plan: SoakPlan
    counters: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    verify: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    walks: list[dict[str, Any]] = field(default_factory=list)
    reaps: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # background-loop errors (not violations by themselves)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations and bool(self.verify.get("ok"))

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "minutes": self.plan.minutes, "counters": dict(sorted(self.counters.items())),
                "violations": self.violations[:50], "violation_count": len(self.violations),
                "verify": self.verify, "walks": self.walks, "reaps": self.reaps, "errors": self.errors[:20],
                "phase_seconds": {k: round(v, 1) for k, v in self.phases.items()}, "seconds": round(self.seconds, 1)}


__all__ = ["SoakPlan", "SoakReport", "collector_faults"]
