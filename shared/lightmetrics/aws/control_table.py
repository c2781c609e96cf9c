"""The DynamoDB control table: one adapter for every record kind (see docs/control-table.md).

Key scheme (strings): retry budgets ``budget#<work-key>``/``budget``; blockers
``blockers``/``<work-key>``; checkpoints ``checkpoint#<name>``/``current``; leases
``lease#<name>``/``lease``; the identity denylist ``denylist``/``<agent-hex>#<boot-hex>``;
watermarks ``watermark#<index>``/``current``. TTL attribute: ``expires_at`` (epoch seconds).

Example:
    >>> table = ControlTable(boto3.client("dynamodb"), "lightmetrics-control")   # doctest: +SKIP
    >>> table.get("checkpoint#reconcile", "current")                             # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from lightmetrics.aws.errors import refused_access
from lightmetrics.protocol.control_store import ConditionFailed, Op, TransactionCancelled
from lightmetrics.protocol.errors import ResourceAccessError

_ser, _de = TypeSerializer(), TypeDeserializer()


def transact_item(op: Op, table: str) -> dict[str, Any]:
    """``op`` as one entry of ``TransactWriteItems``' ``TransactItems``."""
    out: dict[str, Any] = {"TableName": table}
    if op.kind == "Put":
        out["Item"] = to_item({**(op.item or {}), "pk": op.pk, "sk": op.sk})
    else:
        out["Key"] = to_item({"pk": op.pk, "sk": op.sk})
    if op.kind == "Update":
        out["UpdateExpression"] = op.expression
    if op.names:
        out["ExpressionAttributeNames"] = op.names
    if op.values:
        out["ExpressionAttributeValues"] = to_item(op.values)
    if op.condition:
        out["ConditionExpression"] = op.condition
    return {op.kind: out}


def to_item(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _ser.serialize(v) for k, v in values.items() if v is not None}


def from_item(item: dict[str, Any]) -> dict[str, Any]:
    out = {k: _de.deserialize(v) for k, v in item.items()}
    for k, v in out.items():  # DynamoDB numbers come back as Decimal
        if hasattr(v, "as_integer_ratio") and not isinstance(v, (int, float)):
            out[k] = int(v) if v == int(v) else float(v)
    return out


def table_error(exc: ClientError, table: str) -> Exception | None:
    """What a DynamoDB error means for the caller: a lost condition (:class:`ConditionFailed`), a
    table that does not exist or refuses us (:class:`ResourceAccessError` — never "no item"), or
    None (anything else: the caller's transient handling decides)."""
    code = exc.response.get("Error", {}).get("Code", "")
    if code == "ConditionalCheckFailedException":
        # botocore's own retries: only a retried request can have failed against its own first attempt
        return ConditionFailed(str(exc), retried=int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 1)) > 0)
    if code == "ResourceNotFoundException":
        return ResourceAccessError("table", table, "LM_TABLE", "does not exist")
    if code in ("AccessDeniedException", "AccessDenied"):
        return ResourceAccessError("table", table, "LM_TABLE", refused_access(exc))
    return None


