"""DynamoDB's values as the in-memory table keeps them (boto3's deserialized types) and how
expressions compare them: a missing attribute or a value of another type compares false (``<>``:
true); strings and binaries order by their bytes, numbers by value; ``bool`` is no number.

Example:
    >>> COMPARE["<"](Decimal(1), "2"), COMPARE["<>"](MISSING, "x")
    (False, True)
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

#: An attribute the item does not have.
MISSING: Any = object()


class UnsupportedValue(Exception):
    """A value of a type DynamoDB does not store."""


def dynamo_type(v: Any) -> str:
    """The DynamoDB type of a deserialized value (``bool`` is not a number there)."""
    if isinstance(v, bool):
        return "BOOL"
    if isinstance(v, Decimal):
        return "N"
    if isinstance(v, str):
        return "S"
    if isinstance(v, (bytes, bytearray)) or type(v).__name__ == "Binary":
        return "B"
    if v is None:
        return "NULL"
    if isinstance(v, list):
        return "L"
    if isinstance(v, dict):
        return "M"
    if isinstance(v, set):
        kinds = {dynamo_type(x) for x in v}
        return {"S": "SS", "N": "NS", "B": "BS"}.get(kinds.pop() if len(kinds) == 1 else "", "SET")
    raise UnsupportedValue(f"a value of type {type(v).__name__}")


def ordered(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` can be ordered (both present, both S, N or B)."""
    return a is not MISSING and b is not MISSING and dynamo_type(a) == dynamo_type(b) in ("S", "N", "B")


def sort_key(v: Any) -> Any:
    """How DynamoDB orders a value: strings and binaries by their bytes, numbers by value."""
    return v.encode() if isinstance(v, str) else bytes(v) if dynamo_type(v) == "B" else v


def equal(a: Any, b: Any) -> bool:
    return a is not MISSING and b is not MISSING and dynamo_type(a) == dynamo_type(b) and a == b


COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": equal,
    "<>": lambda a, b: not equal(a, b),
    "<": lambda a, b: ordered(a, b) and sort_key(a) < sort_key(b),
    "<=": lambda a, b: ordered(a, b) and sort_key(a) <= sort_key(b),
    ">": lambda a, b: ordered(a, b) and sort_key(a) > sort_key(b),
    ">=": lambda a, b: ordered(a, b) and sort_key(a) >= sort_key(b),
}


__all__ = ["COMPARE", "MISSING", "UnsupportedValue", "dynamo_type", "equal", "ordered", "sort_key"]
