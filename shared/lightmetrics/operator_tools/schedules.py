"""Which schedules a deployment runs, and with what input, by whether its bucket has an S3 Inventory
(infra/config.py ``inventory``; issue 26). The schedules themselves are in
:mod:`lightmetrics.deployment.resources`; the CDK app and the keep-up model choose among them here.

Example:
    >>> scheduled("bootstrap-walk", inventory=True)
    False
"""

from __future__ import annotations

from lightmetrics.deployment.resource_types import StateMachineSpec

__all__ = ["INVENTORY_SCHEDULES", "NO_INVENTORY_SCHEDULES", "schedule_input", "scheduled"]

#: Schedules that exist in one kind of deployment only (issue 26; infra/config.py ``inventory``).
#: With an S3 Inventory the weekly audit reads it, proves the derived indexes complete and moves
#: every watermark (§13 W6): the walk is then the bootstrap and the repair, started by an operator.
#: Without one the audit has nothing to read and the weekly walk is the fallback (W3).
INVENTORY_SCHEDULES = frozenset({"audit"})
NO_INVENTORY_SCHEDULES = frozenset({"bootstrap-walk"})


def scheduled(name: str, *, inventory: bool) -> bool:
    """Whether the schedule of ``name`` (a state machine or a pipeline job) is deployed on a bucket
    with (``inventory=True``) or without an S3 Inventory. Every other schedule always is.

    >>> scheduled("bootstrap-walk", inventory=True), scheduled("bootstrap-walk", inventory=False)
    (False, True)
    >>> scheduled("audit", inventory=False), scheduled("rollup", inventory=False)
    (False, True)
    """
    if name in INVENTORY_SCHEDULES:
        return inventory
    return not inventory if name in NO_INVENTORY_SCHEDULES else True


def schedule_input(spec: StateMachineSpec, *, inventory: bool) -> str | None:
    """The input the schedule of ``spec`` sends on a bucket with or without an S3 Inventory: GC's
    candidates come from the newest audit where one runs, from ``raw-blobs-by-time`` where none does.

    >>> import json
    >>> from lightmetrics.deployment.resources import SPEC
    >>> json.loads(schedule_input(SPEC.state_machine("reap"), inventory=False))["source"]
    'by-time'
    """
    if not inventory and spec.no_inventory_schedule_input is not None:
        return spec.no_inventory_schedule_input
    return spec.schedule_input
