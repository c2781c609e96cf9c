"""Issue 14, "keeps up": the reconciler scales out by key-range shards (docs/protocol.md §12 R8).

N shards run side by side, shard i over range i of every hour's range plan, each with its own
checkpoint; in a sharded hour a healthy entry costs 1 GET + 1 HEAD; the overall checkpoint is the
slowest shard's; a plan with more ranges than shards keeps its hours open, loudly.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from typing import Any

import pytest
from conftest import FAST, T0_NS, ident
from test_cli import LMCTL
from test_reconcile import H0, make_system, purge
from test_reconcile_bounded import accept_indexed, seed_history
from walk_support import set_last_modified

from lightmetrics.admin.status import system_status
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import queue_depths
from lightmetrics.deployment.settings import MAX_RECONCILE_SHARDS, Settings
from lightmetrics.derived import reconcile
from lightmetrics.derived.hour_ranges import MAX_RANGES, RangePlan, RangePlanError, RangePlans, equal_count_cuts
from lightmetrics.derived.reconcile import CP_PROGRESS_SAVED
from lightmetrics.derived.reconcile_state import (
    CHECKPOINT_PK,
    ShardError,
    UnownedRangesError,
    checkpoint_sk,
    read_shard_checkpoints,
)
from lightmetrics.protocol.errors import ConfigError
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.work import crashpoints

_NS = 1_000_000_000
HOUR_NS = 3600 * _NS


def sharded_system(runtime, clock, shards: int, **overrides):  # type: ignore[no-untyped-def]
    """A system of ``shards`` reconciler shards whose tests index by hand (no notifications)."""
    system = make_system(runtime, clock, reconcile_shards=shards, **overrides)
    system.notifications(False)
    purge(system, runtime)
    return system


def entry_names(system, hour: UtcHour) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    """``hour``'s accepted-by-time prefix and its entry names, in key order."""
    ctx = system.work_context()
    prefix = ctx.codec.accepted_by_time_hour(hour)
    return prefix, [k[len(prefix):] for k in ctx.store.list_keys(prefix, limit=10**9)]


def plan_of_entries(system, hour: UtcHour, ranges: int) -> RangePlan:  # type: ignore[no-untyped-def]
    """Equal-count cuts of ``hour``'s entries, effective from ``hour``, written two hours before it
    (the earliest a plan may be written)."""
    _, names = entry_names(system, hour)
    plans = RangePlans(system.work_context().table)
    return plans.propose(equal_count_cuts(names, ranges), effective_from=hour, now_ns=hour.start_ns - 2 * HOUR_NS)


def checkpoints_at(system, hour: UtcHour, now_ns: int) -> None:  # type: ignore[no-untyped-def]
    """Every shard's checkpoint at ``hour`` (earlier hours closed long ago, as earlier runs leave them)."""
    for shard in range(system.settings.reconcile_shards):
        assert system.reconciler(shard=shard)._save(hour, None, now_ns)


class Observed:
    """What one shard's run sent: the GetObject calls per key (counted at the client, beside the
    run's RequestCounter) and the ``accepted-by-time`` keys its listings returned."""

    def __init__(self, ctx: Any) -> None:
        self.gets: Counter[str] = Counter()
        self.listed: list[str] = []
        ctx.store.client.meta.events.register("before-parameter-build.s3.GetObject", self._on_get)
        listing = ctx.store.list_modified

        def recording(prefix: str, **kw: Any) -> list[tuple[str, int]]:
            entries = listing(prefix, **kw)
            if "accepted-by-time/" in prefix:
                self.listed.extend(key for key, _ in entries)
            return entries

        ctx.store.list_modified = recording

    def _on_get(self, params: dict[str, Any], **_kw: Any) -> None:
        self.gets[params["Key"]] += 1


def run_shard(system, shard: int, *, metrics: Any = None, **kw: Any):  # type: ignore[no-untyped-def]
    """One run of ``shard``: its report, what it read and listed, and its requests by API."""
    counter = RequestCounter()
    extra = {"metrics": metrics} if metrics is not None else {}
    ctx = system.work_context(policy=FAST, counter=counter, **extra)
    seen = Observed(ctx)
    with counter.operation("reconcile") as op:
        report = system.reconciler(ctx, shard=shard).run(**kw)
    return report, seen, dict(op.by_api)


