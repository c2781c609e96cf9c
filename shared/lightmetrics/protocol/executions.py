"""What the walk and the reap share about Step Functions executions: the port through which they
start, continue, describe and read the history of executions (:class:`Executions`; its adapter on a
Step Functions client is :class:`lightmetrics.aws.step_functions.StepFunctionsExecutions`, built by
the composition root), the history limit, checking an execution's input, and reading a failed
task's error from a history (docs/walks.md, "History").

A standard execution has a hard limit of history events; a long job plans its executions under a
budget below it and then continues in a new execution under the same lease, epoch and owner.
The walk bounds its rounds (``lightmetrics.derived.walk.max_rounds_for``), the reap its tasks
(``lightmetrics.reaps.max_tasks_for``, rule G-B2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

#: Step Functions' hard limit per standard execution, and the budget the walk and the reap plan with.
HISTORY_LIMIT, HISTORY_BUDGET = 25_000, 20_000


@dataclass(frozen=True)
class ExecutionDescription:
    """What Step Functions says of one execution: its status (``RUNNING``, ``SUCCEEDED``, ``FAILED``,
    ``TIMED_OUT``, ``ABORTED``) and, once it failed, the error and cause of the state that caught it.

    >>> ExecutionDescription("arn:...:execution:reap:r1", "FAILED", "LeaseHeld").running
    False
    """

    arn: str
    status: str
    error: str = ""
    cause: str = ""

    @property
    def running(self) -> bool:
        return self.status == "RUNNING"


class Executions(Protocol):
    """The port of the executions a job starts and follows (the walk's, the reap's): the job kernel
    continues a run in a new execution (:meth:`continue_as`), the operator's side starts one and
    follows it (:meth:`start`, :meth:`describe`, :meth:`history`). Each method is one request to
    Step Functions, :meth:`history` one per page."""

    def start(self, state_machine_arn: str, name: str, payload: Mapping[str, Any]) -> str:
        """Start execution ``name`` of ``state_machine_arn`` with input ``payload``; its ARN."""
        ...

    def continue_as(self, state_machine_arn: str, name: str, payload: Mapping[str, Any]) -> str:
        """:meth:`start`, where a name already started is that execution (a retried task finds the
        execution it already started instead of starting a second)."""
        ...

    def describe(self, execution_arn: str) -> ExecutionDescription: ...

    def history(self, execution_arn: str) -> list[dict[str, Any]]:
        """Every history event of an execution, oldest first."""
        ...


class ExecutionInput:
    """An execution's input, checked to be a JSON object of known fields; bad input raises ``error``
    (the job's own error class: its name is the ASL's error name).

    >>> ExecutionInput({"page_size": 5}, ("page_size",), ValueError).integer("page_size", 1, 1, 10)
    5
    >>> ExecutionInput({"size": 5}, ("page_size",), ValueError)
    Traceback (most recent call last):
    ValueError: unknown input fields ['size']; known: ['page_size']
    """

    def __init__(self, raw: Any, fields: tuple[str, ...], error: type[Exception]) -> None:
        if not isinstance(raw, dict):
            raise error("the execution input must be a JSON object")
        unknown = set(raw) - set(fields)
        if unknown:
            raise error(f"unknown input fields {sorted(unknown)}; known: {list(fields)}")
        self.raw, self.error = raw, error

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        """Field ``name``: ``default`` if absent, else an integer in ``[low, high]`` (not a boolean)."""
        v = self.raw.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise self.error(f"{name} must be an integer in [{low}, {high}]")
        return v


def task_error(events: list[dict[str, Any]]) -> tuple[str, str]:
    """The first failed Lambda task's own error (its type, and its message as the task raised it),
    from an execution's history; ("", "") if none failed. The execution's own error and cause are
    those of the state that caught it, which say less (e.g. "invalid input").

    >>> task_error([{"lambdaFunctionFailedEventDetails": {"error": "InvalidReapInput",
    ...             "cause": '{"errorMessage": "hour is not older than LM_RETENTION_S"}'}}])
    ('InvalidReapInput', 'hour is not older than LM_RETENTION_S')
    """
    for ev in events:
        d = ev.get("lambdaFunctionFailedEventDetails")
        if d:
            try:
                message = str(json.loads(d.get("cause", "{}")).get("errorMessage", d.get("cause", "")))
            except (ValueError, AttributeError):
                message = str(d.get("cause", ""))
            return str(d.get("error", "")), message
    return "", ""


__all__ = ["HISTORY_BUDGET", "HISTORY_LIMIT", "ExecutionDescription", "ExecutionInput", "Executions", "task_error"]
