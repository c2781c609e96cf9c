"""Issue 13, reconciler area: the reconciler closes only what it scanned, success clears the retry
budget, nothing is skipped silently (docs/protocol.md §9, §11, §12)."""

from __future__ import annotations

import base64
import hashlib
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import FAST, T0_NS, consume_all, ident, make_frame

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.admin.blocker_actions import retry
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import KIND_REPAIR, KIND_TIME_ENTRY, index_accepted
from lightmetrics.harness.testing.faults import FaultInjector, FaultRule
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.work.outcome import Outcome
from lightmetrics.work.retry_budget import RetryBudget

H0 = UtcHour.of_unix_ns(T0_NS)  # 2025-11-24T16, the test's "now" hour
_NS = 1_000_000_000


@pytest.fixture
def world(runtime, clock):  # type: ignore[no-untyped-def]
    """A provisioned local system with notifications off: every derived entry is written (or left
    out) by the test, and the index queues stay quiet so hours can close."""
    made: list[LocalSystem] = []

    def make(**overrides):  # type: ignore[no-untyped-def]
        tag = uuid.uuid4().hex[:10]
        values = {"settle_s": 600, "reconcile_lookback_s": 7200, "reconcile_margin_s": 0, **overrides}
        system = LocalSystem(runtime, bucket=f"lm-iv-{tag}", table=f"lm-iv-{tag}", secret_name=f"lm-iv/{tag}",
                             queue_name_prefix=f"iv{tag}-", clock=clock, overrides=values).provision()
        system.notifications(False)
        sqs = runtime.boto3_client("sqs")
        for url in system.queue_urls():  # S3's test events from setting up the notifications
            consume_all(sqs, url)
        made.append(system)
        return system

    yield make
    for system in made:
        system.stop()


def at(clock: FrozenClock, hour: UtcHour, minute: int = 10) -> None:
    clock.advance(ns=hour.start_ns + minute * 60 * _NS - clock.now_ns())


def s3_keys(system, prefix: str) -> set[str]:  # type: ignore[no-untyped-def]
    s3 = system.runtime.boto3_client("s3")
    out: set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=system.bucket, Prefix=prefix):
        out.update(o["Key"] for o in page.get("Contents", []))
    return out


def plant(system, clock, hour: UtcHour, agent: str, n: int = 2) -> set[str]:  # type: ignore[no-untyped-def]
    """Accept ``n`` batches in ``hour`` whose ``accepted-by-time`` entry exists but whose
    ``accepted-by-blob`` entry was lost and whose blob was never indexed. Returns the derived
    keys a repair must write."""
    at(clock, hour)
    actx = accept_context(system.settings, client=system.runtime.boto3_client("s3"), clock=clock, policy=FAST)
    ctx = system.work_context(policy=FAST)
    s3 = system.runtime.boto3_client("s3")
    missing = set()
    for i in range(n):
        identity = ident(i, agent=agent)
        r = accept_batch(actx, identity, make_frame(identity))
        index_accepted(ctx, r.manifest_key)
        by_blob = ctx.codec.accepted_by_blob(r.frame_sha256, identity)
        s3.delete_object(Bucket=system.bucket, Key=by_blob)
        missing.add(by_blob)
    return missing


def repaired(system, missing: set[str]) -> set[str]:  # type: ignore[no-untyped-def]
    return missing & s3_keys(system, system.work_context().codec.prefix + "accepted-by-blob/")


