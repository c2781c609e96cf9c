"""The cost model's per-unit counts of the background jobs are live counts (issue 14, cost model).

Each job runs whole, through its public entry point: the walk and the reaps as executions of their
state machines on moto's Step Functions interpreter (tasks in the runtime's function host, their
S3 and DynamoDB clients counted; states entered and Lambda tasks read from the execution history),
the reconciler as ``Reconciler.run``. Every run happens at two history depths, and its total must
equal :func:`lightmetrics.operator_tools.cost_workload.job_requests` of the units the run did (keys, pages, rounds,
partitions, blobs, batches, hours ...), counted from the world the test built: no tolerance. When
a job changes its request mix, this fails until ``JOB_REQUESTS`` says what the job now costs.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import FAST, T0_NS, consume_all, ident, make_frame
from reap_support import OLD_NS
from walk_support import set_last_modified

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_accepted, index_raw_blob, write_raw_blob_entry
from lightmetrics.derived.walk import INDEXES, set_watermark
from lightmetrics.harness.bench.cost_table import measure_reap, measure_reconcile, measure_walk
from lightmetrics.local.system import LocalSystem
from lightmetrics.operator_tools.cost_workload import JOB_REQUESTS, job_requests
from lightmetrics.protocol.clock import FrozenClock, OffsetClock
from lightmetrics.protocol.keys import UtcHour

_NS = 1_000_000_000
WAIT_S = 3  # the GC grace and the tombstone wait of the measured reaps


@dataclass(frozen=True)
class Shape:
    """A world: ``agents`` partitions (one boot each), ``per_hour`` batches per agent in each of
    ``hours`` consecutive acceptance hours ten days ago; the page sizes the runs use."""

    agents: int
    per_hour: int
    hours: int
    walk_page: int
    walk_max_rounds: int
    gc_page: int
    retention_page: int
    max_pending_pages: int

    @property
    def per_partition(self) -> int:
        return self.per_hour * self.hours

    @property
    def batches(self) -> int:
        return self.agents * self.per_partition


#: Two history depths: 2 and 12 batches (the second spans pages, rounds, a walk continuation,
#: two retention hours and two settle rounds an hour).
SHALLOW = Shape(agents=2, per_hour=1, hours=1, walk_page=2, walk_max_rounds=100, gc_page=4, retention_page=2,
                max_pending_pages=20)
DEEP = Shape(agents=2, per_hour=3, hours=2, walk_page=2, walk_max_rounds=2, gc_page=4, retention_page=2,
             max_pending_pages=2)


def make_system(runtime: Any, clock: Any, **overrides: Any) -> LocalSystem:
    tag = uuid.uuid4().hex[:10]
    system = LocalSystem(runtime, bucket=f"lm-cm-{tag}", table=f"lm-cm-{tag}", secret_name=f"lm-cm/{tag}",
                         queue_name_prefix=f"cm{tag}-", clock=clock, overrides=overrides).provision()
    system.notifications(False)  # derived state is exactly what the test indexes
    return system


def hours_under(system: LocalSystem, prefix: str) -> set[str]:
    """The ``date=.../hour=..`` partitions that hold keys under ``prefix``."""
    s3 = system.runtime.boto3_client("s3")
    out = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=system.bucket, Prefix=prefix):
        out |= {"/".join(o["Key"].split("/")[2:4]) for o in page.get("Contents", [])}
    return out


def seed(system: LocalSystem, runtime: Any, shape: Shape) -> None:
    ctx = system.work_context(policy=FAST)
    for h in range(shape.hours):
        clock = FrozenClock(OLD_NS + h * 3600 * _NS)
        actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)

        def one(identity: Any) -> None:
            r = accept_batch(actx, identity, make_frame(identity))
            index_accepted(ctx, r.manifest_key)
            index_raw_blob(ctx, r.blob_key)
            # The LastModified S3 would have given the record (the walk places its hour by it, §13 W4)
            set_last_modified(system.bucket, r.manifest_key, clock.now_ns())

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, [ident(h * 1000 + k, agent=f"agent-{a}") for a in range(shape.agents)
                                for k in range(shape.per_hour)]))
    now = system.clock.now_ns()
    for index in INDEXES:  # retention needs W over the old hours; the walk raises it again
        set_watermark(ctx.table, index, now - 3600 * _NS, epoch=1, now_ns=now)


def gc_tombstone_checks(system: LocalSystem, page_size: int) -> int:
    """The tombstone HEADs of a by-time GC over every blob: one per acceptance hour of a page's
    referenced blobs (each page is one task, and a task caches its answers, rule G-R1)."""
    from lightmetrics.protocol.manifests import parse_record

    ctx = system.work_context(policy=FAST)
    hour_of = {}
    for key in ctx.store.list_keys(ctx.codec.prefix + "accepted/v1/"):
        record = parse_record(ctx.codec, key, ctx.store.get(key))
        hour_of[record.frame_sha256] = UtcHour.of_unix_ns(record.accepted_at_unix_ns)
    hints = sorted(ctx.store.list_keys(ctx.codec.prefix + "raw-blobs-by-time/v1/"))
    shas = [k.rsplit("sha256=", 1)[1].removesuffix(".json") for k in hints]
    return sum(len({hour_of[s] for s in shas[i:i + page_size] if s in hour_of}) for i in range(0, len(shas), page_size))


def expect(job: str, units: dict[str, float]) -> dict[str, float]:
    assert set(units) <= set(JOB_REQUESTS[job]), units
    return job_requests(job, units)


@pytest.mark.parametrize("shape", [SHALLOW, DEEP], ids=["shallow", "deep"])
def test_walk_gc_scan_and_retention_cost_what_the_model_says(runtime: Any, shape: Shape) -> None:
    # The waits are real seconds on moto's interpreter: long enough that a slow task never finds its
    # wait already over (a Wait state it skips would be two transitions fewer than in AWS, where the
    # grace is 15 minutes and the tombstone wait 2).
    # Two hours ahead: the blobs' raw-blobs-by-time hour (written now) is past the retry horizon.
    system = make_system(runtime, OffsetClock(2 * 3600 * _NS), retry_horizon_s=60, gc_grace_s=WAIT_S,
                         retention_s=86400)
    try:
        seed(system, runtime, shape)
        acceptance_hours = hours_under(system, "accepted-by-time/v1/")
        assert len(acceptance_hours) == shape.hours

        # The weekly walk over retained keys (every derived entry present: one HEAD of the record's
        # accepted-by-time entry each, in groups too small for a LIST; a tombstone HEAD per hour).
        pages = math.ceil(shape.per_partition / shape.walk_page)
        rounds = pages  # every partition is walked in parallel (agents <= parallelism)
        measured = measure_walk(system, page_size=shape.walk_page, parallelism=4, max_rounds=shape.walk_max_rounds)
        assert measured == expect("walk", {
            "key.retained": shape.batches, "page": shape.agents * pages, "partition": shape.agents, "round": rounds,
            "continuation": math.ceil(rounds / shape.walk_max_rounds) - 1,
            "tombstone_check": len(acceptance_hours), "run": 1})

        # The daily GC (incremental, source by-time): every blob referenced, its hour newly past the
        # retry horizon, so proven now and never again.
        checks = gc_tombstone_checks(system, shape.gc_page)
        measured = measure_reap(system, mode="gc", dry_run=False, source="by-time", page_size=shape.gc_page)
        assert measured == expect("gc", {"blob.old": shape.batches, "tombstone_check": checks,
                                         "page": math.ceil(shape.batches / shape.gc_page), "run": 1})
        measured = measure_reap(system, mode="gc", dry_run=False, source="by-time", page_size=shape.gc_page)
        assert measured == expect("gc", {"page": 1, "run": 1})  # the next run: nothing became due, one LIST

        # Retention of every expired hour (hour=None, as the daily schedule runs it).
        pages_h = math.ceil(shape.agents * shape.per_hour / shape.retention_page)
        measured = measure_reap(system, mode="retention", dry_run=False, hour=None, page_size=shape.retention_page,
                                max_pending_pages=shape.max_pending_pages, tombstone_wait_s=WAIT_S)
        dates = {h.split("/")[0] for h in acceptance_hours}
        assert measured == expect("retention", {
            "batch": shape.batches, "page": shape.hours * pages_h,
            "settle_round": shape.hours * math.ceil(pages_h / shape.max_pending_pages),
            "hour": shape.hours, "date_listed": len(dates), "run": 1})

        # The walk again: now every key is in a reaped hour.
        measured = measure_walk(system, page_size=1000, parallelism=4)
        assert measured == expect("walk", {
            "key.reaped": shape.batches, "page": shape.agents, "partition": shape.agents, "round": 1,
            "tombstone_check": shape.hours, "run": 1})
    finally:
        system.stop()


@pytest.mark.parametrize("blobs", [2, 6])
def test_gc_scan_of_blobs_inside_the_retry_horizon_costs_one_head_each(runtime: Any, blobs: int) -> None:
    system = make_system(runtime, OffsetClock(0), retry_horizon_s=3600, gc_grace_s=1)
    try:
        ctx = system.work_context(policy=FAST)
        actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=FrozenClock(OLD_NS),
                              policy=FAST)
        for k in range(blobs):
            r = accept_batch(actx, ident(k), make_frame(ident(k)))
            index_accepted(ctx, r.manifest_key)
        measured = measure_reap(system, mode="gc", dry_run=False, source="scan", page_size=4)
        assert measured == expect("gc-scan", {"blob.young": blobs, "page": math.ceil(blobs / 4), "run": 1})
    finally:
        system.stop()


@pytest.mark.parametrize("history", [3, 30])
def test_reconciler_run_costs_what_the_model_says_whatever_the_history(runtime: Any, history: int) -> None:
    clock = FrozenClock(T0_NS + 1200 * _NS)  # 16:20: hours 14 and 15 can close
    system = make_system(runtime, clock, settle_s=600, reconcile_lookback_s=7200)
    try:
        sqs = runtime.boto3_client("sqs")
        for url in system.queue_urls():  # S3's test events from provisioning: the hours could not close
            consume_all(sqs, url)
        ctx = system.work_context(policy=FAST)

        def accept_at(at_ns: int, idents: list[Any]) -> list[Any]:
            actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=FrozenClock(at_ns),
                                  policy=FAST)
            results = [accept_batch(actx, i, make_frame(i)) for i in idents]
            for r in results:
                index_accepted(ctx, r.manifest_key)
                # the blob event, as it indexes under S3's clock: moto's is the real time, the test's is not
                head = ctx.store.head(r.blob_key, checksum=True)
                write_raw_blob_entry(ctx, dataclasses.replace(head, last_modified_unix_s=at_ns / 1e9), r.frame_sha256)
            return results

        accept_at(T0_NS - 7200 * _NS, [ident(k, agent="history") for k in range(history)])
        first = system.reconciler(ctx).run()
        assert first.checkpoint_after == str(UtcHour.of_unix_ns(T0_NS)), first.to_json()

        clock.advance(seconds=300)
        new = accept_at(clock.now_ns(), [ident(k, agent="new") for k in range(4)])
        measured, report = measure_reconcile(system, policy=FAST)
        assert report.hours_scanned == [str(UtcHour.of_unix_ns(T0_NS))] and report.entries == len(new)
        # every derived entry present: one GET per entry; the hour's listing and the raw-blobs-by-time
        # listings of it and the hour before (protocol §12 R3)
        assert measured == expect("reconciler", {"entry.verified": len(new), "listing": 1, "blob_listing": 2,
                                                 "run": 1})
    finally:
        system.stop()


@pytest.mark.parametrize("orphans", [2, 6])
def test_the_scheduled_gc_costs_what_the_model_says_per_orphan(runtime: Any, orphans: int) -> None:
    """The daily GC (rule G-B3: the newest committed audit's orphan candidates): its cost follows
    the orphans the audit found, whatever the number of blobs; a day without a new audit costs
    one run of the state machine and one listing."""
    from lightmetrics.harness.testing.faults import FaultInjector, FaultRule

    system = make_system(runtime, OffsetClock(2 * 3600 * _NS), retry_horizon_s=60, gc_grace_s=WAIT_S)
    try:
        ctx = system.work_context(policy=FAST)
        actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=FrozenClock(OLD_NS),
                              policy=FAST)
        FaultInjector(actx.store.client).add(  # type: ignore[attr-defined]
            FaultRule(fault="down", operation="PutObject", key_contains="accepted/v1/", times=-1))
        blobs = [accept_batch(actx, ident(k), make_frame(ident(k))).blob_key for k in range(orphans)]
        run = ctx.codec.audit_run("week-1")
        ctx.store.put_if_absent(f"{run}orphan-blob-candidates/part-00000.jsonl",
                                "\n".join(f'{{"blob_key": "{b}"}}' for b in blobs).encode())
        ctx.store.put_if_absent(f"{run}summary.json", b"{}")
        ctx.store.put_if_absent(ctx.codec.audit_committed(OLD_NS // _NS, "week-1"), b"{}")
        scheduled = {"mode": "gc", "dry_run": False, "source": "audit", "audit_run": "latest", "page_size": 4}
        measured = measure_reap(system, **scheduled)
        assert measured == expect("gc-audit", {"candidate.orphan": orphans, "page": math.ceil(orphans / 4),
                                               "part": 1, "run": 1})
        assert not any(ctx.store.head(b) for b in blobs)
        measured = measure_reap(system, **scheduled)
        assert measured == expect("gc-audit", {"run.nothing_new": 1})
    finally:
        system.stop()
