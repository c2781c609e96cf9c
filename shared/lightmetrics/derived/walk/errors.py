"""The errors a walk task raises on purpose: the class name is the Step Functions error name (the
ASL's Retry and Catch match on it; docs/walks.md)."""

from __future__ import annotations


class WalkError(Exception):
    """Base of the errors a walk task raises on purpose."""


class NothingToResume(WalkError):
    """``resume`` was asked for but the last walk of that scope finished (or never ran)."""


class NothingToWalk(WalkError):
    """An agent-scoped walk of an agent with no acceptance records and no conflict evidence."""


class InvalidWalkInput(WalkError):
    """The execution input is not a walk input (docs/walks.md)."""


class WalkRetryLater(WalkError):
    """Keys of this page ended RETRY_LATER: the cursor did not move; retry the page later."""


class WalkTransient(WalkError):
    """S3 or DynamoDB failed transiently outside a unit of work; retry the task."""


__all__ = ["InvalidWalkInput", "NothingToResume", "NothingToWalk", "WalkError", "WalkRetryLater", "WalkTransient"]
