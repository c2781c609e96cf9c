"""The chaos knobs the soak and the demo use: steady fault rates and duplicated SQS deliveries."""

from __future__ import annotations

import uuid
from typing import Any

from lightmetrics.harness.testing.faults import FaultInjector, FaultRule
from lightmetrics.local.pump import EventPump, Route, queue_depth
from lightmetrics.local.server import LocalRuntime


def test_fault_rule_every_fires_on_every_nth_match_after_the_skip() -> None:
    inj = FaultInjector()
    rule = inj.add(FaultRule(fault="503", operation="PutObject", after=2, every=3, times=-1))
    fired = [i for i in range(1, 15) if inj._match("PutObject", f"http://s3/b/k{i}") is rule]
    assert fired == [5, 8, 11, 14]
    assert inj._match("GetObject", "http://s3/b/k") is None


def test_fault_rule_rejects_every_below_one() -> None:
    try:
        FaultRule(fault="409", every=0)
    except ValueError as exc:
        assert "every" in str(exc)
    else:
        raise AssertionError("every=0 accepted")


def test_pump_delivers_a_duplicated_message_twice_and_acknowledges_it_once(runtime: LocalRuntime) -> None:
    sqs = runtime.boto3_client("sqs")
    url = sqs.create_queue(QueueName=f"lm-dup-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for body in ("a", "b", "c"):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    seen: list[str] = []

    def handler(event: dict[str, Any], _ctx: Any) -> dict[str, Any]:
        seen.extend(r["body"] for r in event["Records"])
        return {"batchItemFailures": []}

    pump = EventPump(sqs, [Route("q", url, arn, "fn", handler)], duplicate=lambda body: body == "b")
    while pump.pump_once(pump.routes[0]):
        pass
    assert sorted(seen) == ["a", "b", "b", "c"]
    assert pump.duplicated == 1 and pump.delivered == 3
    assert queue_depth(sqs, url) == 0