# ------------------------------------------------------------------------------------ property 4
def test_property_4_the_reconciler_closes_only_hours_it_has_scanned(world, clock):  # type: ignore[no-untyped-def]
    """A checkpoint 110 hours behind, more than the 72-hour cap of one run: the first run closes
    no hour it did not scan, and catch-up over several runs repairs every planted entry."""
    system = world()
    cp_hour = H0 + -110
    beyond_cap = cp_hour + 80
    within_cap = cp_hour + 5
    missing = plant(system, clock, within_cap, "inside") | plant(system, clock, beyond_cap, "beyond")
    at(clock, H0, 30)
    assert system.reconciler()._save(cp_hour, None, clock.now_ns())

    first = system.reconciler().run()
    assert len(first.hours_scanned) == 72 and str(beyond_cap) not in first.hours_scanned
    assert str(beyond_cap) not in first.closed, f"closed {beyond_cap} without scanning it: {first.to_json()}"
    assert system.reconciler().checkpoint().hour <= beyond_cap
    assert first.closed and set(first.closed) <= set(first.hours_scanned)
    runs = [first]
    while system.reconciler().checkpoint().hour < H0 and len(runs) < 4:
        runs.append(system.reconciler().run())
        assert set(runs[-1].closed) <= set(runs[-1].hours_scanned)
    assert system.reconciler().checkpoint().hour == H0, [r.to_json() for r in runs]
    assert repaired(system, missing) == missing


def test_property_4_a_capped_run_never_makes_unscanned_entries_look_verified(world, clock):  # type: ignore[no-untyped-def]
    """Entries of an hour beyond the cap are older (S3 LastModified) than an entry the capped run
    did scan: the next run must still check them."""
    system = world()
    cp_hour = H0 + -100
    missing = plant(system, clock, cp_hour + 90, "older")  # beyond the cap, written first
    time.sleep(1.1)  # LastModified has whole seconds
    plant(system, clock, cp_hour + 2, "newer")  # inside the cap, newest LastModified of run 1
    at(clock, H0, 30)
    assert system.reconciler()._save(cp_hour, None, clock.now_ns())

    first = system.reconciler().run()
    assert str(cp_hour + 90) not in first.hours_scanned + first.closed, first.to_json()
    second = system.reconciler().run()
    assert str(cp_hour + 90) in second.hours_scanned
    assert repaired(system, missing) == missing, f"skipped as verified earlier: {second.to_json()}"


def test_property_4_a_rescan_after_downtime_longer_than_the_cap_covers_every_hour(world, clock):  # type: ignore[no-untyped-def]
    """After downtime the lookback (100 h) is longer than one run's cap: the rescan continues
    where the capped run stopped instead of jumping to the checkpoint."""
    system = world(reconcile_lookback_s=100 * 3600)
    missing = plant(system, clock, H0 + -20, "lost")  # closed long ago; its events were lost
    at(clock, H0, 30)
    assert system.reconciler()._save(H0 + -1, None, clock.now_ns() - 10 * 3600 * _NS)  # 10 h without a run

    runs = [system.reconciler().run()]
    assert runs[0].hours_scanned[0] == str(H0 + -100)
    while repaired(system, missing) != missing and len(runs) < 3:
        runs.append(system.reconciler().run())
    scanned = {h for r in runs for h in r.hours_scanned}
    assert {str(H0 + -k) for k in range(1, 101)} <= scanned, [r.hours_scanned[:2] for r in runs]
    assert repaired(system, missing) == missing
    assert system.reconciler().checkpoint().hour == H0


def test_property_4_catch_up_reaches_the_present_while_an_hour_cannot_close(world, clock):  # type: ignore[no-untyped-def]
    """An integrity blocker holds the checkpoint 100 hours back: no hour closes, yet the runs take
    turns over the open hours, so entries beyond the cap are repaired too."""
    system = world()
    cp_hour = H0 + -100
    at(clock, cp_hour)
    actx = accept_context(system.settings, client=system.runtime.boto3_client("s3"), clock=clock, policy=FAST)
    ctx = system.work_context(policy=FAST)
    lost = accept_batch(actx, ident(0, agent="lost"), make_frame(ident(0, agent="lost")))
    index_accepted(ctx, lost.manifest_key)
    ctx.store.client.delete_object(Bucket=system.bucket, Key=lost.blob_key)  # never closable
    missing = plant(system, clock, H0 + -3, "recent")
    at(clock, H0, 30)
    assert system.reconciler()._save(cp_hour, None, clock.now_ns())

    runs = [system.reconciler().run() for _ in range(2)]
    assert repaired(system, missing) == missing, [r.hours_scanned[-1] for r in runs]
    assert [r.closed for r in runs] == [[], []] and system.reconciler().checkpoint().hour == cp_hour
    assert runs[0].continues_from == str(cp_hour + 72) and runs[1].hours_scanned[-1] == str(H0)
    assert system.reconciler().run().hours_scanned[0] == str(cp_hour)  # and round again


