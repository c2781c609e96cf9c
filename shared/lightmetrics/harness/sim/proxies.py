"""The port proxies: the in-memory ObjectStore and ControlStore behind the scheduler and the seed's faults.

Every call first hands the baton to the scheduler, then may meet one fault the seed picks:

* ``fail`` — refused before landing (S3 503/SlowDown/500 through the in-memory adapter's own error
  paths, so the services see what the S3 adapter raises; DynamoDB throttling as botocore's error);
* ``lost`` — the request lands and its answer is lost (a timeout). A conditional table write is then
  sent again as the client's retry would, and that retry meets its own write (``ConditionFailed``
  with ``retried=True``, docs/protocol.md §11.1);
* ``crash-before`` / ``crash-after`` — the actor dies right before or right after the call;
* ``refused`` — a read of a derived-state actor (event path, reconciler, walk) is refused once
  with 403 AccessDenied (a policy being rolled out): a refusal that passes (§11 O4).

Nothing here switches production code: the services get these objects where the adapters would be.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from lightmetrics.harness.sim.scheduler import Actor, Scheduler, SimCrash
from lightmetrics.harness.testing.memory import InMemoryControlTable, InMemoryObjectStore
from lightmetrics.harness.testing.memory.object_store import s3_error
from lightmetrics.protocol.control_store import ConditionFailed, Op

FAULT_KINDS = ("fail", "lost", "crash-before", "crash-after")
WRITES = frozenset({"PutObject", "DeleteObject", "DeleteObjects", "PutItem", "UpdateItem", "DeleteItem",
                    "TransactWriteItems"})
#: reads a derived-state actor may see refused once (403 AccessDenied), and those actors
REFUSABLE = frozenset({"GetObject", "HeadObject"})
REFUSED_ACTORS = frozenset({"indexer", "reconciler", "walk"})
_S3_CODES = ("ServiceUnavailable", "SlowDown", "InternalError")
_READS = {"get": "GetObject", "get_range": "GetObject",
          "head": "HeadObject", "list_page": "ListObjectsV2", "list_keys": "ListObjectsV2",
          "list_modified": "ListObjectsV2", "versions_of": "ListObjectVersions", "require_bucket": "ListObjectsV2"}


class FaultPlan:
    """Which fault (if any) each call meets, drawn from the run's PRNG; ``coverage`` counts
    ``(actor, call, fault)``."""

    def __init__(self, rng: random.Random, rate: float, write_rate: float | None = None) -> None:
        self.rng, self.rate, self.enabled = rng, rate, True
        # writes are few and decide the most (a take, a mark, a commit): they meet faults more often
        self.write_rate = 3 * rate if write_rate is None else write_rate
        self.coverage: Counter[tuple[str, str, str]] = Counter()

    def pick(self, actor: Actor | None, call: str, kinds: tuple[str, ...] = FAULT_KINDS) -> str | None:
        rate = self.write_rate if call in WRITES else self.rate
        if not self.enabled or actor is None or self.rng.random() >= rate:
            return None
        kind = self.rng.choice(kinds)
        if kind == "fail" and call in REFUSABLE and actor.name.split("#")[0] in REFUSED_ACTORS \
                and self.rng.random() < 0.3:
            kind = "refused"
        self.coverage[(actor.name.split("#")[0], call, kind)] += 1
        return kind


def _crash(actor: Actor | None, where: str) -> SimCrash:
    if actor is not None:
        actor.crashed = True
    return SimCrash(where)


def _enter(scheduler: Scheduler, faults: FaultPlan, operation: str, key: str) -> tuple[Actor | None, str | None]:
    """Every storage call's start, on either port: hand the baton to the scheduler, then draw this
    call's fault (noted in the trace); a ``crash-before`` ends the actor here."""
    actor = scheduler.before_call(operation, key)
    kind = faults.pick(actor, operation)
    if kind is not None:
        scheduler.note(f"fault {kind} {operation} {key}")
    if kind == "crash-before":
        raise _crash(actor, f"before {operation} {key}")
    return actor, kind


def _landed(watch: Any, actor: Actor | None, operation: str, key: str, sent: int, *, destructive: bool) -> None:
    if watch is not None:
        watch.landed(actor, operation, key, sent, destructive=destructive)


