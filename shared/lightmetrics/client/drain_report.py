"""What the agent client reports: one :class:`BatchOutcome` per batch a drain acted on, the drain's
:class:`DrainReport`, and the :class:`Alert` it raises when a batch is parked for an operator
(:class:`lightmetrics.client.agent.AgentClient` builds them)."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.protocol.identity import BatchIdentity

log = logging.getLogger("lightmetrics.client.agent")

__all__ = ["Alert", "BatchOutcome", "DrainReport", "log_alert"]


@dataclass(frozen=True)
class Alert:
    """A local alert: ``kind`` is ``parked`` (a batch left the normal order), ``dropped``
    (a parked conflict was resolved ``accept_existing`` and its batch deleted) or ``unreadable``
    (a spool file was set aside; ``identity`` is None when its name names none)."""

    kind: str
    identity: BatchIdentity | None
    parked_kind: str
    http_status: int | None
    status: str | None
    resolution: str | None
    reason: str | None
    frame_sha256: str
    path: str
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def message(self) -> str:
        if self.kind == "unreadable":
            return f"lightmetrics agent: spool file set aside as unreadable ({self.path}): {self.reason}"
        what = {"parked": "parked", "dropped": "dropped (resolved accept_existing)"}.get(self.kind, self.kind)
        return (f"lightmetrics agent: batch {self.identity} {what}: {self.parked_kind} "
                f"(HTTP {self.http_status}, {self.status}): {self.reason or ''}").rstrip(": ")


def log_alert(alert: Alert) -> None:
    """The default alert sink: a WARNING on this module's logger."""
    log.warning("%s", alert.message)


@dataclass(frozen=True)
class BatchOutcome:
    """What happened to one batch in a pass. ``action``: ``accepted``, ``duplicate``, ``parked``,
    ``dropped``, ``kept_parked`` (a parked retry that changed nothing) or ``unavailable``
    (attempts exhausted; still spooled)."""

    identity: BatchIdentity
    action: str
    frame_sha256: str
    http_status: int | None = None
    status: str | None = None
    endpoint: str | None = None
    attempts: int = 0
    body: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"identity": str(self.identity), "manifest_id": self.identity.manifest_id, "action": self.action,
                "frame_sha256": self.frame_sha256, "http_status": self.http_status, "status": self.status,
                "endpoint": self.endpoint, "attempts": self.attempts}


@dataclass
class DrainReport:
    """Counts of one or more passes (``merge`` adds them); ``pending``/``parked*`` are the
    spool's state at the end of the last pass."""

    outcomes: list[BatchOutcome] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    failovers: int = 0
    network_errors: int = 0
    timeouts: int = 0
    backoffs: list[float] = field(default_factory=list)
    passes: int = 0
    pending: int = 0
    parked: int = 0
    parked_conflicts: int = 0
    parked_denied: int = 0
    unreadable: int = 0
    set_aside: int = 0
    exhausted: bool = False
    timed_out: bool = False

    def count(self, action: str) -> int:
        return sum(1 for o in self.outcomes if o.action == action)

    @property
    def accepted(self) -> int:
        return self.count("accepted")

    @property
    def duplicates(self) -> int:
        return self.count("duplicate")

    @property
    def newly_parked(self) -> int:
        return self.count("parked")

    @property
    def dropped(self) -> int:
        return self.count("dropped")

    @property
    def parked_invalid(self) -> int:
        return self.parked - self.parked_conflicts - self.parked_denied

    def merge(self, other: "DrainReport") -> None:
        self.outcomes += other.outcomes
        self.answers.update(other.answers)
        self.attempts += other.attempts
        self.failovers += other.failovers
        self.network_errors += other.network_errors
        self.timeouts += other.timeouts
        self.backoffs += other.backoffs
        self.passes += other.passes
        self.set_aside += other.set_aside
        self.pending, self.parked, self.parked_conflicts = other.pending, other.parked, other.parked_conflicts
        self.parked_denied, self.unreadable = other.parked_denied, other.unreadable
        self.exhausted = other.exhausted
        self.timed_out = self.timed_out or other.timed_out

    def to_json(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "parked_now": self.newly_parked,
            "dropped": self.dropped,
            "pending": self.pending,
            "parked": self.parked,
            "parked_conflicts": self.parked_conflicts,
            "parked_denied": self.parked_denied,
            "parked_invalid": self.parked_invalid,
            "unreadable": self.unreadable,
            "set_aside_now": self.set_aside,
            "answers": dict(self.answers),
            "attempts": self.attempts,
            "failovers": self.failovers,
            "network_errors": self.network_errors,
            "timeouts": self.timeouts,
            "backoffs": len(self.backoffs),
            "backoff_s": round(sum(self.backoffs), 3),
            "passes": self.passes,
            "exhausted": self.exhausted,
            "timed_out": self.timed_out,
        }
