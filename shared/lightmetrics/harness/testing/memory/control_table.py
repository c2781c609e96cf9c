"""An in-memory :class:`~lightmetrics.aws.control_table.ControlTable`: DynamoDB's semantics our code uses.

It answers as the boto3-backed adapter does — the same items (top-level numbers as ``int``/``float``,
nested ones as ``Decimal``), :class:`ConditionFailed` for a lost condition,
:class:`TransactionCancelled` naming the failed conditions, a :class:`ResourceAccessError` for a
table that does not exist, and botocore's ``ClientError`` (``ValidationException``) where DynamoDB
refuses a request: an undefined or unused expression name or value, two operations of one
transaction on one item, more than 100 operations, an item over 400 KB, an update of the key.
Expressions are parsed by :mod:`lightmetrics.harness.testing.memory.expressions` (unsupported forms raise).
``tests/test_memory_contract.py`` runs the same tests against this table and moto's.

Example:
    >>> table = InMemoryControlTable()
    >>> table.put({"pk": "lease#walk", "sk": "lease", "epoch": 1}, condition="attribute_not_exists(pk)")
    >>> table.get("lease#walk", "lease")["epoch"]
    1
"""

from __future__ import annotations

import threading
from collections import Counter
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from lightmetrics.aws.control_table import ControlTable, table_error
from lightmetrics.harness.testing.memory.dynamo_values import dynamo_type
from lightmetrics.harness.testing.memory.expressions import (
    Bindings,
    ExpressionInvalid,
    deep_copy,
    parse_condition,
    parse_update,
)
from lightmetrics.protocol.control_store import ConditionFailed, Op, TransactionCancelled

_ser, _de = TypeSerializer(), TypeDeserializer()
KEY = ("pk", "sk")
#: DynamoDB's limits: item size, operations per transaction.
MAX_ITEM_BYTES = 400 * 1024
MAX_TRANSACTION_OPS = 100


def _client_error(operation: str, code: str, message: str, **extra: Any) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 400},
                        **extra}, operation)