def record_keys(system, results) -> set[str]:  # type: ignore[no-untyped-def]
    return {r.manifest_key for r in results}


def by_range(system, plan: RangePlan, hour: UtcHour, results) -> dict[int, set[str]]:  # type: ignore[no-untyped-def]
    """The records of ``results`` by the range their ``hour`` entry is in."""
    codec = system.work_context().codec
    out: dict[int, set[str]] = {i: set() for i in range(plan.ranges)}
    for r in results:
        name = codec.accepted_by_time(hour, codec.parse(r.manifest_key).identity).rsplit("/", 1)[1]
        out[plan.range_of(name)].add(r.manifest_key)
    return out


# ------------------------------------------------------------------------------------ a. one hour, three shards


def test_every_entry_of_a_three_range_hour_is_checked_by_exactly_one_shard(runtime, clock):  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 3)
    try:
        results = accept_indexed(system, clock, "spread", 12)
        prefix, names = entry_names(system, H0)
        plan = plan_of_entries(system, H0, 3)
        ranges = by_range(system, plan, H0, results)
        assert plan.ranges == 3 and [len(ranges[i]) for i in range(3)] == [4, 4, 4]
        # A raw-blobs-by-time entry of range 1 is lost; its blob's LastModified set on the test's
        # clock (moto stamps the real one), so the repair writes the very key back.
        ctx = system.work_context(policy=FAST)
        victim = next(r for r in results if r.manifest_key in ranges[1])
        lost = ctx.codec.raw_blobs_by_time(H0, victim.frame_sha256)
        runtime.boto3_client("s3").delete_object(Bucket=system.bucket, Key=lost)
        set_last_modified(system.bucket, victim.blob_key, T0_NS)
        assert ctx.store.head(lost) is None
        clock.advance(seconds=3600 + 900)  # 17:15: hour 16 has settled
        checkpoints_at(system, H0, clock.now_ns())

        gets: dict[int, Counter[str]] = {}
        listed: dict[int, list[str]] = {}
        for shard in range(3):
            report, seen, by_api = run_shard(system, shard)
            gets[shard], listed[shard] = seen.gets, seen.listed
            wanted = {"NOOP_RESOLVED": 3, "DONE": 1} if shard == 1 else {"NOOP_RESOLVED": 4}
            assert report.outcomes == wanted, report.to_json()  # shard 1 repaired the lost entry
            if shard == 1:  # 3 healthy: a HEAD each; the victim: its 2 misses, then the repair's
                # by-blob and blob HEADs and the hour's tombstone before its write — not its index
                # entry again (the misses already said so; 9 before)
                assert by_api["s3.HeadObject"] == 3 + 2 + 2 + 1, by_api
            assert report.closed == [str(H0)]
        records = record_keys(system, results)
        total = sum(gets.values(), Counter())
        assert {k: n for k, n in total.items() if k in records} == {k: 1 for k in records}  # each once, in all
        for shard in range(3):
            assert {k for k in gets[shard] if k in records} == ranges[shard]  # by its shard only
            assert [k[len(prefix):] for k in listed[shard] if k.startswith(prefix)] == [
                n for n in names if plan.range_of(n) == shard]
        union = sorted(k for shard in range(3) for k in listed[shard] if k.startswith(prefix))
        assert union == [prefix + n for n in names]  # the ranges cover the hour, none twice
        assert ctx.store.head(lost) is not None
        assert read_shard_checkpoints(ctx.table, 3).hour == H0 + 1
    finally:
        system.stop()


# ------------------------------------------------------------------------------------ b. a plan changes