def test_property_4_entries_of_an_hour_no_run_had_listed_are_never_counted_verified(world, clock):  # type: ignore[no-untyped-def]
    """A collector whose clock runs ahead writes into a future hour; runs before that hour began
    saw newer entries elsewhere. When the hour arrives its entries are still checked."""
    system = world()
    missing = plant(system, clock, H0 + 2, "ahead")  # written first, into an hour still to come
    time.sleep(1.1)
    plant(system, clock, H0, "now")  # newer LastModified, in the current hour
    for minute in (30, 90, 130):  # on schedule, never downtime
        at(clock, H0, minute)
        report = system.reconciler().run()
    assert str(H0 + 2) in report.hours_scanned
    assert repaired(system, missing) == missing, report.to_json()


# ------------------------------------------------------------------------------------ property 5
def test_property_5_a_units_success_clears_its_retry_budget(world, clock):  # type: ignore[no-untyped-def]
    """A reconcile unit fails once, succeeds in the next run (another process), and fails once more
    long after: that one old failure plus one new one is RETRY_LATER, not a blocker."""
    system = world(retry_budget_count=5, retry_budget_age_s=3600)
    [by_blob] = plant(system, clock, H0, "flaky", n=1)
    manifest_key = system.work_context().codec.accepted(ident(0, agent="flaky"))
    work_key = f"{KIND_REPAIR}:{manifest_key}"
    at(clock, H0, 20)

    def run(fault: bool = False):  # type: ignore[no-untyped-def]
        ctx = system.work_context(policy=FAST)  # a fresh process per scheduled run
        if fault:
            FaultInjector(ctx.store.client).add(FaultRule(fault="503", operation="PutObject", times=-1,
                                                          key_contains="accepted-by-blob/"))
        return system.reconciler(ctx).run(), ctx

    failing, ctx = run(fault=True)
    assert failing.outcomes == {"RETRY_LATER": 1} and ctx.budget.get(work_key).count == 1
    ok, ctx = run()
    assert ok.outcomes == {"DONE": 1} and by_blob in s3_keys(system, by_blob)
    assert ctx.budget.get(work_key) is None, "success left the retry budget in place"

    # much later the same unit fails again (its entry is re-checked after downtime)
    clock.advance(seconds=2 * 3600)
    system.work_context().store.client.delete_object(Bucket=system.bucket, Key=by_blob)
    again, ctx = run(fault=True)
    assert again.outcomes == {"RETRY_LATER": 1}, again.to_json()
    assert ctx.blockers.list() == []


