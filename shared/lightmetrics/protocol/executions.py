"""What the walk and the reap share about Step Functions executions, apart from the client: the
history limit, checking an execution's input, and reading a failed task's error from a history
(docs/walks.md, "History"). The calls on a client are :mod:`lightmetrics.aws.step_functions`.

A standard execution has a hard limit of history events; a long job plans its executions under a
budget below it and then continues in a new execution under the same lease, epoch and owner.
The walk bounds its rounds (``lightmetrics.derived.walk.max_rounds_for``), the reap its tasks
(``lightmetrics.reaps.max_tasks_for``, rule G-B2).
"""

from __future__ import annotations

import json
from typing import Any

#: Step Functions' hard limit per standard execution, and the budget the walk and the reap plan with.
HISTORY_LIMIT, HISTORY_BUDGET = 25_000, 20_000


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
