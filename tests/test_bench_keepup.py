"""``lmctl bench keepup``: the keep-up model's properties (lightmetrics.operator_tools.keepup).

Not its figures: that headroom never rises with the rate, that a job scales with its parallelism
until a quota binds, that its per-unit counts are the cost model's (change the measured table and
the model moves), that a family of writes under one partition key meets that partition's rate,
and the command's transcript (a table of at most 100 columns, strict JSON, exit codes).
"""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from lightmetrics.cli.main import cli
from lightmetrics.operator_tools import keepup as model
from lightmetrics.operator_tools.cost_model import estimate
from lightmetrics.operator_tools.cost_workload import (
    JOB_REQUESTS,
    MEASURED_REQUESTS,
    WEEKLY_WALKS_PER_MONTH,
    Assumptions,
)
from lightmetrics.operator_tools.keepup import keepup, retention_capacity_per_batch

RATES = (1, 10, 100, 300, 1000, 3000, 10_000, 30_000)
#: a bucket without S3 Inventory: the walk runs weekly (the default deployment schedules none)
WEEKLY = {"walks_per_month": WEEKLY_WALKS_PER_MONTH}


def _job(report: dict, name: str) -> dict:
    return next(j for j in report["jobs"] if j["job"] == name)


@pytest.mark.parametrize("profile", ["deployed", "docs"])
@pytest.mark.parametrize("walks", [{}, WEEKLY], ids=["inventory", "no-inventory"])
def test_headroom_never_rises_with_the_rate(profile: str, walks: dict) -> None:
    reports = [keepup(r, profile=profile, overrides=walks) for r in RATES]
    names = [j["job"] for j in reports[0]["jobs"]]
    assert len(names) == 9  # 3 indexers, reconciler, walk, GC, retention, audit, rollup
    for name in names:
        headroom = [_job(rep, name)["headroom"] for rep in reports]
        if name == "walk (not scheduled)":  # not scheduled: nothing to follow, at any rate
            assert not walks and headroom == [None] * len(RATES) and _job(reports[0], name)["at_rate"] is None
            continue
        assert all(b <= a * (1 + 1e-9) for a, b in zip(headroom, headroom[1:])), (name, headroom)
        # the rate at which it meets its first limit: below it headroom >= 1, above it < 1
        at = _job(reports[0], name)["at_rate"]
        for rate, h in zip(RATES, headroom):
            if at is not None:
                assert (h >= 1 - 1e-9) == (rate <= at * (1 + 1e-6)), (name, rate, h, at)


def test_can_do_is_the_least_limit_and_headroom_its_ratio() -> None:
    for job in keepup(1000.0)["jobs"] + keepup(1000.0, overrides=WEEKLY)["jobs"]:
        least = min(job["limits"], key=lambda lim: lim["units_per_s"])
        assert job["can_do_per_s"] == least["units_per_s"] and job["first_limit"] == least["name"]
        if job["headroom"] is None:  # the walk where none is scheduled
            assert job["job"] == "walk (not scheduled)" and job["must_follow_per_s"] == 0
            continue
        assert job["headroom"] == pytest.approx(job["can_do_per_s"] / job["must_follow_per_s"])


def test_an_unscheduled_walk_says_so_instead_of_a_headroom() -> None:
    """Where an S3 Inventory runs (the default) the audit moves every W and no walk is scheduled:
    the walk row has nothing to follow, no headroom and no crossing rate, and takes no part in the
    least headroom; its pace is a weekly walk's, and a bootstrap over the history takes keys / pace."""
    on, weekly = keepup(1000.0), keepup(1000.0, overrides=WEEKLY)
    walk, fallback = _job(on, "walk (not scheduled)"), _job(weekly, "walk (weekly)")
    assert (walk["scheduled"], walk["headroom"], walk["at_rate"], walk["must_follow_per_s"]) == (False, None, None, 0)
    assert walk["can_do_per_s"] == pytest.approx(fallback["can_do_per_s"]) and fallback["headroom"] > 0
    assert walk["one_walk_keys"] == pytest.approx(1000.0 * 365 * 86400)  # every record ever accepted
    assert walk["one_walk_hours"] == pytest.approx(walk["one_walk_keys"] / walk["can_do_per_s"] / 3600)
    assert on["min_headroom"] == min(j["headroom"] for j in on["jobs"] if j is not walk)
    assert (on["walk_scheduled"], weekly["walk_scheduled"]) == (False, True)
    human = CliRunner().invoke(cli, ["bench", "keepup", "--rate", "1000"])
    row = next(line for line in human.output.splitlines() if "walk (not scheduled)" in line)
    assert "not scheduled" in row and "walks_per_month=4.35" in human.output
    strict = CliRunner().invoke(cli, ["bench", "keepup", "--rate", "1000", "--require", "1000000", "--json"])
    assert "walk (not scheduled)" not in json.loads(strict.output)["below_require"]