def test_a_plan_for_two_hours_on_leaves_the_open_hour_alone_and_misses_nothing(runtime, clock):  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 3)
    try:
        early = accept_indexed(system, clock, "early", 6)  # hour 16, which no plan governs: one range
        codec = system.work_context().codec
        later_ids = [ident(k, agent="later") for k in range(9)]
        later_names = [codec.accepted_by_time(H0 + 2, i).rsplit("/", 1)[1] for i in later_ids]
        plans = RangePlans(system.work_context().table)
        plan = plans.propose(equal_count_cuts(later_names, 3), effective_from=H0 + 2, now_ns=clock.now_ns())
        assert plans.plan_for(H0).ranges == 1 and plan.ranges == 3  # written while hour 16 is open
        clock.advance(seconds=3600 + 900)  # 17:15
        checkpoints_at(system, H0, clock.now_ns())
        gets: Counter[str] = Counter()
        for shard in range(3):
            report, seen, cost = run_shard(system, shard)
            gets += seen.gets
            assert report.closed == [str(H0)], report.to_json()
            if shard:  # nothing of hours 16 and 17 is theirs: not even a listing
                assert not seen.listed and "s3.ListObjectsV2" not in cost and not report.outcomes
        assert {k for k in gets if k in record_keys(system, early)} == record_keys(system, early)

        clock.advance(seconds=45 * 60)  # 18:00, the plan's first hour
        later = accept_indexed(system, clock, "later", 9)
        ranges = by_range(system, plan, H0 + 2, later)
        assert [len(ranges[i]) for i in range(3)] == [3, 3, 3]
        clock.advance(seconds=3600 + 900)  # 19:15: hour 18 has settled
        for shard in range(3):
            report, seen, _ = run_shard(system, shard)
            gets += seen.gets
            assert {k for k in seen.gets if k in record_keys(system, later)} == ranges[shard], report.to_json()
            assert str(H0 + 2) in report.closed
        records = record_keys(system, early) | record_keys(system, later)
        assert {k: n for k, n in gets.items() if k in records} == {k: 1 for k in records}
    finally:
        system.stop()


# ------------------------------------------------------------------------------------ c. per-entry cost


def _sharded_healthy_cost(runtime, clock, depth: int) -> list[dict[str, int]]:  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 2)
    try:
        seed_history(system.bucket, depth)  # other hours, closed long ago
        accept_indexed(system, clock, "new", 6)
        assert plan_of_entries(system, H0, 2).ranges == 2
        checkpoints_at(system, H0, clock.now_ns())
        costs = []
        for shard in (0, 1):
            report, _, cost = run_shard(system, shard)
            assert report.entries == 3 and report.outcomes == {"NOOP_RESOLVED": 3}, report.to_json()
            assert report.blob_heads == 3 and report.blob_hours_listed == 0
            costs.append(cost)
        return costs
    finally:
        system.stop()


def test_a_healthy_entry_of_a_sharded_hour_costs_one_get_and_one_head_whatever_the_history(runtime, clock):  # type: ignore[no-untyped-def]
    shallow = _sharded_healthy_cost(runtime, clock, 1_000)
    deep = _sharded_healthy_cost(runtime, clock, 100_000)
    print(f"\nsharded reconcile, 3 healthy entries per shard: history 1,000 -> {shallow}; 100,000 -> {deep}")
    assert shallow == deep
    # per entry: the record's GET and its blob entry's HEAD; per run: the range's one LIST, the
    # checkpoint read and write and the plans' Query — and shard 0 reads every shard's checkpoint
    # for the overall lag (R8)
    per_shard = {"s3.GetObject": 3, "s3.HeadObject": 3, "s3.ListObjectsV2": 1, "dynamodb.GetItem": 1,
                 "dynamodb.Query": 1, "dynamodb.PutItem": 1}
    assert shallow == [{**per_shard, "dynamodb.GetItem": 1 + 2}, per_shard]


# ------------------------------------------------------------------------------------ d. independence, status, a crash


def stamp_each_range_newest_last(system, plan: RangePlan, hour: UtcHour) -> None:  # type: ignore[no-untyped-def]
    """Every entry's LastModified well in the past, the last of each range the newest: with a margin of
    0 a cursor's bound vouches for every entry behind it (as test_reconcile_progress stamps one hour)."""
    prefix, names = entry_names(system, hour)
    base = time.time_ns() // _NS * _NS - 100 * _NS
    last = {plan.range_of(n): n for n in names}
    for n in names:
        set_last_modified(system.bucket, prefix + n, base + (10 * _NS if last[plan.range_of(n)] == n else 0))