class SimObjectStore:
    """:class:`~lightmetrics.protocol.object_store.ObjectStore` over an :class:`InMemoryObjectStore`."""

    def __init__(self, inner: InMemoryObjectStore, scheduler: Scheduler, faults: FaultPlan) -> None:
        self.inner, self.scheduler, self.faults = inner, scheduler, faults
        self.bucket = inner.bucket
        self.created: list[str] = []  # keys created, in order (the S3 event stream)
        self.watch: Any = None  # the lease check (harness/sim/lease_check.py), told of every landed call

    def _call(self, operation: str, key: str, fn: Any, *, write: bool = False) -> Any:
        sent = self.scheduler.jumps
        actor, kind = _enter(self.scheduler, self.faults, operation, key)
        landed = kind == "lost" and write
        if kind == "refused":
            self.inner.fail(operation, "AccessDenied", key_contains=key, times=1)
        if kind in ("fail", "lost") and not landed:
            if operation == "DeleteObjects":
                raise s3_error(operation, self.faults.rng.choice(_S3_CODES))
            # a read is retried by the adapter (3 attempts): it fails for good only if all do
            times = self.faults.rng.randint(1, 3) if not write else 1
            code = "RequestTimeout" if kind == "lost" else self.faults.rng.choice(_S3_CODES)
            self.inner.fail(operation, code, key_contains=key, times=times)
        elif landed and operation != "DeleteObjects":
            self.inner.fail(operation, "RequestTimeout", key_contains=key, landed=True)
        try:
            result = fn()
        except Exception:
            if landed and operation != "DeleteObjects":  # a lost answer: the request took effect all the same
                # (a DeleteObjects' lost answer is raised below, once it landed: raising here, it did not)
                _landed(self.watch, actor, operation, key, sent, destructive=operation.startswith("Delete") and bool(key))
            raise
        finally:
            self.inner.clear_faults()
        _landed(self.watch, actor, operation, key, sent, destructive=operation.startswith("Delete") and bool(key))
        if operation.startswith("Delete") and actor is not None and actor.dry_run:
            self.scheduler.flag(f"a dry run sent {operation} {key}")  # rule DR1
        if landed and operation == "DeleteObjects":
            raise s3_error(operation, "RequestTimeout")
        if kind == "crash-after":
            raise _crash(actor, f"after {operation} {key}")
        return result

    def put_if_absent(self, key: str, body: bytes, **kw: Any) -> Any:
        before = self.inner._current(key)
        try:
            return self._call("PutObject", key, lambda: self.inner.put_if_absent(key, body, **kw), write=True)
        finally:  # S3 sends the event of an object that landed, whatever its writer then saw
            if before is None and self.inner._current(key) is not None:
                self.created.append(key)

    def lines_from(self, key: str, offset: int) -> Any:
        lines = self._call("GetObject", key, lambda: list(self.inner.lines_from(key, offset)))
        yield from lines  # a generator, as the adapters' (callers close it when they stop early)

    def delete(self, key: str) -> None:
        self._call("DeleteObject", key, lambda: self.inner.delete(key), write=True)

    def delete_objects(self, objects: list[tuple[str, str | None]], **kw: Any) -> Any:
        return self._call("DeleteObjects", objects[0][0] if objects else "",
                          lambda: self.inner.delete_objects(objects, **kw), write=True)

    def __getattr__(self, name: str) -> Any:
        operation = _READS.get(name)
        if operation is None:
            raise AttributeError(name)
        method = getattr(self.inner, name)

        def read(key: str, *args: Any, **kw: Any) -> Any:
            return self._call(operation, key, lambda: method(key, *args, **kw))
        return read


class SimControlTable:
    """:class:`~lightmetrics.protocol.control_store.ControlStore` over an :class:`InMemoryControlTable`."""

    def __init__(self, inner: InMemoryControlTable, scheduler: Scheduler, faults: FaultPlan) -> None:
        self.inner, self.scheduler, self.faults = inner, scheduler, faults
        self.watch: Any = None  # the lease check (harness/sim/lease_check.py), told of every landed call

    def _call(self, operation: str, key: str, fn: Any, *, conditional: bool = False, destructive: bool = False) -> Any:
        sent = self.scheduler.jumps
        actor, kind = _enter(self.scheduler, self.faults, operation, key)
        if kind == "fail":
            self.inner.fail(operation, "ProvisionedThroughputExceededException")
        try:
            result = fn()
        finally:
            self.inner.clear_faults()
        _landed(self.watch, actor, operation, key, sent, destructive=destructive)
        if kind == "lost":
            if not conditional:
                raise s3_error(operation, "RequestTimeout")  # botocore's error: the caller's transient handling
            try:  # the client's retry of a conditional write: it meets the first attempt's write
                result = fn()
            except ConditionFailed as failed:
                failed.retried = True
                raise
        if kind == "crash-after":
            raise _crash(actor, f"after {operation} {key}")
        return result

    def get(self, pk: str, sk: str, *, consistent: bool = True) -> Any:
        return self._call("GetItem", f"{pk}/{sk}", lambda: self.inner.get(pk, sk, consistent=consistent))

    def put(self, values: dict[str, Any], **kw: Any) -> None:
        self._call("PutItem", f"{values.get('pk')}/{values.get('sk')}", lambda: self.inner.put(values, **kw),
                   conditional=kw.get("condition") is not None)

    def update(self, pk: str, sk: str, expression: str, **kw: Any) -> Any:
        return self._call("UpdateItem", f"{pk}/{sk}", lambda: self.inner.update(pk, sk, expression, **kw),
                          conditional=kw.get("condition") is not None)

    def delete(self, pk: str, sk: str, **kw: Any) -> None:
        self._call("DeleteItem", f"{pk}/{sk}", lambda: self.inner.delete(pk, sk, **kw),
                   conditional=kw.get("condition") is not None, destructive=kw.get("condition") is not None)

    def transact(self, ops: list[Op]) -> None:
        self._call("TransactWriteItems", ",".join(f"{o.pk}/{o.sk}" for o in ops), lambda: self.inner.transact(ops),
                   conditional=any(o.condition for o in ops), destructive=any(o.kind == "Delete" for o in ops))

    def query_page(self, pk: str, **kw: Any) -> Any:
        return self._call("Query", pk, lambda: self.inner.query_page(pk, **kw))

    def query(self, pk: str, **kw: Any) -> Any:
        return self._call("Query", pk, lambda: self.inner.query(pk, **kw))


__all__ = ["FAULT_KINDS", "FaultPlan", "SimControlTable", "SimObjectStore"]
