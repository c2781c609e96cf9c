"""The cost model's arithmetic (issue 9 item 5), against figures computed by hand."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from lightmetrics.cli.main import cli
from lightmetrics.cost_model import MONTH_S, Assumptions, estimate
from lightmetrics.pricing import PRICES, PriceTable

# One month of retention, 1 MB frames, no PITR: easy to do by hand.
SIMPLE = Assumptions(retention_days=MONTH_S / 86400, system_age_days=MONTH_S / 86400, alt_pitr=False)


def _line(design: dict, item: str) -> dict:
    (line,) = [x for x in design["lines"] if x["item"] == item]
    return line


def test_alternative_matches_a_hand_computed_bill():  # type: ignore[no-untyped-def]
    est = estimate(10, 1_000_000, assumptions=SIMPLE)
    alt = est["designs"]["dynamodb-dedupe"]
    # per batch: invocation 0.20/1e6; 0.12 s x 1 GB x 0.0000133334 (arm64); 1 PUT x 0.005/1000;
    # 2 WRU (item + 1 GSI) x 0.625/1e6; 600 B for a month x 0.25/GB; 1 MB for a month x 0.023/GB
    by_hand = 0.20 + 0.12 * 0.0000133334 * 1e6 + 5.0 + 1.25 + 600e-9 * 0.25 * 1e6 + 1e-3 * 0.023 * 1e6
    assert alt["per_million_batches_usd"] == pytest.approx(by_hand, rel=1e-9)
    assert by_hand == pytest.approx(31.200008, rel=1e-9)
    assert est["batches_per_month"] == 10 * 2_629_800
    assert alt["per_month_usd"] == pytest.approx(31.200008e-6 * 26_298_000, rel=1e-9)  # $820.50


def test_lightmetrics_lines_match_hand_computed_figures():  # type: ignore[no-untyped-def]
    est = estimate(10, 1_000_000, assumptions=SIMPLE)
    ours = est["designs"]["lightmetrics"]
    assert _line(ours, "ingest (accept, new): S3 PUT/LIST")["usd_per_million_batches"] == pytest.approx(10.0)
    assert _line(ours, "index accepted manifest: S3 PUT/LIST")["usd_per_million_batches"] == pytest.approx(10.0)
    assert _line(ours, "index raw blob: S3 GET/HEAD")["usd_per_million_batches"] == pytest.approx(0.4)
    # 2 messages x (1 send + 2/10 receive/delete) x 0.40/1e6
    assert _line(ours, "event path: SQS requests")["usd_per_million_batches"] == pytest.approx(0.96)
    # the reconciler lists an entry (1800 s + 900 s settle) / 300 s = 9 times (9/1000 LIST) and
    # repairs it 1 + 120/300 = 1.4 times: 1.4 x (3 PUTs, 2 GET/HEAD)
    assert est["assumptions"]["reconcile_passes_per_entry"] == 9
    assert est["assumptions"]["reconcile_repairs_per_entry"] == pytest.approx(1.4)
    assert _line(ours, "reconciler repairs: S3 PUT/LIST")["usd_per_million_batches"] == pytest.approx(1.4 * 3 * 5)
    assert _line(ours, "reconciler repairs: S3 GET/HEAD")["usd_per_million_batches"] == pytest.approx(1.4 * 2 * 0.4)
    assert _line(ours, "reconciler listings: S3 PUT/LIST")["usd_per_million_batches"] == pytest.approx(9 / 1000 * 5)
    # one month of history walked 4.35 times
    walk = _line(ours, "bootstrap walk (retained batches): S3 PUT/LIST")
    assert walk["quantity_per_batch"] == pytest.approx(4.35 * 3.001)
    assert walk["usd_per_million_batches"] == pytest.approx(4.35 * 3.001 * 5)
    assert not [x for x in ours["lines"] if x["item"].startswith("bootstrap walk (reaped")]
    fixed = {x["item"]: x["usd_per_month"] for x in ours["fixed"]}
    assert fixed["SQS idle long polls (3 index queues)"] == pytest.approx(3 * 5 * 2_629_800 / 20 * 0.40e-6)
    runs = 2_629_800 / 300
    assert fixed["reconciler: scheduled runs"] == pytest.approx(runs * (0.2e-6 + 0.15 * 0.0000133334))
    total = sum(x["usd_per_batch"] for x in ours["lines"])
    assert ours["per_month_usd"] == pytest.approx(total * 26_298_000 + sum(fixed.values()))
    assert sum(ours["per_million_batches_by_group_usd"].values()) == pytest.approx(ours["per_million_batches_usd"])


def test_older_systems_pay_for_walking_reaped_batches():  # type: ignore[no-untyped-def]
    young = estimate(1, 4096, assumptions=Assumptions(system_age_days=90))["designs"]["lightmetrics"]
    old = estimate(1, 4096, assumptions=Assumptions(system_age_days=3 * 365))["designs"]["lightmetrics"]
    reaped = _line(old, "bootstrap walk (reaped batches): S3 GET/HEAD")
    assert reaped["quantity_per_batch"] == pytest.approx(4.35 * (3 * 365 - 90) * 86400 / MONTH_S * 2)
    assert old["per_million_batches_usd"] > young["per_million_batches_usd"]


def test_price_table_is_dated_and_strict():  # type: ignore[no-untyped-def]
    doubled = PriceTable.from_mapping({"as_of": "2026-01-01", "s3.put_per_1000": 0.010})
    assert doubled.as_of == "2026-01-01" and doubled.price("s3.get_per_1000") == PRICES["s3.get_per_1000"][0]
    est = estimate(1, 4096, prices=doubled)
    assert _line(est["designs"]["lightmetrics"], "ingest (accept, new): S3 PUT/LIST")["usd_per_million_batches"] == \
        pytest.approx(20.0)
    with pytest.raises(ValueError, match="unknown price keys"):
        PriceTable.from_mapping({"s3.puts": 1})
    with pytest.raises(ValueError):
        estimate(0, 4096)


def test_lmctl_cost_json_and_errors(tmp_path):  # type: ignore[no-untyped-def]
    runner = CliRunner()
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"as_of": "2026-02-02", "lambda.per_million_requests": 0.4}))
    out = runner.invoke(cli, ["cost", "--batches-per-second", "10", "--frame-bytes", "1000000", "--prices",
                              str(prices), "--retention-days", str(MONTH_S / 86400), "--system-age-days",
                              str(MONTH_S / 86400), "--assume", "alt_pitr=false", "--json"])
    assert out.exit_code == 0, out.output
    est = json.loads(out.output)
    assert est["prices"]["as_of"] == "2026-02-02"
    # the alternative by hand, with invocations at 0.40 per million
    assert est["designs"]["dynamodb-dedupe"]["per_million_batches_usd"] == pytest.approx(31.200008 + 0.20)
    assert runner.invoke(cli, ["cost", "--batches-per-second", "10", "--frame-bytes", "10", "--assume",
                               "nope=1"]).exit_code == 2
    human = runner.invoke(cli, ["cost", "--batches-per-second", "5", "--frame-bytes", "2048"])
    assert human.exit_code == 0 and "TOTAL" in human.output and "dynamodb-dedupe" in human.output