def test_shards_close_hours_on_their_own_and_a_crashed_shard_disturbs_no_other(runtime, clock, monkeypatch, metrics):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(reconcile, "SAVE_EVERY_ENTRIES", 2, raising=False)
    system = sharded_system(runtime, clock, 3, reconcile_margin_s=0)
    try:
        results = accept_indexed(system, clock, "apart", 18)
        plan = plan_of_entries(system, H0, 3)
        ranges = by_range(system, plan, H0, results)
        stamp_each_range_newest_last(system, plan, H0)
        clock.advance(seconds=3600 + 900)  # 17:15
        checkpoints_at(system, H0, clock.now_ns())
        ctx = system.work_context(policy=FAST)
        table = ctx.table

        def status() -> dict[str, Any]:
            sqs = runtime.boto3_client("sqs")
            return system_status(ctx, system.settings, queue_depths(lambda: sqs))["reconciler"]

        first, _, _ = run_shard(system, 0, metrics=metrics)
        assert first.closed == [str(H0)] and first.lag_s == 15 * 60
        # the overall lag is the slowest shard's: shard 0 emits it, the others their own (R8)
        assert metrics.values["ReconcilerLagSeconds"] == 75 * 60 and first.slowest_shard == "1"
        assert (status()["checkpoint"], status()["slowest_shard"], status()["lag_s"]) == (str(H0), 1, 75 * 60)

        untouched = {i: table.get(CHECKPOINT_PK, checkpoint_sk(i)) for i in (0, 2)}
        counter = RequestCounter()
        crashing = system.work_context(policy=FAST, counter=counter)
        seen = Observed(crashing)
        hook, _ = crashpoints.crash_once_at(CP_PROGRESS_SAVED)
        with crashpoints.hooked(hook), pytest.raises(crashpoints.InjectedCrash):
            system.reconciler(crashing, shard=1).run()  # the Lambda dies right after a save inside hour 16
        saved = system.reconciler(shard=1).checkpoint()
        assert saved.hour == H0 and saved.scan_from == H0 and saved.scan_after and sum(seen.gets.values()) == 2
        assert {i: table.get(CHECKPOINT_PK, checkpoint_sk(i)) for i in (0, 2)} == untouched
        resumed, again, _ = run_shard(system, 1)
        assert resumed.verified_earlier == 2 and resumed.closed == [str(H0)]
        both = seen.gets + again.gets
        assert {k: n for k, n in both.items() if k in ranges[1]} == {k: 1 for k in ranges[1]}  # nothing lost
        assert (status()["checkpoint"], status()["slowest_shard"]) == (str(H0), 2)

        last, _, _ = run_shard(system, 2)
        assert last.closed == [str(H0)]
        assert (status()["checkpoint"], status()["slowest_shard"]) == (str(H0 + 1), 0)
    finally:
        system.stop()


# ------------------------------------------------------------------------------------ e. ranges without a shard


def test_a_plan_with_more_ranges_than_shards_keeps_its_hour_open_and_names_the_ranges(runtime, clock):  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 2)
    try:
        accept_indexed(system, clock, "over", 9)
        plan_of_entries(system, H0, 3)  # by hand: `lmctl reconcile plan` refuses it (test_plan_through_the_cli)
        clock.advance(seconds=3600 + 900)
        checkpoints_at(system, H0, clock.now_ns())
        for shard in (0, 1):
            with pytest.raises(UnownedRangesError) as err:
                system.reconciler(shard=shard).run()
            message = str(err.value)
            assert "range 2 of 3 has no shard" in message and "LM_RECONCILE_SHARDS = 2" in message
            assert str(H0) in message, message
            report = err.value.report
            assert report.outcomes == {"NOOP_RESOLVED": 3}  # its own range is checked all the same
            assert report.closed == [] and "range 2 of 3 has no shard" in report.not_closed_because
            assert system.reconciler(shard=shard).checkpoint().hour == H0
        assert read_shard_checkpoints(system.work_context().table, 2).hour == H0
    finally:
        system.stop()


def test_one_shard_reads_no_plan_and_checks_every_range(runtime, clock, monkeypatch):  # type: ignore[no-untyped-def]
    """LM_RECONCILE_SHARDS = 1 (every deployment before shards): the one shard owns every range."""
    system = sharded_system(runtime, clock, 1)
    try:
        results = accept_indexed(system, clock, "alone", 6)
        plan_of_entries(system, H0, 3)  # left from a larger deployment
        clock.advance(seconds=3600 + 900)
        checkpoints_at(system, H0, clock.now_ns())

        def no_plans(*_a: Any) -> None:
            raise AssertionError("one shard reads no plan")

        monkeypatch.setattr(reconcile, "RangePlans", no_plans)
        report, seen, cost = run_shard(system, 0)
        assert report.outcomes == {"NOOP_RESOLVED": 6} and report.closed == [str(H0)]
        assert set(seen.gets) == record_keys(system, results) and report.blob_hours_listed == 2
    finally:
        system.stop()


