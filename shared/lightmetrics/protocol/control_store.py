"""The control-table port: what services need from the control table, and the errors it raises.

Services (leases, budgets, blockers, checkpoints, the walk's and the reaper's records) talk to
:class:`ControlStore`; the adapter that ships is :class:`lightmetrics.aws.control_table.ControlTable`
(DynamoDB through boto3), and tests also run :class:`InMemoryControlTable`. Items are plain dicts
keyed by ``pk``/``sk``; expressions are DynamoDB's expression language (see docs/control-table.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class ConditionFailed(Exception):
    """A conditional write's condition did not hold. ``retried``: the client sent the request more
    than once, so an earlier attempt may have landed and broken the condition itself (an adapter
    that cannot tell leaves it True; docs/protocol.md §11.1)."""

    def __init__(self, *args: object, retried: bool = True) -> None:
        super().__init__(*args)
        self.retried = retried


class TransactionCancelled(ConditionFailed):
    """A transaction lost a condition; ``failed[i]`` says whether operation ``i``'s condition failed."""

    def __init__(self, failed: list[bool]) -> None:
        super().__init__(f"transaction cancelled: {failed}")
        self.failed = failed


class ControlStore(Protocol):
    """The table operations services call; every write may be conditional (:class:`ConditionFailed`)."""

    def get(self, pk: str, sk: str, *, consistent: bool = True) -> dict[str, Any] | None: ...

    def put(self, values: dict[str, Any], *, condition: str | None = None, names: dict[str, str] | None = None,
            values_for_condition: dict[str, Any] | None = None) -> None: ...

    def update(self, pk: str, sk: str, expression: str, *, names: dict[str, str] | None = None,
               values: dict[str, Any] | None = None, condition: str | None = None) -> dict[str, Any]: ...

    def delete(self, pk: str, sk: str, *, condition: str | None = None,
               values_for_condition: dict[str, Any] | None = None) -> None: ...

    def transact(self, ops: list[Op]) -> None:
        """All operations or none (at most 100); :class:`TransactionCancelled` names the failed conditions."""
        ...

    def query_page(self, pk: str, *, limit: int, newest_first: bool = False, filter_expression: str | None = None,
                   names: dict[str, str] | None = None, values: dict[str, Any] | None = None,
                   start_after_sk: str | None = None) -> tuple[list[dict[str, Any]], str | None]: ...

    def query(self, pk: str, *, limit: int | None = None, sk_prefix: str | None = None) -> list[dict[str, Any]]: ...


@dataclass
class Op:
    """One item operation of a transaction: ``Update`` (with ``expression``), ``Put`` (with
    ``item``) or ``Delete``; each optionally conditional.

    Example:
        >>> Op("Update", "lease#walk", "lease", "SET #x = :x", {"#x": "expires_at_ns"}, {":x": 0}).kind
        'Update'
    """

    kind: str
    pk: str
    sk: str
    expression: str = ""
    names: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    condition: str | None = None
    item: dict[str, Any] | None = None

    def apply(self, table: ControlStore) -> None:
        """This one operation on its own (``Update`` only); raises ``ConditionFailed``."""
        assert self.kind == "Update"
        table.update(self.pk, self.sk, self.expression, names=self.names or None, values=self.values or None,
                     condition=self.condition)


def optional(item: Mapping[str, Any], name: str, kind: Callable[[Any], T]) -> T | None:
    """``item[name]`` converted by ``kind``, or None where the item lacks it (or stores null): how a
    typed record reads an attribute an older writer did not store.

    >>> optional({"n": Decimal("3")}, "n", int), optional({}, "n", int)
    (3, None)
    """
    value = item.get(name)
    return None if value is None else kind(value)


def counts_of(raw: Any) -> dict[str, int]:
    """A stored map of counters (absent: empty) as ``{name: int}``.

    >>> counts_of({"DONE": Decimal("2")}), counts_of(None)
    ({'DONE': 2}, {})
    """
    return {str(k): int(v) for k, v in dict(raw or {}).items()}


def plain(value: Any) -> Any:
    """DynamoDB values (nested Decimals) as plain JSON types.

    >>> plain({"n": Decimal("3"), "xs": [Decimal("0.5")]})
    {'n': 3, 'xs': [0.5]}
    """
    if isinstance(value, Decimal):
        return int(value) if value == int(value) else float(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
