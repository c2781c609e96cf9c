"""The keep-up model's parts (:mod:`lightmetrics.operator_tools.keepup`): AWS's documented quotas,
a limit a job cannot pass, a partition its requests concentrate on, and one job's row.

Example:
    >>> Partition("DynamoDB WCU, one key", per_unit=0.5, quota=1000.0).limit().units_per_s
    2000.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Limit", "Partition", "Quotas", "job_row", "s3_requests"]


@dataclass(frozen=True)
class Quotas:
    """AWS's documented default quotas the jobs meet (per second unless named otherwise)."""

    s3_writes_per_prefix: float = 3500.0  # PUT/COPY/POST/DELETE per partitioned prefix
    s3_reads_per_prefix: float = 5500.0  # GET/HEAD per partitioned prefix
    ddb_rcu_per_partition: float = 3000.0
    ddb_wcu_per_partition: float = 1000.0
    lambda_concurrency: int = 1000  # per account and region (a soft quota)
    sqs_event_source_concurrency: int = 1250  # the most an SQS event source mapping scales to
    inline_map_concurrency: int = 40
    distributed_map_concurrency: int = 10_000
    eventbridge_rules_per_bus: int = 300
    sfn_history_events: int = 25_000  # walk.max_rounds_for's budget (continuations), not an input here


@dataclass(frozen=True)
class Limit:
    """A rate (units of the job's work per second) the job cannot pass, and why."""

    name: str
    units_per_s: float


@dataclass(frozen=True)
class Partition:
    """One partition the job's requests concentrate on: ``per_unit`` requests (or capacity
    units) per unit of work against ``quota`` per second."""

    name: str
    per_unit: float
    quota: float

    def limit(self) -> Limit:
        return Limit(self.name, self.quota / self.per_unit if self.per_unit else math.inf)


def s3_requests(requests: Mapping[str, float], *, reads: bool) -> float:
    write = {"s3.PutObject", "s3.CopyObject", "s3.DeleteObject"}
    return sum(n for api, n in requests.items() if api.startswith("s3.") and (api not in write) == reads)


def job_row(name: str, unit: str, must: float, limits: list[Limit], parts: list[Partition]) -> dict[str, Any]:
    every = limits + [p.limit() for p in parts]
    first = min(every, key=lambda lim: lim.units_per_s)
    return {"job": name, "unit": unit, "must_follow_per_s": must, "can_do_per_s": first.units_per_s,
            "headroom": first.units_per_s / must if must else math.inf, "first_limit": first.name,
            "limits": [asdict(lim) for lim in every],
            "partitions": [{**asdict(p), "load_per_s": must * p.per_unit,
                            "share_of_quota": must * p.per_unit / p.quota} for p in parts]}
