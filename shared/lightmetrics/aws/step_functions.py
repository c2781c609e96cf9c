"""The executions port (:class:`~lightmetrics.protocol.executions.Executions`) on a Step Functions
client: :class:`StepFunctionsExecutions`, what the walk and the reap start, continue, describe and
read the history of (docs/walks.md, "History"); the pure parts (the history limit, an execution's
input, a history's task error) are :mod:`lightmetrics.protocol.executions`.

A job near its history budget continues in a new execution under the same lease, epoch and
owner (:func:`start_continuation`).

Example (inside a ``cont`` task)::

    >>> StepFunctionsExecutions(sfn).continue_as(machine_arn, "walk-e3-1a2b3c4d-0002", {"continuation": {}})  # doctest: +SKIP
    'arn:aws:states:...:execution:...:walk-e3-1a2b3c4d-0002'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from lightmetrics.protocol.executions import ExecutionDescription


def start_continuation(sfn_client: Any, state_machine_arn: str, name: str, payload: Mapping[str, Any]) -> str:
    """Start execution ``name`` of ``state_machine_arn`` with input ``payload``; its ARN. The name
    is deterministic, so a retried task finds the execution it already started instead of a second."""
    try:
        return str(sfn_client.start_execution(stateMachineArn=state_machine_arn, name=name,
                                              input=json.dumps(payload, sort_keys=True))["executionArn"])
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ExecutionAlreadyExists":
            raise
        return state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"


def execution_history(sfn_client: Any, execution_arn: str) -> list[dict[str, Any]]:
    """Every history event of an execution, oldest first (all pages)."""
    events: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"executionArn": execution_arn, "maxResults": 1000}
    while True:
        page = sfn_client.get_execution_history(**kwargs)
        events.extend(page["events"])
        if not page.get("nextToken"):
            return events
        kwargs["nextToken"] = page["nextToken"]


class StepFunctionsExecutions:
    """The executions port on a Step Functions client (boto3's ``stepfunctions``).

    >>> StepFunctionsExecutions(sfn).describe(arn).status                     # doctest: +SKIP
    'RUNNING'
    """

    def __init__(self, client: Any) -> None:
        self.client = client

    def start(self, state_machine_arn: str, name: str, payload: Mapping[str, Any]) -> str:
        return str(self.client.start_execution(stateMachineArn=state_machine_arn, name=name,
                                               input=json.dumps(payload, sort_keys=True))["executionArn"])

    def continue_as(self, state_machine_arn: str, name: str, payload: Mapping[str, Any]) -> str:
        return start_continuation(self.client, state_machine_arn, name, payload)

    def describe(self, execution_arn: str) -> ExecutionDescription:
        d = self.client.describe_execution(executionArn=execution_arn)
        return ExecutionDescription(execution_arn, str(d["status"]), str(d.get("error", "")), str(d.get("cause", "")))

    def history(self, execution_arn: str) -> list[dict[str, Any]]:
        return execution_history(self.client, execution_arn)


__all__ = ["StepFunctionsExecutions", "execution_history", "start_continuation"]