# ------------------------------------------------------------------------------------ f. proposing plans


def test_a_plan_too_soon_out_of_order_or_twice_is_refused(runtime, clock):  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 2)
    try:
        plans = RangePlans(system.work_context().table)
        with pytest.raises(RangePlanError, match=f"the earliest is {H0 + 2}"):
            plans.propose(("m.json",), effective_from=H0 + 1, now_ns=T0_NS)
        plans.propose(("m.json",), effective_from=H0 + 5, now_ns=T0_NS)
        with pytest.raises(RangePlanError, match="in order"):
            plans.propose(("m.json",), effective_from=H0 + 3, now_ns=T0_NS)
        with pytest.raises(RangePlanError, match="write-once"):
            plans.propose(("k.json",), effective_from=H0 + 5, now_ns=T0_NS)
        assert [p.effective_from for p in RangePlans(plans.table).all()] == [H0 + 5]
    finally:
        system.stop()


def lmctl(system, *args: str, shards: int, as_json: bool = True) -> tuple[int, Any]:  # type: ignore[no-untyped-def]
    env = {**os.environ, **system.environment(), "LM_RECONCILE_SHARDS": str(shards)}
    r = subprocess.run(LMCTL + list(args) + (["--json"] if as_json else []), capture_output=True, text=True,
                       env=env, timeout=120)
    if not as_json:
        return r.returncode, r.stdout + r.stderr
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        return r.returncode, {"stderr": r.stderr}


def clear_of_an_hour_boundary(seconds: int = 90) -> None:
    """lmctl plans on the real clock: keep the next ``seconds`` inside one hour."""
    left = 3600 - time.time() % 3600
    if left < seconds:
        time.sleep(left + 1)


def test_plan_through_the_cli(runtime, clock):  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 3)
    try:
        clear_of_an_hour_boundary()
        accept_indexed(system, clock, "cli", 9)
        hour = str(H0)
        code, out = lmctl(system, "reconcile", "plan", "--ranges", "4", "--hour", hour, shards=3)
        assert code == 2 and "LM_RECONCILE_SHARDS = 3" in out["reason"], out
        code, out = lmctl(system, "reconcile", "plan", "--ranges", "3", "--hour", hour, shards=3)
        assert code == 0 and out["ranges"] == 3 and out["counts"] == [3, 3, 3] and out["entries"] == 9, out
        first = UtcHour.parse(out["effective_from"])  # now + 2 hours (the lmctl process's clock)
        assert first >= UtcHour.of_unix_ns(time.time_ns()) + 1
        # twice in the same hour (an earlier --effective-from is moved to the earliest): refused
        code, out = lmctl(system, "reconcile", "plan", "--ranges", "3", "--hour", hour,
                          "--effective-from", str(first + -1), shards=3)
        assert code == 2 and "write-once" in out["reason"] and f"--effective-from {first + 1}" in out["reason"], out
        code, out = lmctl(system, "reconcile", "plan", "--ranges", "2", "--hour", hour,
                          "--effective-from", str(first + 4), shards=3)
        assert code == 0 and out["effective_from"] == str(first + 4) and out["counts"] == [4, 5], out
        code, out = lmctl(system, "reconcile", "plan", "--ranges", "3", "--hour", hour,
                          "--effective-from", str(first + 2), shards=3)
        assert code == 2 and "in order" in out["reason"] and f"--effective-from {first + 5}" in out["reason"], out
        plans = RangePlans(system.work_context().table).all()
        assert [(p.effective_from, p.ranges) for p in plans] == [(first, 3), (first + 4, 2)]
        code, text = lmctl(system, "reconcile", "plan", "--ranges", "2", "--hour", hour,
                           "--effective-from", str(first + 5), shards=3, as_json=False)
        assert code == 0 and "range plan written" in text and str(first + 5) in text, text
        # The review's F3/F4: a key outside the layout is never a cut, and an hour with too few
        # entries writes no plan (a plan is permanent) but exits 2 saying so.
        ctx = system.work_context()
        ctx.store.client.put_object(Bucket=system.bucket, Key=ctx.codec.accepted_by_time_hour(H0) + "zz/stray",
                                    Body=b"x")
        code, out = lmctl(system, "reconcile", "plan", "--ranges", "3", "--hour", hour,
                          "--effective-from", str(first + 6), shards=3)
        assert code == 0 and out["entries"] == 9 and all("/" not in c for c in out["cuts"]), out
        code, out = lmctl(system, "reconcile", "plan", "--ranges", "3", "--hour", str(H0 + -5),
                          "--effective-from", str(first + 7), shards=3)
        assert code == 2 and "too few for 3" in out["reason"], out
        assert [p.effective_from for p in RangePlans(ctx.table).all()][-1] == first + 6  # none written
    finally:
        system.stop()