@pytest.fixture
def atomic_dynamodb_writes(monkeypatch):  # type: ignore[no-untyped-def]
    """DynamoDB applies each conditional write to an item atomically; moto checks the condition and
    applies the update without a lock. Serialise moto's UpdateItem (the embedded server runs in this
    process) so concurrent requests interleave as they do in DynamoDB: request by request."""
    from moto.dynamodb.models import DynamoDBBackend

    lock = threading.Lock()
    unlocked = DynamoDBBackend.update_item

    def update_item(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        with lock:
            return unlocked(self, *args, **kwargs)

    monkeypatch.setattr(DynamoDBBackend, "update_item", update_item)


def test_property_5_an_expired_budget_item_counts_as_absent(world, clock, atomic_dynamodb_writes):  # type: ignore[no-untyped-def]
    system = world()
    table = system.work_context().table
    budget = RetryBudget(table, max_count=5, max_age_s=3600, clock=clock)
    first = budget.record_failure("k:stale-by-age", "503")
    assert (first.count, first.exhausted) == (1, False)
    clock.advance(seconds=3601)  # TTL deletes lazily: the item is still there
    assert budget.get("k:stale-by-age") is not None
    again = budget.record_failure("k:stale-by-age", "503")
    assert (again.count, again.first_seen_ns, again.exhausted) == (1, clock.now_ns(), False), again

    # an item whose TTL has passed (written under another age setting) is absent as well
    now_s = clock.now_ns() // _NS
    table.put({"pk": RetryBudget.pk("k:ttl-passed"), "sk": "budget", "count": 4, "first_seen_ns": clock.now_ns() - 60 * _NS,
               "last_seen_ns": clock.now_ns() - 30 * _NS, "expires_at": now_s - 1, "work_key": "k:ttl-passed"})
    state = budget.record_failure("k:ttl-passed", "503")
    assert (state.count, state.exhausted) == (1, False), state

    # the reset is atomic: concurrent failures on a stale item are all counted, once each
    clock.advance(seconds=3601)
    with ThreadPoolExecutor(4) as pool:
        states = list(pool.map(lambda _: budget.record_failure("k:stale-by-age", "503"), range(4)))
    assert sorted(st.count for st in states) == [1, 2, 3, 4]
    item = budget.get("k:stale-by-age")
    assert item is not None and item.count == 4 and item.first_seen_ns == clock.now_ns()


# ----------------------------------------------------------------------------------- property 15
def test_property_15_a_blob_with_the_right_size_but_wrong_checksum_is_an_integrity_blocker(world, clock, metrics):  # type: ignore[no-untyped-def]
    system = world()
    at(clock, H0, 5)
    actx = accept_context(system.settings, client=system.runtime.boto3_client("s3"), clock=clock, policy=FAST)
    ctx = system.work_context(policy=FAST, metrics=metrics)
    s3 = ctx.store.client
    results = {}
    for name in ("good", "bad"):
        identity = ident(1, agent=name)
        frame = make_frame(identity)
        results[name] = r = accept_batch(actx, identity, frame)
        index_accepted(ctx, r.manifest_key)
        # a blob S3 holds a SHA-256 for: the right bytes for "good", same-size other bytes for "bad"
        body = frame if name == "good" else bytes(b ^ 0xFF for b in frame)
        s3.put_object(Bucket=system.bucket, Key=r.blob_key, Body=body, ChecksumAlgorithm="SHA256",
                      ChecksumSHA256=base64.b64encode(hashlib.sha256(body).digest()).decode())
    assert ctx.store.head(results["bad"].blob_key).size == len(make_frame(ident(1, agent="bad")))

    report = system.reconciler(ctx).run()
    assert report.outcomes == {"DONE": 1, "BLOCKED": 1}, report.to_json()
    [blocker] = ctx.blockers.list()
    assert blocker.object_key == results["bad"].manifest_key and "checksum" in blocker.reason
    assert "integrity" in blocker.reason and metrics.values.get("IntegrityViolation") == 1


def test_property_15_a_malformed_accepted_by_time_key_is_a_blocker_not_a_counter(world, clock):  # type: ignore[no-untyped-def]
    system = world()
    ctx = system.work_context(policy=FAST)
    stray_hour = H0 + -3
    stray = ctx.codec.accepted_by_time_hour(stray_hour) + "not-a-manifest-id.json"
    ctx.store.client.put_object(Bucket=system.bucket, Key=stray, Body=b"{}")
    at(clock, H0, 30)
    assert system.reconciler(ctx)._save(H0 + -4, None, clock.now_ns())

    report = system.reconciler(ctx).run()
    assert report.outcomes == {"BLOCKED": 1}, report.to_json()
    [blocker] = ctx.blockers.list()
    assert (blocker.kind, blocker.object_key, blocker.source) == (KIND_TIME_ENTRY, stray, "reconcile")
    assert "layout" in blocker.reason
    # like every indexing blocker, it keeps hours open (R1) -- its own and, conservatively, the rest
    assert report.closed == [] and report.checkpoint_after == str(H0 + -4)
    assert "blocker" in report.not_closed_because
    assert system.reconciler(ctx).run().outcomes == {"BLOCKED": 1}  # found again, still no counter

    # the operator removes the stray object and retries: the blocker resolves, the hour closes
    ctx.store.client.delete_object(Bucket=system.bucket, Key=stray)
    assert retry(ctx, blocker.work_key, who="ops").status == "resolved"
    after = system.reconciler(ctx).run()
    assert after.checkpoint_after == str(H0) and Outcome.BLOCKED.value not in after.outcomes
