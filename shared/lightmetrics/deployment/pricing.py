"""The price table the cost model (:mod:`lightmetrics.operator_tools.cost_model`, ``lmctl cost``) uses: editable, dated.

AWS list prices for us-east-1, on-demand, without free tiers or volume discounts (first tiers:
S3 Standard's first 50 TB, CloudWatch Logs' first 10 TB), as of the date below. They change: check
the AWS pricing pages before quoting a figure, edit ``PRICES`` (or pass ``lmctl cost --prices FILE``
with a JSON object of the same keys, plus ``as_of``) and keep the date honest. The S3 Inventory,
EMR Serverless, CloudWatch, X-Ray and Secrets Manager keys were added on the date below from the
well-known list prices (the AWS pricing pages could not be fetched from the build machine): they
are the first figures to re-check.

Example:
    >>> PRICE_TABLE.price("s3.put_per_1000")
    0.005
    >>> PriceTable.from_mapping({"as_of": "2026-01-01", "s3.put_per_1000": 0.006}).price("s3.put_per_1000")
    0.006
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

AS_OF = "2026-11-26"
REGION = "us-east-1"

#: key -> (USD, what it is). Units are in the key name.
PRICES: dict[str, tuple[float, str]] = {
    "s3.put_per_1000": (0.005, "S3 Standard PUT, COPY, POST, LIST requests (a 412 answer is billed too)"),
    "s3.get_per_1000": (0.0004, "S3 Standard GET, SELECT and all other requests (HEAD)"),
    "s3.storage_gb_month": (0.023, "S3 Standard storage, first 50 TB"),
    "sqs.per_million": (0.40, "SQS standard queue requests (per 64 KB chunk)"),
    "lambda.per_million_requests": (0.20, "Lambda invocations"),
    "lambda.gb_second": (0.0000133334, "Lambda duration, arm64 (the stack's architecture), per GB-second"),
    "dynamodb.per_million_wru": (0.625, "DynamoDB on-demand write request units"),
    "dynamodb.per_million_rru": (0.125, "DynamoDB on-demand read request units"),
    "dynamodb.storage_gb_month": (0.25, "DynamoDB Standard table storage"),
    "dynamodb.pitr_gb_month": (0.20, "DynamoDB continuous backups (PITR)"),
    "stepfunctions.per_1000_transitions": (0.025, "Step Functions Standard state transitions"),
    "s3.inventory_per_million_objects": (0.0025, "S3 Inventory, per million objects listed (every version)"),
    "emr_serverless.vcpu_hour_x86": (0.052624, "EMR Serverless, x86_64 (the pipeline application's), per vCPU-hour"),
    "emr_serverless.gb_hour_x86": (0.0057785, "EMR Serverless, x86_64, per GB-hour of memory"),
    "emr_serverless.vcpu_hour_arm64": (0.042094, "EMR Serverless, arm64, per vCPU-hour"),
    "emr_serverless.gb_hour_arm64": (0.004628, "EMR Serverless, arm64, per GB-hour of memory"),
    "cloudwatch.logs_ingest_per_gb": (0.50, "CloudWatch Logs ingestion (Standard class; vended Step Functions logs too)"),
    "cloudwatch.logs_storage_gb_month": (0.03, "CloudWatch Logs archived storage, per GB-month"),
    "cloudwatch.per_1000_metric_requests": (0.01, "CloudWatch GetMetricStatistics and friends, per 1,000 requests"),
    "cloudwatch.metric_month": (0.30, "CloudWatch custom metric (first 10,000), per metric-month"),
    "cloudwatch.alarm_month": (0.10, "CloudWatch standard-resolution alarm, per alarm-month"),
    "cloudwatch.dashboard_month": (3.00, "CloudWatch dashboard, per dashboard-month"),
    "xray.per_million_traces": (5.00, "X-Ray traces recorded"),
    "secretsmanager.secret_month": (0.40, "Secrets Manager, per secret-month"),
}


@dataclass(frozen=True)
class PriceTable:
    as_of: str
    region: str
    prices: dict[str, float] = field(default_factory=dict)

    def price(self, key: str) -> float:
        return self.prices[key]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "PriceTable":
        """Defaults overridden by ``data`` (unknown keys are refused: a typo must not go unpriced)."""
        unknown = set(data) - set(PRICES) - {"as_of", "region"}
        if unknown:
            raise ValueError(f"unknown price keys {sorted(unknown)}; known: {sorted(PRICES)}")
        prices = {k: float(v) for k, (v, _) in PRICES.items()}
        for k in PRICES:
            if k in data:
                value = float(data[k])
                if value < 0:
                    raise ValueError(f"price {k} must be >= 0")
                prices[k] = value
        return cls(as_of=str(data.get("as_of", AS_OF)), region=str(data.get("region", REGION)), prices=prices)

    def to_json(self) -> dict[str, Any]:
        return {"as_of": self.as_of, "region": self.region,
                "prices": {k: {"usd": v, "what": PRICES[k][1]} for k, v in self.prices.items()}}


PRICE_TABLE = PriceTable.from_mapping({})
