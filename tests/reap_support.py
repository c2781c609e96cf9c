"""A small world for reap tests: a versioned bucket, a control table, accepted batches in an old
hour with their derived entries, orphans; and :func:`drive`, the reap state machine's loop in Python
(the same task methods the ASL calls, with Step Functions' retry of a crashed task)."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import boto3
from conftest import FAST, make_frame

from lightmetrics.acceptance.accept import AcceptContext, accept_batch
from lightmetrics.composition.services import accept_context, work_context
from lightmetrics.deployment.settings import Settings
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.derived.walk import INDEXES, set_watermark
from lightmetrics.harness.testing.faults import FaultInjector, FaultRule
from lightmetrics.harness.testing.memory.executions import InlineExecutions
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.control_store import plain
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec, UtcHour
from lightmetrics.reaps import Reaper
from lightmetrics.reaps.report import ReapReport, report_of
from lightmetrics.reaps.state import ReapCheckpoint
from lightmetrics.work import crashpoints
from lightmetrics.work.units import WorkContext

_NS = 1_000_000_000
HORIZON_S = 60
RETENTION_S = 86400
#: The acceptance hour that retention expires: ten days before the test's wall clock.
OLD_NS = (time.time_ns() // (3600 * _NS)) * 3600 * _NS - 10 * 86400 * _NS + 600 * _NS


_SESSION: list[Any] = []


def session() -> Any:
    """One boto3 session for every world of a test process (sessions are slow to create)."""
    if not _SESSION:
        _SESSION.append(boto3.session.Session())
    return _SESSION[0]


def make_table(name: str, client: Any = None) -> None:
    ddb = client or session().client("dynamodb")
    ddb.create_table(TableName=name, KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                                {"AttributeName": "sk", "KeyType": "RANGE"}],
                     AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                           {"AttributeName": "sk", "AttributeType": "S"}],
                     BillingMode="PAY_PER_REQUEST")


@dataclass
class World:
    settings: Settings
    clock: FrozenClock
    ctx: WorkContext
    old: AcceptContext
    accepted: list[BatchIdentity] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)

    @property
    def s3(self) -> Any:
        return self.ctx.store.client  # type: ignore[attr-defined]

    def reaper(self) -> Reaper:
        return Reaper(self.ctx, self.settings)

    def reap_report(self) -> ReapReport:
        """The report of the reap checkpoint as stored (what ``lmctl reap status`` prints)."""
        return report_of(ReapCheckpoint.of(plain(self.ctx.table.get("checkpoint#reap", "current"))))

    def accept(self, identity: BatchIdentity, *, index: bool = True, variant: float = 0.0) -> Any:
        result = accept_batch(self.old, identity, make_frame(identity, variant))
        if index and result.manifest_key:
            index_accepted(self.ctx, result.manifest_key)
            index_raw_blob(self.ctx, result.blob_key)
        return result

    def orphan(self, identity: BatchIdentity, variant: float = 0.5) -> str:
        """The real accept stopped after step 4 (the manifest PUT never gets through)."""
        ctx = accept_context(self.settings, session=session(), clock=self.old.clock, policy=FAST)
        faults = FaultInjector(ctx.store.client)  # type: ignore[attr-defined]
        faults.add(FaultRule(fault="down", operation="PutObject", key_contains="accepted/v1/", times=-1))
        result = accept_batch(ctx, identity, make_frame(identity, variant))
        assert result.status.value == "unavailable" and result.blob_key
        index_raw_blob(self.ctx, result.blob_key)
        self.orphans.append(result.blob_key)
        return result.blob_key

    def rollups(self, hour: UtcHour, n: int = 3) -> list[str]:
        """Write :func:`rollup_keys` (rollup retention only lists and deletes keys, so their bodies
        do not matter)."""
        keys = rollup_keys(self.ctx.codec, hour, n)
        for key in keys:
            self.ctx.store.put_if_absent(key, b"{}")
        return keys

    def cover_watermark(self) -> None:
        table = self.ctx.table
        for index in INDEXES:
            set_watermark(table, index, self.clock.now_ns() - 3600 * _NS, epoch=1, now_ns=self.clock.now_ns())

    def blob_exists(self, key: str) -> bool:
        return self.ctx.store.head(key) is not None

    def versions(self, key: str) -> tuple[list[str], list[str]]:
        r = self.s3.list_object_versions(Bucket=self.settings.bucket, Prefix=key)
        return ([v["VersionId"] for v in r.get("Versions", []) if v["Key"] == key],
                [d["VersionId"] for d in r.get("DeleteMarkers", []) if d["Key"] == key])


def rollup_keys(codec: KeyCodec, hour: UtcHour, n: int = 3) -> list[str]:
    """Rollup objects of one hour as the pipeline lays them out: a generation written in format v2
    (chunks, index entries, its manifest) and one in v3 (a Parquet part of every window, its
    manifest), plus a v3 part of a generation whose run never committed."""
    import hashlib

    keys = []
    for i in range(n):
        cid = hashlib.sha256(f"{hour}-{i}".encode()).hexdigest()
        keys += [codec.rollup_chunk("1m", hour, f"cpu.{i}", cid), codec.rollup_index(hour, cid)]
    keys.append(codec.rollup_manifest(hour, 1))
    for generation, windows in ((2, ("1m", "5m", "1h")), (3, ("5m",))):
        for w in windows:
            sha = hashlib.sha256(f"{hour}-{w}-{generation}".encode()).hexdigest()
            keys.append(codec.rollup_part(w, hour, generation, 0, sha))
    keys.append(codec.rollup_manifest(hour, 2))
    return keys


def world_settings(bucket: str, *, grace_s: int = 0) -> Settings:
    return Settings.from_env({}, bucket=bucket, table=bucket, collector_id="reap-test",
                             retry_horizon_s=HORIZON_S, gc_grace_s=grace_s, retention_s=RETENTION_S,
                             rollup_retention_s=RETENTION_S)


def make_world(bucket: str, *, grace_s: int = 0) -> World:
    make_table(bucket)
    # Wall-clock now plus more than the horizon: every blob written by the test is old enough.
    clock = FrozenClock(time.time_ns() + (HORIZON_S + 60) * _NS)
    settings = world_settings(bucket, grace_s=grace_s)
    ctx = work_context(settings, session=session(), clock=clock, policy=FAST, component="reap-test")
    old = accept_context(settings, session=session(), clock=FrozenClock(OLD_NS), policy=FAST)
    return World(settings, clock, ctx, old)


def drive(reaper: Reaper, inp: dict[str, Any], clock: FrozenClock, *, attempts: int = 4,
          before_task: Any = None, range_threads: int = 1) -> dict[str, Any]:
    """The loop of infra/statemachines/reap.asl.json: route on ``next``; a Wait advances the clock;
    a task that dies (an injected crash) is retried with the same input, as the ASL's Retry does.
    ``before_task(next, event)`` sees every task invocation (the process-kill test records it).
    A visit of the Ranges Map runs its range tasks on ``range_threads`` threads, then the hour's task."""
    out = reaper.begin({"input": inp, "execution_arn": f"inline-{uuid.uuid4().hex[:6]}"})
    return drive_from(reaper, out, clock, attempts=attempts, before_task=before_task, range_threads=range_threads)


