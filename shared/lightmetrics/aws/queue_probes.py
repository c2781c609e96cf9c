"""How the reconciler sees the index queues: the adapters of the port
:class:`lightmetrics.protocol.queue_probe.QueueProbe`.

:class:`SqsCountProbe` (the local runtime, ``LM_QUEUE_PROBE=count``: moto has no age metric) and
:class:`CloudWatchAgeProbe` (AWS: ``ApproximateAgeOfOldestMessage``), built by the composition root
(:func:`lightmetrics.composition.services.queue_probe`) on clients it passes in.
"""

from __future__ import annotations

import time
from typing import Any

_NS = 1_000_000_000


class SqsCountProbe:
    """Local rule: a queue is quiet when visible + in-flight messages = 0 (no age metric in moto)."""

    def __init__(self, sqs: Any, queue_urls: list[str], dlq_urls: list[str]) -> None:
        self.sqs, self.queue_urls, self.dlq_urls = sqs, queue_urls, dlq_urls

    def _depth(self, url: str) -> int:
        from lightmetrics.aws.sqs_queues import queue_depth

        return queue_depth(self.sqs, url)

    def quiet_since(self, hour_end_ns: int, now_ns: int) -> bool:
        return all(self._depth(u) == 0 for u in self.queue_urls)

    def dlqs_empty(self) -> bool:
        return all(self._depth(u) == 0 for u in self.dlq_urls)


class CloudWatchAgeProbe(SqsCountProbe):
    """AWS rule: the oldest message of every index queue is younger than the hour's end."""

    def __init__(self, sqs: Any, cloudwatch: Any, queue_names: list[str], queue_urls: list[str],
                 dlq_urls: list[str]) -> None:
        super().__init__(sqs, queue_urls, dlq_urls)
        self.cloudwatch, self.queue_names = cloudwatch, queue_names

    def quiet_since(self, hour_end_ns: int, now_ns: int) -> bool:
        allowed_age_s = (now_ns - hour_end_ns) / _NS
        end = time.time()
        for name in self.queue_names:
            stats = self.cloudwatch.get_metric_statistics(
                Namespace="AWS/SQS", MetricName="ApproximateAgeOfOldestMessage",
                Dimensions=[{"Name": "QueueName", "Value": name}], StartTime=end - 600, EndTime=end,
                Period=60, Statistics=["Maximum"],
            )
            points = stats.get("Datapoints", [])
            if not points:
                return False  # no evidence is not evidence of quiet
            if max(p["Maximum"] for p in points) >= allowed_age_s:
                return False
        return True


__all__ = ["CloudWatchAgeProbe", "SqsCountProbe"]