def test_reconciler_scales_with_shards_until_a_quota_binds() -> None:
    shards = [2, 4, 8, 16, 32, 64, 128, 256]
    jobs = [_job(keepup(1000.0, overrides={"reconcile_shards": n}), "reconciler") for n in shards]
    bound = False
    for (n, a), b in zip(zip(shards, jobs), jobs[1:]):
        if b["first_limit"].startswith(f"{2 * n} shard(s)"):
            assert not bound
            assert b["headroom"] == pytest.approx(2 * a["headroom"])
        else:  # a quota binds: more shards change nothing
            bound = True
            assert "hour prefix" in b["first_limit"] and b["can_do_per_s"] == pytest.approx(jobs[-1]["can_do_per_s"])
    assert bound and jobs[0]["first_limit"].startswith("2 shard(s)")


def test_the_reconcilers_shards_take_no_eventbridge_rule_of_their_own() -> None:
    """One schedule fans out to every shard: no job is bound by EventBridge's rules at any shard count,
    and the stack's rules are the same few at 1 shard and at 256 (the cdk synth test counts them too)."""
    from lightmetrics.operator_tools.keepup import eventbridge_rules

    for n in (1, 96, 256):
        for walks, inventory in (({}, True), (WEEKLY, False)):
            report = keepup(10_000.0, overrides={"reconcile_shards": n, **walks})
            assert not [lim for j in report["jobs"] for lim in j["limits"] if "EventBridge" in lim["name"]], n
            assert report["eventbridge_rules"] == {"used": eventbridge_rules(inventory=inventory), "quota": 300}
    assert eventbridge_rules() == 6  # reconcile, sweep-dlq; GC's and retention's; rollup, audit
    assert eventbridge_rules(inventory=False) == 6  # the walk's instead of the audit's


def test_walk_scales_with_parallelism_until_inline_maps_40() -> None:
    h = {p: _job(keepup(1000.0, overrides={**WEEKLY, "walk_parallelism": p}), "walk (weekly)") for p in (10, 20, 40, 80)}
    # (a round's share of the continuations moves with the rounds an execution holds: rel 1 %)
    assert h[20]["headroom"] == pytest.approx(2 * h[10]["headroom"], rel=0.01)
    assert h[40]["headroom"] == pytest.approx(4 * h[10]["headroom"], rel=0.01)
    # past 40 the Map runs 40 at once: no gain (its rounds cost a little more history: continuations)
    assert h[80]["headroom"] <= h[40]["headroom"] and h[80]["first_limit"] == "inline Map 40"


def test_retention_scales_with_its_ranges_and_no_partition_binds_first() -> None:
    # hours a run raised, so that what binds first is per range (its pending pages over the grace);
    # with the marks over 32 partition keys (G-I10) no DynamoDB partition binds before 40 ranges
    base = {"retention_hours_per_run": 2400, "retention_max_pending_pages": 40}
    jobs = {p: _job(keepup(100.0, overrides={**base, "range_parallelism": p}), "retention") for p in (1, 2, 4, 40)}
    assert jobs[2]["headroom"] == pytest.approx(2 * jobs[1]["headroom"])
    assert jobs[1]["first_limit"] == jobs[40]["first_limit"] == "max_pending_pages 40"
    assert jobs[40]["headroom"] == pytest.approx(40 * jobs[1]["headroom"])
    assert all(p["share_of_quota"] < 0.5 for p in jobs[40]["partitions"] if p["name"].startswith("DynamoDB"))