def _stored(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as DynamoDB keeps them (the adapter's own serializer: floats refused, None dropped)."""
    return {k: _kept(v) for k, v in values.items() if v is not None}


_MAX_INT = 10**38  # an int of at most 38 digits is a DynamoDB number exactly


def _kept(v: Any) -> Any:
    """``_de.deserialize(_ser.serialize(v))``: the common types directly (what the serializer makes
    of them), anything else — floats (refused), sets, binaries, subclasses — through the serializer."""
    t = type(v)
    if t is str or t is bool or v is None:
        return v
    if t is int and -_MAX_INT < v < _MAX_INT:
        return Decimal(v)
    if t is dict:
        return {k: _kept(x) for k, x in v.items()}
    if t is list or t is tuple:
        return [_kept(x) for x in v]
    return _de.deserialize(_ser.serialize(v))


def _answer(item: dict[str, Any]) -> dict[str, Any]:
    """A stored item as the adapter returns it: ``from_item(to_item(item))`` — a copy, top-level
    numbers as ``int``/``float`` — without the wire format's round trip (the values are stored ones)."""
    out = {k: deep_copy(v) for k, v in item.items()}
    for k, v in out.items():
        if isinstance(v, Decimal):
            out[k] = int(v) if v == int(v) else float(v)
    return out


def _may_exceed(item: dict[str, Any]) -> bool:
    """False when ``item`` is surely under the size limit: its ``repr`` spells every name and value
    (a number in more characters than its size), each character at most 4 bytes of UTF-8."""
    return 4 * len(repr(item)) > MAX_ITEM_BYTES


def item_size(item: dict[str, Any]) -> int:
    """DynamoDB's item size rules (names plus values; a number about a byte per two digits)."""
    def size(v: Any) -> int:
        t = dynamo_type(v)
        if t == "S":
            return len(v.encode())
        if t == "N":
            return len(v.as_tuple().digits) // 2 + 2
        if t == "B":
            return len(bytes(v))
        if t in ("BOOL", "NULL"):
            return 1
        if t == "L":
            return 3 + sum(size(x) + 1 for x in v)
        if t == "M":
            return 3 + sum(len(k.encode()) + size(x) + 1 for k, x in v.items())
        return sum(size(x) for x in v)
    return sum(len(k.encode()) + size(v) for k, v in item.items())


class _NoClient:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the in-memory control table has no boto3 client ({name})")


class InMemoryControlTable(ControlTable):
    """The control table's port in memory (thread-safe). ``requests`` counts calls by DynamoDB
    operation; :meth:`fail` makes the next matching calls raise a DynamoDB error code."""

    def __init__(self, table_name: str = "lightmetrics-control", *, exists: bool = True) -> None:
        super().__init__(_NoClient(), table_name)
        self.exists = exists
        self.requests: Counter[str] = Counter()
        self._items: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._faults: list[list[Any]] = []  # [operation, code, times left]

    # -- test controls -------------------------------------------------------------------------------
    def fail(self, operation: str, code: str, *, times: int = 1) -> None:
        """The next ``times`` calls of ``operation`` (``GetItem``, ``PutItem``, ``UpdateItem``,
        ``DeleteItem``, ``TransactWriteItems``, ``Query``) answer error ``code``."""
        self._faults.append([operation, code, times])

    def clear_faults(self) -> None:
        """Forget the faults :meth:`fail` armed and no call has met yet."""
        self._faults.clear()

    def items(self) -> list[dict[str, Any]]:
        """Every item, as :meth:`get` returns them, in key order."""
        with self._lock:
            return [_answer(self._items[k]) for k in sorted(self._items)]

    # -- the port ------------------------------------------------------------------------------------
    def _request(self, operation: str) -> None:
        """Count a request; raise as the adapter does for a missing table or an injected error."""
        self.requests[operation] += 1
        error: ClientError | None = None
        if not self.exists:
            error = _client_error(operation, "ResourceNotFoundException", "Requested resource not found")
        for fault in self._faults:
            if fault[0] == operation and fault[2] != 0:
                fault[2] -= 1
                error = _client_error(operation, fault[1], f"injected {fault[1]}")
                break
        if error is not None:
            mapped = table_error(error, self.name)
            raise mapped if mapped is not None else error

    def get(self, pk: str, sk: str, *, consistent: bool = True) -> dict[str, Any] | None:
        with self._lock:
            self._request("GetItem")
            item = self._items.get((pk, sk))
            return _answer(item) if item is not None else None

    def put(self, values: dict[str, Any], *, condition: str | None = None, names: dict[str, str] | None = None,
            values_for_condition: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._request("PutItem")
            self._apply("PutItem", Op("Put", "", "", names=names or {}, values=values_for_condition or {},
                                      condition=condition, item=values), single=True)

    def update(self, pk: str, sk: str, expression: str, *, names: dict[str, str] | None = None,
               values: dict[str, Any] | None = None, condition: str | None = None) -> dict[str, Any]:
        with self._lock:
            self._request("UpdateItem")
            op = Op("Update", pk, sk, expression, names or {}, values or {}, condition)
            self._apply("UpdateItem", op, single=True)
            return _answer(self._items[(pk, sk)])

    def delete(self, pk: str, sk: str, *, condition: str | None = None,
               values_for_condition: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._request("DeleteItem")
            self._apply("DeleteItem", Op("Delete", pk, sk, values=values_for_condition or {}, condition=condition),
                        single=True)

    def transact(self, ops: list[Op]) -> None:
        with self._lock:
            self._request("TransactWriteItems")
            if not ops or len(ops) > MAX_TRANSACTION_OPS:
                raise _client_error("TransactWriteItems", "ValidationException",
                                    f"Member must have length between 1 and {MAX_TRANSACTION_OPS}")
            keys = [self._key_of(op) for op in ops]
            if len(set(keys)) != len(keys):
                raise _client_error("TransactWriteItems", "ValidationException",
                                    "Transaction request cannot include multiple operations on one item")
            planned = [self._plan("TransactWriteItems", op) for op in ops]  # validation first, as DynamoDB
            failed = [new is _FAILED for new in planned]
            if any(failed):
                raise TransactionCancelled(failed)
            for key, new in zip(keys, planned):
                self._write(key, new)

    def query_page(self, pk: str, *, limit: int, newest_first: bool = False, filter_expression: str | None = None,
                   names: dict[str, str] | None = None, values: dict[str, Any] | None = None,
                   start_after_sk: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        with self._lock:
            self._request("Query")
            bindings = Bindings(names or {}, _stored({**(values or {}), ":pk": pk}))
            self._check(bindings, "pk = :pk", filter_expression)
            cond = parse_condition(filter_expression) if filter_expression else None
            sks = self._sks(pk, newest_first)
            if start_after_sk is not None:
                after = start_after_sk.encode()
                sks = [s for s in sks if (s.encode() < after if newest_first else s.encode() > after)]
            page = sks[:limit]
            items = [self._items[(pk, s)] for s in page]
            out = [_answer(i) for i in items if cond is None or cond.evaluate(i, bindings)]
            return out, (page[-1] if len(page) == limit and len(sks) > limit else None)

    def query(self, pk: str, *, limit: int | None = None, sk_prefix: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            self._request("Query")
            sks = [s for s in self._sks(pk, False) if sk_prefix is None or s.encode().startswith(sk_prefix.encode())]
            items = [_answer(self._items[(pk, s)]) for s in sks]
            return items[:limit] if limit is not None else items

    # -- the semantics -------------------------------------------------------------------------------
    def _sks(self, pk: str, newest_first: bool) -> list[str]:
        return sorted((s for p, s in self._items if p == pk), key=str.encode, reverse=newest_first)

    def _key_of(self, op: Op) -> tuple[str, str]:
        if op.kind == "Put" and not op.pk:
            item = op.item or {}
            return (item.get("pk"), item.get("sk"))  # type: ignore[return-value]
        return (op.pk, op.sk)

    def _check(self, bindings: Bindings, *expressions: str | None) -> None:
        try:
            bindings.check(*expressions)
        except ExpressionInvalid as exc:
            raise _client_error("", "ValidationException", str(exc)) from None

    def _plan(self, operation: str, op: Op) -> Any:
        """The item ``op`` leaves at its key (None: deleted), or ``_FAILED`` if its condition fails.
        Invalid requests raise ``ValidationException`` as DynamoDB does."""
        key = self._key_of(op)
        if not all(isinstance(k, str) and k for k in key):
            raise _client_error(operation, "ValidationException", "One or more parameter values were invalid: "
                                "the key must be two non-empty strings pk and sk")
        if op.kind not in ("Put", "Update", "Delete"):
            raise _client_error(operation, "ValidationException", f"unsupported transaction operation {op.kind}")
        bindings = Bindings(dict(op.names), _stored(op.values))
        self._check(bindings, op.expression if op.kind == "Update" else None, op.condition)
        old = self._items.get(key)
        try:
            new: Any = None
            if op.kind == "Put":
                new = _stored({**(op.item or {}), "pk": key[0], "sk": key[1]})
            elif op.kind == "Update":
                new = parse_update(op.expression).apply(old or {"pk": key[0], "sk": key[1]}, bindings, KEY)
            if op.condition and not parse_condition(op.condition).evaluate(old or {}, bindings):
                return _FAILED
        except ExpressionInvalid as exc:
            raise _client_error(operation, "ValidationException", str(exc)) from None
        if new is not None and _may_exceed(new) and item_size(new) > MAX_ITEM_BYTES:
            raise _client_error(operation, "ValidationException", "Item size has exceeded the maximum allowed size")
        return new

    def _apply(self, operation: str, op: Op, *, single: bool) -> None:
        new = self._plan(operation, op)
        if new is _FAILED:
            raise ConditionFailed("An error occurred (ConditionalCheckFailedException): The conditional request failed")
        self._write(self._key_of(op), new)

    def _write(self, key: tuple[str, str], new: dict[str, Any] | None) -> None:
        if new is None:
            self._items.pop(key, None)
        else:
            self._items[key] = new


_FAILED: Any = object()
__all__ = ["InMemoryControlTable", "item_size", "MAX_ITEM_BYTES", "MAX_TRANSACTION_OPS"]
