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

_ser, _de = TypeSerializer(), TypeDeserializer()


class ConditionFailed(Exception):
    """A conditional write lost (someone else changed the item first)."""


def to_item(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _ser.serialize(v) for k, v in values.items() if v is not None}


def from_item(item: dict[str, Any]) -> dict[str, Any]:
    out = {k: _de.deserialize(v) for k, v in item.items()}
    for k, v in out.items():  # DynamoDB numbers come back as Decimal
        if hasattr(v, "as_integer_ratio") and not isinstance(v, (int, float)):
            out[k] = int(v) if v == int(v) else float(v)
    return out


class ControlTable:
    """Thin typed access to the control table with an injectable boto3 client."""

    def __init__(self, client: Any, table_name: str) -> None:
        self.client = client
        self.name = table_name

    def get(self, pk: str, sk: str, *, consistent: bool = True) -> dict[str, Any] | None:
        r = self.client.get_item(TableName=self.name, Key=to_item({"pk": pk, "sk": sk}), ConsistentRead=consistent)
        return from_item(r["Item"]) if "Item" in r else None

    def put(self, values: dict[str, Any], *, condition: str | None = None, names: dict[str, str] | None = None,
            values_for_condition: dict[str, Any] | None = None) -> None:
        kwargs: dict[str, Any] = {"TableName": self.name, "Item": to_item(values)}
        if condition:
            kwargs["ConditionExpression"] = condition
        if names:
            kwargs["ExpressionAttributeNames"] = names
        if values_for_condition:
            kwargs["ExpressionAttributeValues"] = to_item(values_for_condition)
        try:
            self.client.put_item(**kwargs)
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                raise ConditionFailed(str(exc)) from None
            raise

    def update(self, pk: str, sk: str, expression: str, *, names: dict[str, str] | None = None,
               values: dict[str, Any] | None = None, condition: str | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "TableName": self.name,
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
        try:
            return from_item(self.client.update_item(**kwargs)["Attributes"])
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                raise ConditionFailed(str(exc)) from None
            raise

    def delete(self, pk: str, sk: str) -> None:
        self.client.delete_item(TableName=self.name, Key=to_item({"pk": pk, "sk": sk}))

    def query(self, pk: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self.name,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": to_item({":pk": pk}),
            "ConsistentRead": True,
        }
        while True:
            r = self.client.query(**kwargs)
            items.extend(from_item(i) for i in r.get("Items", []))
            if limit is not None and len(items) >= limit:
                return items[:limit]
            if "LastEvaluatedKey" not in r:
                return items
            kwargs["ExclusiveStartKey"] = r["LastEvaluatedKey"]
