"""What ``lmctl verify`` reports (:mod:`lightmetrics.operator_tools.verify`): findings by rule, and the
``pending`` ones with their age.

A ``pending`` record (newer than its index's watermark W, lacking the entry: docs/protocol.md
§13.1) is expected while the event path or the next walk may still write the entry; its age says
how long it has been so. An entry lost behind the system's back stays ``pending`` only until an
authoritative check moves W past it (a clean walk, or the weekly audit: protocol §13 W3, W6) — an
old ``pending`` finding is the sign that W is held back (``lmctl walk status``, the audit summary's
``watermarks.withheld`` say why).

Example:
    >>> p = PendingFinding("accepted-by-blob", ("accepted/v1/a.json",), 1_764_000_000 * 10**9, 7200)
    >>> p.to_json()["accepted_at"], p.age_text()
    ('2025-11-24 16:00:00Z', '2.0 h')
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.operator_tools import invariants as inv
from lightmetrics.protocol.clock import utc_text


@dataclass(frozen=True)
class Finding:
    rule: str  # a name from lightmetrics.operator_tools.invariants.RULES
    keys: tuple[str, ...]
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "keys": list(self.keys), "detail": self.detail}


@dataclass(frozen=True)
class PendingFinding:
    """A record (or quarantine manifest) newer than ``index``'s W without its entry, and how old it is."""

    index: str
    keys: tuple[str, ...]
    accepted_at_ns: int  # the record's accepted_at_unix_ns (a quarantine manifest's observed_at_unix_ns)
    age_s: int  # the verifying clock's now minus accepted_at, in whole seconds

    def age_text(self) -> str:
        s = self.age_s
        return f"{s} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else \
            f"{s / 3600:.1f} h" if s < 172_800 else f"{s / 86400:.1f} d"

    def to_json(self) -> dict[str, Any]:
        return {"rule": inv.PENDING.name, "index": self.index, "keys": list(self.keys),
                "accepted_at": utc_text(self.accepted_at_ns), "accepted_at_ns": self.accepted_at_ns, "age_s": self.age_s}


@dataclass
class VerifyReport:
    strict: bool
    counts: dict[str, int] = field(default_factory=dict)
    checked: Counter[str] = field(default_factory=Counter)
    expected: Counter[str] = field(default_factory=Counter)  # rule name -> objects in that expected state
    pending: Counter[str] = field(default_factory=Counter)  # index -> records newer than W without the entry
    pending_findings: list[PendingFinding] = field(default_factory=list)  # each of them, the oldest first
    watermarks: dict[str, int | None] = field(default_factory=dict)
    violations: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    acknowledged: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def violation_counts(self) -> dict[str, int]:
        return dict(Counter(v.rule for v in self.violations))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "strict": self.strict,
            "counts": self.counts,
            "checked": dict(self.checked),
            "expected": dict(self.expected),
            "pending": dict(self.pending),
            "pending_findings": [p.to_json() for p in self.pending_findings],
            "watermarks": self.watermarks,
            "violations": [v.to_json() for v in self.violations],
            "violation_counts": self.violation_counts(),
            "warnings": [w.to_json() for w in self.warnings],
            "acknowledged": [a.to_json() for a in self.acknowledged],
        }


__all__ = ["Finding", "PendingFinding", "VerifyReport"]
