"""The actors: the real service code, each driven as its host drives it.

* ``collector#i`` — the ingest Lambda's :func:`accept_batch`; several submit one identity, some with
  other bytes, and resend after a 503 or a dead Lambda (no answer), as the agent does.
* ``indexer`` — the event path (:func:`process_sqs_record`) fed the S3 events of the objects the
  run created, dropped, duplicated and reordered by the seed; SQS redelivers what was not
  acknowledged (at least once).
* ``reconciler`` — one run of shard 0.
* ``gc`` / ``retention`` — reap executions (:mod:`lightmetrics.harness.sim.reap_driver`).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote_plus

from lightmetrics.acceptance.accept import AcceptStatus, accept_batch
from lightmetrics.derived.event_path import process_sqs_record
from lightmetrics.derived.indexing import KIND_FOR_KEY
from lightmetrics.derived.reconcile import Reconciler
from lightmetrics.harness.sim.scheduler import Actor, SimCrash
from lightmetrics.harness.sim.world import Ack, World, frame, identity
from lightmetrics.protocol.errors import KeyLayoutError

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


def indexer(world: World, *, drop: float = 0.1, duplicate: float = 0.1, idle_limit: int = 30) -> Any:
    """The event path: S3 events of created keys, each delivered, dropped or duplicated by the seed."""
    ctx = world.work_context(world.clock_for())
    rng = world.rng

    def body(actor: Actor) -> None:
        queue: list[tuple[str, int]] = []
        seen, idle = 0, 0
        while idle < idle_limit:
            for key in world.store.created[seen:]:
                if rng.random() >= drop:
                    queue.extend([(key, 1)] * (2 if rng.random() < duplicate else 1))
            seen = len(world.store.created)
            if not queue:
                idle += 1
                world.scheduler.pause("Receive")  # a poll of an empty queue
                continue
            idle = 0
            key, receives = queue.pop(rng.randrange(len(queue)))  # SQS standard: no order
            if not _deliver(world, ctx, actor, key, receives):
                queue.append((key, receives + 1))  # not acknowledged: visible again later
    return body


def _deliver(world: World, ctx: Any, actor: Actor, key: str, receives: int) -> bool:
    """One delivery of ``key``'s event; True when the message was acknowledged (deleted)."""
    try:
        kind = KIND_FOR_KEY.get(ctx.codec.parse(key).kind)
    except KeyLayoutError:
        kind = None
    if kind is None:
        return True  # not an indexed prefix: no notification is configured for it
    actor.crashed = False
    try:
        results = process_sqs_record(ctx, _sqs_record(world, key, receives), kind=kind, bucket=world.store.bucket)
    except SimCrash:
        return receives >= 5  # the Lambda died; after maxReceiveCount the message goes to the DLQ
    world.scheduler.note(f"indexed {key} {[r.outcome.value for r in results]}")
    return all(r.acknowledged for r in results) or receives >= 5


def reconciler(world: World) -> Any:
    ctx = world.work_context(world.clock_for())

    def body(actor: Actor) -> None:
        for _ in range(world.rng.randrange(40)):
            world.scheduler.pause("Schedule")  # the schedule fires later
        for _attempt in range(TASK_ATTEMPTS):
            actor.crashed = False
            try:
                Reconciler(ctx, world.system.settings, QuietQueues()).run()
                return
            except SimCrash:
                continue
            except Exception as exc:  # noqa: BLE001 - a failed run: the next schedule runs again
                world.scheduler.note(f"reconciler failed {type(exc).__name__}")
                return
    return body


__all__ = ["QuietQueues", "collector", "collector_plans", "indexer", "reconciler"]