def test_reconcile_through_the_cli_runs_every_shard_or_one(runtime, clock):  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 3)
    try:
        code, out = lmctl(system, "reconcile", shards=3)
        assert code == 0 and [r["shard"] for r in out["shards"]] == [0, 1, 2], out
        assert out["checkpoint_after"] == min((r["checkpoint_after"] for r in out["shards"]))
        code, out = lmctl(system, "reconcile", "--shard", "2", shards=3)
        assert code == 0 and out["shard"] == 2 and "shards" not in out, out
        code, text = lmctl(system, "reconcile", shards=3, as_json=False)  # a table per shard, and the total
        assert code == 0 and "slowest: shard" in text and "total" in text, text
        code, out = lmctl(system, "reconcile", "--shard", "3", shards=3)
        assert code == 2 and "from 0 to 2" in out["reason"], out
    finally:
        system.stop()


# ------------------------------------------------------------------------------------ settings, handler, local runtime


def test_the_shard_count_is_validated_at_start() -> None:
    assert MAX_RECONCILE_SHARDS == MAX_RANGES  # one shard per range of a plan, at most
    assert Settings.from_env({"LM_BUCKET": "b-1"}).reconcile_shards == 1
    for bad in ("0", "257", "two"):
        with pytest.raises(ConfigError, match="LM_RECONCILE_SHARDS"):
            Settings.from_env({"LM_BUCKET": "b-1", "LM_RECONCILE_SHARDS": bad})
    assert Settings.from_env({"LM_BUCKET": "b-1", "LM_RECONCILE_SHARDS": "256"}).reconcile_shards == 256


def test_the_handler_runs_the_shard_its_event_names(runtime, clock, monkeypatch):  # type: ignore[no-untyped-def]
    from functions.reconcile import app as reconcile_app
    from lightmetrics.local.function_host import LambdaContext

    system = sharded_system(runtime, clock, 3)
    try:
        for name, value in system.environment().items():
            monkeypatch.setenv(name, value)
        reconcile_app.reset()
        assert reconcile_app.handler({"shard": 2}, LambdaContext("reconcile"))["shard"] == 2
        scheduled = reconcile_app.handler({"detail-type": "Scheduled Event"}, LambdaContext("reconcile"))
        assert (scheduled["fanout"], scheduled["sent"]) == (True, 3)  # one schedule: a message per shard
        assert reconcile_app.handler({"shard": 0}, LambdaContext("reconcile"))["shard"] == 0
        monkeypatch.delenv("LM_RECONCILE_SHARDS_QUEUE_URL")
        reconcile_app.reset()  # without a shards queue, 3 shards cannot all run: refused, naming the setting
        with pytest.raises(ConfigError, match="LM_RECONCILE_SHARDS_QUEUE_URL is not set"):
            reconcile_app.handler({"detail-type": "Scheduled Event"}, LambdaContext("reconcile"))
        for bad in (3, -1, "1", 1.0, True, None):
            with pytest.raises(ShardError, match="from 0 to 2"):
                reconcile_app.handler({"shard": bad}, LambdaContext("reconcile"))
        items = {i for i in range(3) if system.reconciler(shard=i).checkpoint() is not None}
        assert items == {0, 2}  # each run kept its own checkpoint
    finally:
        reconcile_app.reset()
        system.stop()


def test_the_local_schedule_runs_every_shard(runtime, clock):  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 3)
    try:
        system.start(reconcile_every_s=3600)
        report = system.scheduler.run_now("reconcile")  # the fan-out; the pump runs each shard's message
        assert (report["fanout"], report["sent"]) == (True, 3)
        assert system.drain(timeout_s=60)
        assert all(system.reconciler(shard=i).checkpoint() is not None for i in range(3))
    finally:
        system.stop()
