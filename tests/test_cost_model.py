"""The cost model's arithmetic (issues 9 and 14), every line against a figure computed by hand.

The per-unit request counts themselves are live counts: tests/test_bench.py (hot path) and
tests/test_cost_measured.py (background jobs) check them.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from lightmetrics.cli.main import cli
from lightmetrics.deployment.pricing import PRICE_TABLE, PRICES, PriceTable
from lightmetrics.operator_tools.cost_model import estimate, traffic_lines
from lightmetrics.operator_tools.cost_workload import (
    JOB_REQUESTS,
    MONTH_DAYS,
    MONTH_S,
    WEEKLY_WALKS_PER_MONTH,
    Assumptions,
    job_requests,
    job_units,
)

# A world that is easy to do by hand: 10 batches/s (26,298,000 a month), one month of retention,
# two months of history, every retention-like period one month; 864 agents whose boots last a day,
# so a walk partition holds exactly 1,000 keys (one page); a bucket without S3 Inventory, so the walk
# runs weekly (4.35 a month) beside the daily audit.
SIMPLE = Assumptions(retention_days=MONTH_DAYS, system_age_days=2 * MONTH_DAYS, fleet_agents=864, boot_days=1.0,
                     walks_per_month=WEEKLY_WALKS_PER_MONTH,
                     retry_horizon_days=MONTH_DAYS / 2, log_retention_days=MONTH_DAYS, ops_retention_days=MONTH_DAYS,
                     audits_per_month=MONTH_DAYS, inventory_retention_days=MONTH_DAYS,
                     noncurrent_version_days=MONTH_DAYS, alt_pitr=False, sqs_batch_size=10)
RATE, BATCHES = 10, 26_298_000


def _line(design: dict, item: str) -> dict:
    (line,) = [x for x in design["lines"] + design["fixed"] if x["item"] == item]
    return line


def per_million(design: dict, item: str) -> float:
    return _line(design, item)["usd_per_million_batches"]


@pytest.fixture(scope="module")
def simple() -> dict:
    return estimate(RATE, 1_000_000, assumptions=SIMPLE)


def test_job_units_match_hand_computed_counts() -> None:
    u = job_units(RATE, SIMPLE)
    assert BATCHES == RATE * MONTH_S
    # walk: 52,596 partitions of 1,000 keys (half retained, half reaped), one page each (pages of up
    # to 10,000 keys: one listing each); 1,315 rounds of 40 pages, 94 executions of at most 14
    # rounds; a page spans 1 + 24 hours of a boot: 25 groups of 40 keys, each worth a LIST (W5)
    assert u["walk"] == pytest.approx({
        "key.retained": 0.0, "key.listed": 4.35 * 26_298_000, "key.reaped": 4.35 * 26_298_000,
        "index_listing": 4.35 * 26_298 * 25, "page": 4.35 * 52_596, "page_listing": 0.0,
        "partition": 4.35 * 52_596, "round": 4.35 * 1_315, "continuation": 4.35 * 93,
        "tombstone_check": 4.35 * 52_596 * 25, "run": 4.35})
    # GC, daily from the newest audit (G-B3; SIMPLE audits daily): 0.1% of the month's blobs are
    # orphans, 864 an audit, 2 pages of 500 and one part file each; no run finds nothing new
    assert u["gc"] == pytest.approx({"candidate.orphan": 26_298, "page": 60.875, "part": 30.4375,
                                     "run": 30.4375, "run.nothing_new": 0.0})
    weekly = job_units(RATE, Assumptions(**{**SIMPLE.__dict__, "audits_per_month": MONTH_DAYS / 7}))
    audits = MONTH_DAYS / 7  # 6,048 orphans an audit: 13 pages; the other days' runs find nothing new
    assert weekly["gc"] == pytest.approx({"candidate.orphan": 26_298, "page": audits * 13, "part": audits,
                                          "run": audits, "run.nothing_new": 30.4375 - audits})
    # retention: 730.5 hours of 36,000 batches: 36 pages of 1,000, 2 settle rounds of 20 pages; 24 hours a run
    assert u["retention"] == pytest.approx({"batch": 26_298_000, "page": 730.5 * 36, "settle_round": 730.5 * 2,
                                            "hour": 730.5, "run": 30.4375, "date_listed": 60.875})
    # reconciler: 8,766 runs, each listing 1.25 hours; every entry listed 9 times, checked 1.4 times;
    # each listing page of accepted-by-time comes with two of raw-blobs-by-time (its hour and the one
    # before); progress saved after each scanned hour but the last; 4,200 entries checked a run: no
    # save inside an hour (every 5,000)
    listing = 8766 * 1.25 + 9 * 26_298
    assert u["reconciler"] == pytest.approx({"entry.verified": 1.4 * 26_298_000, "listing": listing,
                                             "blob_listing": 2 * listing, "hour_saved": 8766 * 0.25,
                                             "progress_saved": 0, "run": 8766})
    # ten times the rate: 42,000 entries checked a run, in 9 slices of at most 5,000, saved after 8
    assert job_units(10 * RATE, SIMPLE)["reconciler"]["progress_saved"] == pytest.approx(8766 * 8)
    young = job_units(RATE, Assumptions(retention_days=90, system_age_days=30, walks_per_month=4.35))
    assert young["retention"] == {}  # nothing has expired yet
    assert young["walk"]["key.reaped"] == 0


def test_job_requests_sum_units_times_the_measured_table() -> None:
    table = JOB_REQUESTS["gc-scan"]
    expected: dict[str, int] = {}
    for unit, n in {"blob.old": 10, "blob.young": 5, "page": 2, "run": 1}.items():
        for api, k in table[unit].items():
            expected[api] = expected.get(api, 0) + k * n
    assert job_requests("gc-scan", {"blob.old": 10, "blob.young": 5, "page": 2, "run": 1}) == expected
    assert expected["s3.ListObjectsV2"] == 2 and expected["sfn.transitions"] == 10
    with pytest.raises(ValueError, match="no units"):
        job_requests("walk", {"blob.old": 1})


def test_traffic_lines_price_every_api_by_hand() -> None:
    requests = {"s3.PutObject": 2, "s3.ListObjectsV2": 1, "s3.GetObject": 4, "s3.HeadObject": 1, "s3.DeleteObject": 10,
                "dynamodb.UpdateItem": 3, "dynamodb.TransactWriteItems": 2, "dynamodb.GetItem": 5, "sqs.SendMessage": 5,
                "cloudwatch.GetMetricStatistics": 7, "sfn.transitions": 100, "lambda.Invoke": 10}
    lines = {x["item"]: x for x in traffic_lines("x", requests, SIMPLE, PRICE_TABLE, gb_s=2, log_bytes_per_invocation=640,
                                                  extra_wru=1, extra_rru=2)}
    usd = {k.removeprefix("x: "): v["usd_per_batch"] for k, v in lines.items()}
    assert usd == pytest.approx({
        "S3 PUT/LIST": 3 * 0.005 / 1000,
        "S3 GET/HEAD": 5 * 0.0004 / 1000,  # DELETE is free
        # WRU: 3 updates + 2 transactions x 2 items x 2 + 1; RRU: 5 + 2
        "control table": 12 * 0.625e-6 + 7 * 0.125e-6,
        "SQS requests": 5 * 0.40e-6,
        "CloudWatch GetMetricStatistics": 7 * 0.01 / 1000,
        "Step Functions transitions": 100 * 0.025 / 1000,
        "Lambda invocations": 10 * 0.20e-6,
        "Lambda duration": 2 * 0.0000133334,
        # 10 invocations x (360 + 640) B + 100 transitions x 2,500 B, ingested and kept a month
        "CloudWatch Logs": 260_000e-9 * (0.50 + 0.03),
        # 18 S3 requests (the deletes too) x 700 B, kept a month in the ops bucket
        "S3 access log records": 18 * 700e-9 * 0.023,
        "X-Ray traces": 10 * 0.05 * 5.0e-6,
    })
    assert lines["x: S3 access log records"]["quantity_per_batch"] == 18


def test_alternative_matches_a_hand_computed_bill(simple: dict) -> None:
    alt = simple["designs"]["dynamodb-dedupe"]
    # per batch: invocation 0.20/1e6; 0.12 s x 1 GB x 0.0000133334 (arm64); 1 PUT x 0.005/1000;
    # 2 WRU (item + 1 GSI) x 0.625/1e6; 600 B for a month x 0.25/GB; 1 MB for a month x 0.023/GB;
    # logs (360 + 900) B x (0.50 + 0.03); one access log record 700 B x 0.023; 5 % traced x 5/1e6
    by_hand = (0.20 + 0.12 * 0.0000133334 * 1e6 + 5.0 + 1.25 + 600e-9 * 0.25 * 1e6 + 1e-3 * 0.023 * 1e6
               + 1260e-9 * 0.53 * 1e6 + 700e-9 * 0.023 * 1e6 + 0.05 * 5.0)
    assert by_hand == pytest.approx(32.133908, rel=1e-6)
    assert alt["per_million_batches_usd"] == pytest.approx(by_hand, rel=1e-9)
    assert alt["per_month_usd"] == pytest.approx(by_hand * 1e-6 * BATCHES, rel=1e-9)
    assert simple["batches_per_month"] == BATCHES


def test_hot_path_lines_match_hand_computed_figures(simple: dict) -> None:
    ours = simple["designs"]["lightmetrics"]
    assert per_million(ours, "ingest: S3 PUT/LIST") == pytest.approx(10.0)
    assert per_million(ours, "ingest: S3 access log records") == pytest.approx(2 * 700e-9 * 0.023 * 1e6)
    # indexing: GET + 2 PUTs (manifest), HEAD + PUT (blob)
    assert per_million(ours, "indexing: S3 PUT/LIST") == pytest.approx(15.0)
    assert per_million(ours, "indexing: S3 GET/HEAD") == pytest.approx(0.8)
    # 2 messages x (1 send + 2/10 receive/delete) x 0.40/1e6
    assert per_million(ours, "indexing: SQS requests") == pytest.approx(0.96)
    # 0.2 invocations a batch, each 80 ms of round trips and CPU measured at one vCPU: 0.76 ms, and
    # 10 records of 0.34 ms plus 2.5 S3 requests of 0.73 ms each, x 1,769 / 512 at 512 MB
    cpu_s = (0.76 + 10 * (0.34 + 2.5 * 0.73)) / 1000 * 1769 / 512
    assert per_million(ours, "indexing: Lambda duration") == pytest.approx(0.2 * (0.08 + cpu_s) * 0.5 * 0.0000133334
                                                                          * 1e6)


def test_background_job_lines_match_hand_computed_figures(simple: dict) -> None:
    ours = simple["designs"]["lightmetrics"]
    # reconciler: no PUT for an entry whose blob is listed; 247,639.5 listings a month of
    # accepted-by-time and twice that of raw-blobs-by-time; 1.4 GETs per entry
    assert per_million(ours, "reconciler: S3 PUT/LIST") == pytest.approx(3 * 247_639.5 / BATCHES * 5)
    assert per_million(ours, "reconciler: S3 GET/HEAD") == pytest.approx(1.4 * 0.4)
    # walk: no PUT and no HEAD for a key whose entry its group's LIST shows; a LIST per page, per
    # partition and per (hour, boot) group of retained keys (25 a page), 2 root LISTs a walk
    assert per_million(ours, "walk: S3 PUT/LIST") == pytest.approx(
        4.35 * (2 * 52_596 + 25 * 26_298 + 2) / BATCHES * 5)
    # none per key, 25 tombstone HEADs per page
    assert per_million(ours, "walk: S3 GET/HEAD") == pytest.approx(4.35 * 0.05 * 0.4)
    # a page 1, a round 3 (Plan, Route, Map; 40 pages a round), a continuation 5 (every 14 rounds), the walk 5
    assert per_million(ours, "walk: Step Functions transitions") == pytest.approx(
        4.35 * (52_596 + 3 * 1_315 + 5 * 93 + 5) / BATCHES * 0.025 / 1000 * 1e6)
    assert _line(ours, "walk: Lambda invocations")["quantity_per_batch"] == pytest.approx(
        4.35 * (52_596 + 1_315 + 3 * 93 + 3) / BATCHES)
    # GC: each orphan proven once (its reads are the measured table's) plus the audit's 3
    # confirmation reads; a page 2 reads and 4 transitions, a run 6
    reads = sum(n for api, n in JOB_REQUESTS["gc-audit"]["candidate.orphan"].items()
                if api in ("s3.GetObject", "s3.HeadObject"))
    assert reads == 5
    assert per_million(ours, "GC: S3 GET/HEAD") == pytest.approx(((reads + 3) * 26_298 + 2 * 60.875) / BATCHES * 0.4)
    assert per_million(ours, "GC: Step Functions transitions") == pytest.approx(
        (4 * 60.875 + 6 * 30.4375) / BATCHES * 0.025 / 1000 * 1e6)
    # retention: 3 reads per batch, 2 tombstone HEADs per page, the reaped marker's HEAD per hour
    assert per_million(ours, "retention: S3 GET/HEAD") == pytest.approx((3 + (2 * 26_298 + 730.5) / BATCHES) * 0.4)
    # control table: pages 19 WRU + 8 RRU, settle rounds 4 WRU, hours 12 WRU + 8 RRU, runs 6 WRU + 36 RRU
    # (the finishing step's Query of every marks partition, G-I10);
    # the marks: 6 writes x 172/1024 WRU and (20 + 10.5) x 172/4096 RRU per batch
    wru = (19 * 26_298 + 4 * 1461 + 12 * 730.5 + 6 * 30.4375) / BATCHES + 6 * 172 / 1024
    rru = (8 * 26_298 + 8 * 730.5 + 36 * 30.4375) / BATCHES + 30.5 * 172 / 4096
    assert per_million(ours, "retention: control table") == pytest.approx(wru * 0.625 + rru * 0.125)
    assert per_million(ours, "retention: Step Functions transitions") == pytest.approx(
        (6 * 26_298 + 2 * 1461 + 6 * 730.5 + 4 * 30.4375) / BATCHES * 0.025 / 1000 * 1e6)


def test_audit_and_storage_lines_match_hand_computed_figures(simple: dict) -> None:
    ours = simple["designs"]["lightmetrics"]
    # listed a day: records (2 months) + blobs and 3 derived (1 month) + 3 noncurrent versions and
    # 3 markers (1 month) = 365.25 days of batches; per batch of the month: 365.25 objects
    assert _line(ours, "audit: S3 Inventory")["quantity_per_batch"] == pytest.approx(365.25)
    assert per_million(ours, "audit: S3 Inventory") == pytest.approx(365.25 * 0.0025)
    # a day's report (90 B a row) is kept a month
    assert per_million(ours, "audit: inventory reports (ops bucket)") == pytest.approx(
        365.25 / MONTH_DAYS * 90e-9 * MONTH_DAYS * 0.023 * 1e6)
    # 15,300 rows per vCPU-second, x86, 4 GB per vCPU
    vcpu_h = 365.25 / 15_300 / 3600
    assert per_million(ours, "audit: EMR Serverless vCPU") == pytest.approx(vcpu_h * 0.052624 * 1e6)
    assert per_million(ours, "audit: EMR Serverless memory") == pytest.approx(vcpu_h * 4 * 0.0057785 * 1e6)
    arm = estimate(RATE, 1_000_000, assumptions=Assumptions(**{**SIMPLE.__dict__, "emr_arm64": True}))
    assert per_million(arm["designs"]["lightmetrics"], "audit: EMR Serverless vCPU") == pytest.approx(
        vcpu_h * 0.042094 * 1e6)
    assert per_million(ours, "storage: frames + derived entries (retention period)") == pytest.approx(
        1_001_200e-9 * 0.023 * 1e6)
    assert per_million(ours, "storage: acceptance records (kept forever)") == pytest.approx(700e-9 * 2 * 0.023 * 1e6)
    assert per_million(ours, "storage: noncurrent derived versions") == pytest.approx(1200e-9 * 0.023 * 1e6)


def test_fixed_lines_and_the_summary(simple: dict) -> None:
    ours = simple["designs"]["lightmetrics"]
    fixed = {x["item"]: x["usd_per_month"] for x in ours["fixed"]}
    runs = 2_629_800 / 300
    assert fixed["reconciler: shard runs"] == pytest.approx(
        runs * (0.2e-6 + 0.3 * 1.0 * 0.0000133334 + 1860e-9 * 0.53))
    # one schedule: each run sends its one shard's message (1 SendMessageBatch), which is received and deleted
    assert fixed["reconciler: fan-out (send, receive, delete per shard)"] == pytest.approx(
        runs * (3 * 0.4e-6 + 0.2e-6 + 0.1 * 1.0 * 0.0000133334 + 1860e-9 * 0.53))
    assert fixed["reconciler: SQS idle long polls (shards queue)"] == pytest.approx(5 * 2_629_800 / 20 * 0.40e-6)
    assert fixed["reconciler: closing hours (queue age, DLQs, blockers)"] == pytest.approx(
        730.5 * (3 * 0.01 / 1000 + 3 * 0.4e-6 + 0.125e-6))
    assert fixed["indexing: SQS idle long polls (3 index queues)"] == pytest.approx(3 * 5 * 2_629_800 / 20 * 0.40e-6)
    assert fixed["audit: pipeline state machine"] == pytest.approx(2 * 30.4375 * 0.025 / 1000)
    assert fixed["monitoring: CloudWatch alarms"] == pytest.approx(5.0)
    assert fixed["monitoring: custom metrics"] == pytest.approx(12.0)
    assert fixed["monitoring: dashboards"] == pytest.approx(3.0)
    assert fixed["monitoring: Secrets Manager (token secret)"] == pytest.approx(0.40)
    total = sum(x["usd_per_batch"] for x in ours["lines"]) * BATCHES + sum(fixed.values())
    assert ours["per_month_usd"] == pytest.approx(total)
    assert ours["per_million_batches_usd"] == pytest.approx(total / BATCHES * 1e6)
    parts = ours["by_part_per_month_usd"]
    assert sum(parts.values()) == pytest.approx(total)
    assert set(parts) == {"ingest", "indexing", "reconciler", "walk", "GC", "retention", "audit", "storage",
                          "monitoring"}
    outside = total - parts["ingest"] - parts["indexing"] - parts["storage"]
    assert ours["outside_ingest_indexing_storage_share"] == pytest.approx(outside / total)
    alt = simple["designs"]["dynamodb-dedupe"]
    assert simple["ratio_lightmetrics_to_alternative"] == pytest.approx(total / alt["per_month_usd"])


def test_older_systems_pay_for_walking_reaped_batches() -> None:
    """Without S3 Inventory (the weekly walk's fallback schedule)."""
    young = estimate(1, 4096, assumptions=Assumptions(system_age_days=90, walks_per_month=4.35))["designs"]["lightmetrics"]
    old = estimate(1, 4096, assumptions=Assumptions(system_age_days=3 * 365, walks_per_month=4.35))["designs"][
        "lightmetrics"]
    # the weekly walk re-reads every record ever made: 1,005 reaped days of 86,400 batches, 4.35 times a month
    assert job_units(1, Assumptions(system_age_days=3 * 365, walks_per_month=4.35))["walk"]["key.reaped"] == \
        pytest.approx(4.35 * 1005 * 86_400)
    assert old["by_part_per_million_batches_usd"]["walk"] > 1.5 * young["by_part_per_million_batches_usd"]["walk"]
    assert old["per_million_batches_usd"] > young["per_million_batches_usd"]


def test_price_table_is_dated_and_strict() -> None:
    doubled = PriceTable.from_mapping({"as_of": "2026-01-01", "s3.put_per_1000": 0.010})
    assert doubled.as_of == "2026-01-01" and doubled.price("s3.get_per_1000") == PRICES["s3.get_per_1000"][0]
    est = estimate(1, 4096, prices=doubled)
    assert per_million(est["designs"]["lightmetrics"], "ingest: S3 PUT/LIST") == pytest.approx(20.0)
    for key in ("s3.inventory_per_million_objects", "emr_serverless.vcpu_hour_x86", "emr_serverless.gb_hour_arm64",
                "cloudwatch.logs_ingest_per_gb", "cloudwatch.logs_storage_gb_month", "xray.per_million_traces"):
        assert key in PRICES
    assert PRICES["s3.inventory_per_million_objects"][0] == 0.0025
    with pytest.raises(ValueError, match="unknown price keys"):
        PriceTable.from_mapping({"s3.puts": 1})
    with pytest.raises(ValueError):
        estimate(0, 4096)


def test_lmctl_cost_json_human_and_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    runner = CliRunner()
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"as_of": "2026-02-02", "lambda.per_million_requests": 0.4}))
    out = runner.invoke(cli, ["cost", "--batches-per-second", "10", "--frame-bytes", "1000000", "--prices",
                              str(prices), "--retention-days", str(MONTH_DAYS), "--system-age-days", str(2 * MONTH_DAYS),
                              "--assume", "alt_pitr=false", "--assume", "fleet_agents=864", "--assume", "boot_days=1",
                              "--assume", f"retry_horizon_days={MONTH_DAYS / 2}", "--assume",
                              f"log_retention_days={MONTH_DAYS}", "--assume", f"ops_retention_days={MONTH_DAYS}",
                              "--assume", f"noncurrent_version_days={MONTH_DAYS}", "--json"])
    assert out.exit_code == 0, out.output
    est = json.loads(out.output)
    assert est["prices"]["as_of"] == "2026-02-02"
    assert (est["retention_days"], est["system_age_days"]) == (MONTH_DAYS, 2 * MONTH_DAYS)
    # the alternative by hand, with invocations at 0.40 per million
    assert est["designs"]["dynamodb-dedupe"]["per_million_batches_usd"] == pytest.approx(32.133908 + 0.20, rel=1e-6)
    assert runner.invoke(cli, ["cost", "--batches-per-second", "10", "--frame-bytes", "10", "--assume",
                               "nope=1"]).exit_code == 2
    human = runner.invoke(cli, ["cost", "--batches-per-second", "100", "--frame-bytes", "4096", "--retention-days", "30",
                                "--system-age-days", "365"], env={"COLUMNS": "240"})
    assert human.exit_code == 0, human.output
    for text in ("TOTAL", "dynamodb-dedupe", "ratio to dynamodb-dedupe", "everything but ingest, indexing and storage",
                 "100 batches/s, 4096 B frames, 30 days retention, 365 days of history", "GC: S3 GET/HEAD",
                 "none: S3 Inventory (without: walks_per_month=4.35)"):
        assert text in human.output, text
    assert "walk: S3 PUT/LIST" not in human.output  # the default deployment schedules no walk
    fallback = runner.invoke(cli, ["cost", "--batches-per-second", "100", "--frame-bytes", "4096", "--assume",
                                   "walks_per_month=4.35"], env={"COLUMNS": "240"})
    assert fallback.exit_code == 0, fallback.output
    assert "walk: S3 PUT/LIST" in fallback.output and "4.35 a month over all history (no S3 Inventory)" in fallback.output


