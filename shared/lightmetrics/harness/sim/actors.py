"""The actors: the real service code, each driven as its host drives it.

* ``collector#i`` — the ingest Lambda's :func:`accept_batch`; several submit one identity, some with
  other bytes, and resend after a 503 or a dead Lambda (no answer), as the agent does.
* the event path, the reconciler shards and the walk: :mod:`lightmetrics.harness.sim.derived_actors`;
* ``gc`` / ``retention`` — reap executions (:mod:`lightmetrics.harness.sim.reap_driver`).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote_plus

from lightmetrics.acceptance.accept import AcceptStatus, accept_batch
from lightmetrics.harness.sim.scheduler import Actor, SimCrash
from lightmetrics.harness.sim.world import Ack, World, frame, identity

#: attempts of one task before the driver gives up (the ASL retries a task's crash up to 6 times)
TASK_ATTEMPTS = 6


class QuietQueues:
    """The queue probe: every index queue and DLQ empty (the sim's indexer owns its queue)."""

    def quiet_since(self, hour_end_ns: int, now_ns: int) -> bool:
        return True

    def dlqs_empty(self) -> bool:
        return True


def collector(world: World, n: int, plan: list[tuple[int, float]]) -> Any:
    """Submit each ``(identity number, variant)`` of ``plan``; resend while there is no answer."""
    ctx = world.accept_context(world.clock_for(), f"collector-{n}")

    def body(actor: Actor) -> None:
        for number, variant in plan:
            ident = identity(number)
            data = frame(ident, variant)
            for _attempt in range(4):
                actor.crashed = False
                try:
                    result = accept_batch(ctx, ident, data)
                except SimCrash:
                    continue  # the Lambda died: no answer, the agent resends
                world.scheduler.note(f"answer {result.status.value} {ident.manifest_id}")
                if result.status in (AcceptStatus.ACCEPTED, AcceptStatus.DUPLICATE):
                    world.acks.append(Ack(ident, result.frame_sha256 or "", actor.name))
                if result.status is not AcceptStatus.UNAVAILABLE:
                    break
    return body


def collector_plans(world: World, collectors: int, submissions: int) -> list[list[tuple[int, float]]]:
    """Each collector's submissions: a few shared identities, some with other bytes, some resent."""
    rng = world.rng
    plans = []
    for _ in range(collectors):
        plan = []
        for _ in range(submissions):
            plan.append((rng.randrange(4), 1.0 if rng.random() < 0.15 else 0.0))
            if rng.random() < 0.2:
                plan.append(plan[-1])  # a resend of the same bytes
        plans.append(plan)
    return plans


def _sqs_record(world: World, key: str, receives: int) -> dict[str, Any]:
    size = len(world.system.store.get(key) or b"")
    body = {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
                         "s3": {"bucket": {"name": world.store.bucket},
                                "object": {"key": quote_plus(key), "size": size}}}]}
    return {"messageId": f"m-{key}", "body": json.dumps(body),
            "attributes": {"ApproximateReceiveCount": str(receives)}}


__all__ = ["QuietQueues", "collector", "collector_plans"]