def test_the_per_unit_counts_are_the_cost_models() -> None:
    a = Assumptions()
    for rate in (100.0, 1000.0):
        wcu, rcu = retention_capacity_per_batch(rate, a)
        line = next(ln for ln in estimate(rate, 4096)["designs"]["lightmetrics"]["lines"]
                    if ln["item"] == "retention: control table")
        assert wcu + rcu == pytest.approx(line["quantity_per_batch"], rel=1e-12)


def test_the_model_reads_the_measured_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Doubling a measured count moves the model: nothing it uses is typed in twice."""
    before = keepup(1000.0, profile="docs")
    monkeypatch.setitem(JOB_REQUESTS["reconciler"], "entry.verified", {"s3.GetObject": 3})
    monkeypatch.setitem(JOB_REQUESTS["walk"], "page", {**JOB_REQUESTS["walk"]["page"], "dynamodb.UpdateItem": 4})
    monkeypatch.setitem(JOB_REQUESTS["gc-audit"], "candidate.orphan", {"s3.HeadObject": 6, "s3.GetObject": 4})
    monkeypatch.setitem(MEASURED_REQUESTS, "index.raw_blob", {"s3.PutObject": 1})  # no read: one round trip
    after = keepup(1000.0, profile="docs")
    shard = "96 shard(s)"
    assert next(lim for lim in _job(after, "reconciler")["limits"] if lim["name"].startswith(shard))["units_per_s"] \
        < next(lim for lim in _job(before, "reconciler")["limits"] if lim["name"].startswith(shard))["units_per_s"]
    walk_b, walk_a = (_job(r, "walk (not scheduled)")["partitions"][0]["per_unit"] for r in (before, after))
    assert walk_a > walk_b
    gc_b, gc_a = (_job(r, "GC (orphans)")["limits"][1]["units_per_s"] for r in (before, after))
    assert gc_a == pytest.approx(gc_b / 2)
    # (its Lambda limit: at the measured CPU the hour prefix's PUT rate is the first limit either way)
    lam_b, lam_a = (next(lim for lim in _job(r, "indexer: raw blobs")["limits"] if lim["name"].startswith("Lambda"))
                    for r in (before, after))
    assert lam_a["units_per_s"] > lam_b["units_per_s"]


def test_one_partition_key_meets_its_rate() -> None:
    """At 10,000/s every index write of an hour under one prefix passes S3's rate."""
    big = keepup(10_000.0, overrides={"lambda_concurrency": 100_000})
    for name in ("indexer: accepted", "indexer: raw blobs"):
        job = _job(big, name)
        assert job["first_limit"] == "S3 PUT/s, hour prefix"
        assert job["partitions"][0]["share_of_quota"] == pytest.approx(10_000 / 3500)


def test_no_reap_partition_key_takes_half_its_rate_at_10000_per_second() -> None:
    """Retention's and GC's marks spread over MARKS_SHARDS partition keys (docs/protocol.md §15
    G-I10): at 10,000/s with the settings the cost report gives for that rate, no marks shard and no
    reap checkpoint key takes more than half of DynamoDB's per-partition rate; every mark still
    costs what it did (the shards' shares sum to the marks' capacity)."""
    from lightmetrics.operator_tools.cost_report import settings_for_rate
    from lightmetrics.operator_tools.cost_workload import retention_marks_capacity
    from lightmetrics.reaps.gc_marks import MARKS_SHARDS

    for rate in (1000.0, 10_000.0):
        report = keepup(rate, overrides=settings_for_rate(rate))
        for name in ("retention", "GC (orphans)"):
            shares = {p["name"]: p["share_of_quota"] for p in _job(report, name)["partitions"]
                      if p["name"].startswith("DynamoDB")}
            assert any("marks shard" in n for n in shares), shares
            assert max(shares.values()) <= 0.5, (rate, name, shares)
    ret = _job(keepup(10_000.0, overrides=settings_for_rate(10_000.0)), "retention")
    shard_w = next(p for p in ret["partitions"] if p["name"].startswith("DynamoDB WCU, a marks shard"))
    assert shard_w["per_unit"] * MARKS_SHARDS == pytest.approx(retention_marks_capacity(Assumptions())[0])
    assert 0.25 < shard_w["share_of_quota"] < 0.5  # 32 shards: 315 WCU/s each


