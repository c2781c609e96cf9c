"""The calls on a Step Functions client the walk and the reap share: continuing in a new execution,
and reading an execution's history (docs/walks.md, "History"); the pure parts (the history limit,
an execution's input, a history's task error) are :mod:`lightmetrics.protocol.executions`.

A job near its history budget continues in a new execution under the same lease, epoch and
owner (:func:`start_continuation`).

Example (inside a ``cont`` task)::

    >>> start_continuation(sfn, machine_arn, "walk-e3-1a2b3c4d-0002", {"continuation": {}})  # doctest: +SKIP
    'arn:aws:states:...:execution:...:walk-e3-1a2b3c4d-0002'
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError


def start_continuation(sfn_client: Any, state_machine_arn: str, name: str, payload: dict[str, Any]) -> str:
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


__all__ = ["execution_history", "start_continuation"]
