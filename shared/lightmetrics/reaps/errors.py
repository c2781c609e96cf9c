"""The errors a reap task raises on purpose: the class name is the Step Functions error name (the
ASL's Retry and Catch match on it; docs/reaps.md)."""

from __future__ import annotations


class ReapError(Exception):
    """Base of the errors a reap task raises on purpose (the class name is the ASL error name)."""


class InvalidReapInput(ReapError):
    """The execution input is not a reap input (docs/reaps.md, "Console input")."""


class ReapTransient(ReapError):
    """S3 or DynamoDB failed transiently; Step Functions retries the task."""



__all__ = ["InvalidReapInput", "ReapError", "ReapTransient"]
