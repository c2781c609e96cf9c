"""The outcome contract: how every unit of background work ends (docs/protocol.md §11).

Every event record, reconcile item, walk item and reap item ends as exactly one
:class:`Outcome`. Only ``RETRY_LATER`` makes the caller try again (the SQS message returns,
the cursor does not move past it); ``BLOCKED`` means a blocker record already exists.

Example:
    >>> WorkResult(Outcome.DONE, "index-accepted:accepted/v1/...").acknowledged
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Outcome(str, Enum):
    DONE = "DONE"  # the work was done now
    NOOP_RESOLVED = "NOOP_RESOLVED"  # already done, or no longer applicable
    RETRY_LATER = "RETRY_LATER"  # transient: try again; nothing moves past it
    BLOCKED = "BLOCKED"  # deterministic or sustained failure; its blocker is durable


@dataclass(frozen=True)
class WorkResult:
    outcome: Outcome
    work_key: str
    detail: str = ""

    @property
    def acknowledged(self) -> bool:
        """True when the unit is finished for its driver (the message may be deleted)."""
        return self.outcome is not Outcome.RETRY_LATER


class PermanentWorkError(Exception):
    """Raised by a unit of work whose failure will not go away by retrying (-> BLOCKED)."""

    def __init__(self, reason: str, *, kind: str = "permanent", alarm: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        #: name of a metric to raise (e.g. "InvariantViolation"), if the failure is an alarm
        self.alarm = alarm


class TransientWorkError(Exception):
    """Raised by a unit of work that may succeed later (-> RETRY_LATER, counted by the budget)."""