def drive_from(reaper: Reaper, out: dict[str, Any], clock: FrozenClock, *, attempts: int = 4,
               before_task: Any = None, range_threads: int = 1) -> dict[str, Any]:
    def run(task: str, event: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(attempts):
            if before_task:
                before_task(task, event)
            try:
                return getattr(reaper, task)(event)  # type: ignore[no-any-return]
            except crashpoints.InjectedCrash:
                if attempt == attempts - 1:
                    raise
            except Exception as exc:  # the ASL's Catch -> Abort: record the failure, release the lease
                reaper.end({"reap": event.get("reap") or out["reap"], "outcome": "failed",
                            "error": {"Error": type(exc).__name__}})
                raise
        raise AssertionError("unreachable")

    for _ in range(10_000):
        nxt = out["next"]
        if nxt == "finish":
            return reaper.end({"reap": out["reap"], "outcome": "finished"})
        if nxt == "continue":  # Continue, then the next execution's Begin carries the reap on
            if not isinstance(reaper.executions, InlineExecutions):
                reaper.executions = InlineExecutions()
            started = run("cont", {"reap": out["reap"]})["next_execution"]
            out = run("begin", {"input": reaper.executions.inputs[started], "execution_arn": started})
            continue
        if nxt == "ranges":  # the Ranges Map: one task per range (its role's method), then the hour's task
            events = [(item["task"], {"reap": out["reap"], "job": out["range_job"], "range": item})
                      for item in out["ranges"]]
            with ThreadPoolExecutor(max(1, min(range_threads, out["range_parallelism"]))) as pool:
                list(pool.map(lambda e: run(*e), events))
            out = run("retention", {"reap": out["reap"]})
            continue
        if nxt == "wait":
            clock.advance(out["wait_s"])
            nxt = out["after"]
        out = run(nxt, {"reap": out["reap"]})
    raise AssertionError("the reap did not finish")


def hour_of(ns: int) -> UtcHour:
    return UtcHour.of_unix_ns(ns)


def request_recorder(task: dict[str, str], seen: list[tuple[str, str, str]]) -> Any:
    """A botocore ``before-parameter-build`` hook that records (the current task's name, the S3
    operation, its key or prefix) into ``seen``; a DeleteObjects counts as a DeleteObject of each
    key, as IAM authorises it (the function spec's ``s3_delete``)."""

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name == "DeleteObjects":
            seen.extend((task["name"], "DeleteObject", o["Key"]) for o in params["Delete"]["Objects"])
            return
        where = params.get("Key", params.get("Prefix"))
        seen.append((task["name"], model.name, where if where is not None else "<whole bucket>"))

    return record