def test_the_walk_follows_the_deployment() -> None:
    """Issue 26: where an S3 Inventory runs (the default) the audit moves every W and no walk is
    scheduled, so the model prices none and its cost no longer grows with history; a bucket without
    one walks weekly (the fallback schedule), and that is exactly the walk's lines."""
    from lightmetrics.deployment.resources import SPEC
    from lightmetrics.operator_tools.schedules import scheduled

    assert not scheduled("bootstrap-walk", inventory=True) and Assumptions().walks_per_month == 0
    assert SPEC.state_machine("bootstrap-walk").schedule == "cron(0 3 ? * SUN *)"  # weekly, when it runs
    assert WEEKLY_WALKS_PER_MONTH == pytest.approx(MONTH_DAYS / 7, abs=0.01)
    assert all(n == 0 for n in job_units(100, Assumptions())["walk"].values())
    for days in (365.0, 3 * 365.0):
        on = estimate(100, 4096, assumptions=Assumptions(system_age_days=days))["designs"]["lightmetrics"]
        off = estimate(100, 4096, assumptions=Assumptions(system_age_days=days, walks_per_month=4.35))["designs"][
            "lightmetrics"]
        assert not [x for x in on["lines"] + on["fixed"] if x["item"].startswith("walk:")]
        assert "walk" not in on["by_part_per_month_usd"] and off["by_part_per_month_usd"]["walk"] > 0
        assert off["per_month_usd"] - on["per_month_usd"] == pytest.approx(off["by_part_per_month_usd"]["walk"])


def test_a_weekly_audit_lists_and_keeps_a_seventh_of_a_daily_one(simple: dict) -> None:
    weekly = estimate(RATE, 1_000_000, assumptions=Assumptions(**{**SIMPLE.__dict__, "audits_per_month": MONTH_DAYS / 7,
                                                                 "inventory_retention_days": 14.0}))
    daily, ours = simple["designs"]["lightmetrics"], weekly["designs"]["lightmetrics"]
    assert _line(ours, "audit: S3 Inventory")["quantity_per_batch"] == pytest.approx(365.25 / 7)
    assert per_million(ours, "audit: EMR Serverless vCPU") == pytest.approx(per_million(daily, "audit: EMR Serverless vCPU") / 7)
    # a weekly report (1/7 of the rows a month) kept 14 days instead of a month
    assert per_million(ours, "audit: inventory reports (ops bucket)") == pytest.approx(
        per_million(daily, "audit: inventory reports (ops bucket)") / 7 * 14 / MONTH_DAYS)
