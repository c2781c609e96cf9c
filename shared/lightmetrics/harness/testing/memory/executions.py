"""An in-memory adapter of the executions port (:class:`~lightmetrics.protocol.executions.Executions`)
for the drivers that run a job's tasks inline (``tests/reap_support.drive``, the simulation's walk and
reap drivers): a start records the execution's input, which the driver runs next as its Begin's.

Example:
    >>> executions = InlineExecutions()
    >>> arn = executions.continue_as("sm", "reap-e1-0123abcd-0002", {"continuation": {"tasks": 0}})
    >>> arn == executions.continue_as("sm", "reap-e1-0123abcd-0002", {"continuation": {}}), executions.inputs[arn]
    (True, {'continuation': {'tasks': 0}})
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lightmetrics.protocol.executions import ExecutionDescription


class InlineExecutions:
    """Executions named ``<prefix>:execution:<name>``; a repeated start of one name is one execution
    (as Step Functions answers ExecutionAlreadyExists), RUNNING until :meth:`end`."""

    def __init__(self, prefix: str = "inline") -> None:
        self.prefix = prefix
        #: each execution's input, as Step Functions hands it to the first state (JSON values)
        self.inputs: dict[str, dict[str, Any]] = {}
        self.statuses: dict[str, str] = {}

    def start(self, state_machine_arn: str, name: str, payload: Mapping[str, Any]) -> str:
        arn = f"{self.prefix}:execution:{name}"
        self.inputs.setdefault(arn, json.loads(json.dumps(payload, sort_keys=True)))
        self.statuses.setdefault(arn, "RUNNING")
        return arn

    def continue_as(self, state_machine_arn: str, name: str, payload: Mapping[str, Any]) -> str:
        return self.start(state_machine_arn, name, payload)

    def end(self, arn: str, status: str = "SUCCEEDED") -> None:
        self.statuses[arn] = status

    def describe(self, execution_arn: str) -> ExecutionDescription:
        return ExecutionDescription(execution_arn, self.statuses[execution_arn])

    def history(self, execution_arn: str) -> list[dict[str, Any]]:
        return []  # its tasks ran inline: no events are recorded


__all__ = ["InlineExecutions"]