class ControlTable:
    """The control-table port (:class:`~lightmetrics.protocol.control_store.ControlStore`) on DynamoDB,
    with an injectable boto3 client."""

    def __init__(self, client: Any, table_name: str) -> None:
        self.client = client
        self.name = table_name

    def _call(self, operation: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, operation)(TableName=self.name, **kwargs)
        except ClientError as exc:
            mapped = table_error(exc, self.name)
            if mapped is None:
                raise
            raise mapped from (None if isinstance(mapped, ConditionFailed) else exc)

    def get(self, pk: str, sk: str, *, consistent: bool = True) -> dict[str, Any] | None:
        r = self._call("get_item", Key=to_item({"pk": pk, "sk": sk}), ConsistentRead=consistent)
        return from_item(r["Item"]) if "Item" in r else None

    def put(self, values: dict[str, Any], *, condition: str | None = None, names: dict[str, str] | None = None,
            values_for_condition: dict[str, Any] | None = None) -> None:
        kwargs: dict[str, Any] = {"Item": to_item(values)}
        if condition:
            kwargs["ConditionExpression"] = condition
        if names:
            kwargs["ExpressionAttributeNames"] = names
        if values_for_condition:
            kwargs["ExpressionAttributeValues"] = to_item(values_for_condition)
        self._call("put_item", **kwargs)

    def update(self, pk: str, sk: str, expression: str, *, names: dict[str, str] | None = None,
               values: dict[str, Any] | None = None, condition: str | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "Key": to_item({"pk": pk, "sk": sk}),
            "UpdateExpression": expression,
            "ReturnValues": "ALL_NEW",
        }
        if names:
            kwargs["ExpressionAttributeNames"] = names
        if values:
            kwargs["ExpressionAttributeValues"] = to_item(values)
        if condition:
            kwargs["ConditionExpression"] = condition
        return from_item(self._call("update_item", **kwargs)["Attributes"])

    def delete(self, pk: str, sk: str, *, condition: str | None = None,
               values_for_condition: dict[str, Any] | None = None) -> None:
        """Delete an item; with ``condition``, only if it holds (else :class:`ConditionFailed`)."""
        kwargs: dict[str, Any] = {"Key": to_item({"pk": pk, "sk": sk})}
        if condition:
            kwargs["ConditionExpression"] = condition
        if values_for_condition:
            kwargs["ExpressionAttributeValues"] = to_item(values_for_condition)
        self._call("delete_item", **kwargs)

    def transact(self, ops: list[Op]) -> None:
        """All operations or none (``TransactWriteItems``, at most 100); raises
        :class:`TransactionCancelled` naming the failed conditions. Conflicts and throttling
        (cancelled without a failed condition) raise botocore's error: transient, the caller retries."""
        try:
            self.client.transact_write_items(TransactItems=[transact_item(op, self.name) for op in ops])
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "TransactionCanceledException":
                mapped = table_error(exc, self.name)
                if mapped is None:
                    raise
                raise mapped from exc
            reasons = exc.response.get("CancellationReasons") or []
            failed = [r.get("Code") == "ConditionalCheckFailed" for r in reasons]
            if not any(failed):
                raise
            raise TransactionCancelled(failed + [False] * (len(ops) - len(failed))) from None

    def query_page(self, pk: str, *, limit: int, newest_first: bool = False, filter_expression: str | None = None,
                   names: dict[str, str] | None = None, values: dict[str, Any] | None = None,
                   start_after_sk: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """One ``Query`` request of partition ``pk`` (strongly consistent): the items that pass
        ``filter_expression`` among the next ``limit`` sort keys after ``start_after_sk``, and the
        sort key to continue after (None: the partition ended). ``:pk`` is reserved in ``values``.

        Example:
            >>> items, after = table.query_page("conflicts", limit=50, newest_first=True)   # doctest: +SKIP
        """
        kwargs: dict[str, Any] = {"KeyConditionExpression": "pk = :pk", "ScanIndexForward": not newest_first,
                                  "Limit": limit, "ConsistentRead": True,
                                  "ExpressionAttributeValues": to_item({**(values or {}), ":pk": pk})}
        if filter_expression:
            kwargs["FilterExpression"] = filter_expression
        if names:
            kwargs["ExpressionAttributeNames"] = names
        if start_after_sk is not None:
            kwargs["ExclusiveStartKey"] = to_item({"pk": pk, "sk": start_after_sk})
        r = self._call("query", **kwargs)
        last = r.get("LastEvaluatedKey")
        return [from_item(i) for i in r.get("Items", [])], (str(from_item(last)["sk"]) if last else None)

    def query(self, pk: str, *, limit: int | None = None, sk_prefix: str | None = None) -> list[dict[str, Any]]:
        """The items of partition ``pk`` (strongly consistent, every page), only those whose sort
        key begins with ``sk_prefix`` when given (read capacity is spent on those alone)."""
        items: list[dict[str, Any]] = []
        condition, values = "pk = :pk", {":pk": pk}
        if sk_prefix:
            condition, values = "pk = :pk AND begins_with(sk, :sk)", {":pk": pk, ":sk": sk_prefix}
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": to_item(values),
            "ConsistentRead": True,
        }
        while True:
            r = self._call("query", **kwargs)
            items.extend(from_item(i) for i in r.get("Items", []))
            if limit is not None and len(items) >= limit:
                return items[:limit]
            if "LastEvaluatedKey" not in r:
                return items
            kwargs["ExclusiveStartKey"] = r["LastEvaluatedKey"]