def test_the_walk_follows_history() -> None:
    """A weekly walk lists every record ever made: twice the history, half the headroom (about)."""
    one = _job(keepup(1000.0, overrides=WEEKLY), "walk (weekly)")
    two = _job(keepup(1000.0, overrides={**WEEKLY, "system_age_days": 730}), "walk (weekly)")
    assert two["must_follow_per_s"] == pytest.approx(2 * one["must_follow_per_s"])
    assert 0.45 < two["headroom"] / one["headroom"] < 0.55


def test_deterministic_fast_and_rejects_unknown_settings() -> None:
    start = time.perf_counter()
    first = keepup(1000.0)
    # Closed form: well under a second idle; the bound only catches a model that became a simulation
    # (1 s failed on a loaded 2-core machine, where the suite runs beside other work).
    assert time.perf_counter() - start < 15.0
    assert keepup(1000.0) == first
    with pytest.raises(ValueError, match="no setting"):
        keepup(1000.0, overrides={"no_such_thing": 1})
    with pytest.raises(ValueError, match="unknown profile"):
        model.configure("nope")


def test_cli_transcript() -> None:
    runner = CliRunner()
    human = runner.invoke(cli, ["bench", "keepup", "--rate", "1000"])
    assert human.exit_code == 0, human.output
    lines = human.output.splitlines()
    assert max(len(line) for line in lines) <= 100
    for name in ("reconciler", "walk (not scheduled)", "retention", "marks shard", "first limit"):
        assert name in human.output
    out = runner.invoke(cli, ["bench", "keepup", "--rate", "100", "--json", "--set", "reconcile_shards=4"])
    doc = json.loads(out.output)
    assert out.exit_code == 0 and doc["exit_code"] == 0 and doc["params"]["reconcile_shards"] == 4
    assert {j["job"] for j in doc["jobs"]} >= {"retention", "GC (orphans)", "Spark audit", "hourly rollup"}
    strict = runner.invoke(cli, ["bench", "keepup", "--rate", "1000", "--require", "10", "--json"])
    assert strict.exit_code == 1 and "retention" in json.loads(strict.output)["below_require"]
    low = runner.invoke(cli, ["bench", "keepup", "--rate", "1000", "--require", "0.001"])
    assert low.exit_code == 0
    for bad in (["--set", "nope=1"], ["--set", "reconcile_shards"], ["--rate", "0"]):
        args = ["bench", "keepup", "--rate", "10", *bad] if bad[0] == "--set" else ["bench", "keepup", *bad]
        assert runner.invoke(cli, args).exit_code == 2


def test_without_an_inventory_gc_proves_every_blob_and_says_where_it_falls_behind() -> None:
    """Without an S3 Inventory no audit runs and the daily GC proves every blob from
    raw-blobs-by-time (deployment/schedules.schedule_input), one a batch: its row follows the
    batch rate, and its daily page budget (max_pages x page_size) is the first limit it meets."""
    from lightmetrics.deployment.resources import SPEC
    from lightmetrics.operator_tools.schedules import schedule_input

    assert json.loads(schedule_input(SPEC.state_machine("reap"), inventory=False) or "")["source"] == "by-time"
    with_inventory = _job(keepup(100.0), "GC (orphans)")
    without = _job(keepup(100.0, overrides=WEEKLY), "GC (every blob, by-time)")
    assert without["unit"] == "blobs" and without["must_follow_per_s"] == pytest.approx(100.0)
    assert with_inventory["must_follow_per_s"] == pytest.approx(0.1)
    budget = 2000 * 500 / 86_400  # the schedule's max_pages, the default page size, a day
    assert without["first_limit"].startswith("max_pages") and without["can_do_per_s"] == pytest.approx(budget)
    assert without["headroom"] == pytest.approx(budget / 100.0) and without["headroom"] < 1
    assert _job(keepup(10.0, overrides=WEEKLY), "GC (every blob, by-time)")["headroom"] > 1
