"""``lmctl cost``'s honest model (issue 26): messages per SQS invocation from the rate and the
configured window, the indexers' CPU priced, one and three years of history, the derived-state
upkeep share, and the settings 1,000 and 10,000 batches/s need."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from lightmetrics.cli.main import cli
from lightmetrics.deployment.pricing import PRICE_TABLE
from lightmetrics.operator_tools.cost_model import UPKEEP_PARTS, estimate
from lightmetrics.operator_tools.cost_report import SCALE_SETTINGS, cost_report, settings_for_rate
from lightmetrics.operator_tools.cost_workload import Assumptions
from lightmetrics.operator_tools.indexer_invocations import index_messages_per_invocation
from lightmetrics.operator_tools.sqs_batching import messages_per_invocation

RATES = st.floats(min_value=0.01, max_value=20_000)
WINDOWS = st.floats(min_value=0, max_value=300)
SIZES = st.integers(min_value=1, max_value=10_000)


def _m(rate: float, window: float, size: int) -> float:
    return messages_per_invocation(rate, window_s=window, batch_size=size, pollers=5, poll_gap_s=0.1)


@settings(max_examples=200, deadline=None)
@given(RATES, RATES, WINDOWS, WINDOWS, SIZES)
def test_messages_per_invocation_rise_with_rate_and_window_never_above_the_batch_size(
        r1: float, r2: float, w1: float, w2: float, size: int) -> None:
    (lo_r, hi_r), (lo_w, hi_w) = sorted((r1, r2)), sorted((w1, w2))
    assert 1.0 <= _m(lo_r, lo_w, size) <= _m(hi_r, lo_w, size) + 1e-9
    assert _m(lo_r, lo_w, size) <= _m(lo_r, hi_w, size) + 1e-9
    assert _m(hi_r, hi_w, size) <= size + 1e-9


def test_messages_per_invocation_by_hand() -> None:
    # mu = 100 / 5 * 0.1 = 2: 1 + sum_{k=1}^{9} P(N >= k) = 1 + E[min(N, 9)], about 1 + 2
    assert _m(100, 0, 10) == pytest.approx(3.0, abs=1e-3)
    # a batch of one message is one message; a window fills the batch at 10,000/s
    assert _m(100, 0, 1) == 1.0 and _m(10_000, 20, 500) == 500.0
    # mu = 0.5: 1 + P(N >= 1) = 2 - e^-0.5 for a batch size of 2
    assert _m(25, 0, 2) == pytest.approx(2 - 0.6065306597, rel=1e-9)
    # the review's figure: no window, 100 batches/s, batches of 2-3 messages
    assert 2 <= index_messages_per_invocation(100, Assumptions()) <= 3
    # --assume sqs_batch_size=N still overrides
    assert index_messages_per_invocation(100, Assumptions(sqs_batch_size=2)) == 2.0
    with pytest.raises(ValueError):
        _m(1, 0, 0)


def test_the_sqs_and_duration_lines_follow_the_window() -> None:
    def line(a: Assumptions, item: str) -> float:
        lines = estimate(100, 4096, assumptions=a)["designs"]["lightmetrics"]["lines"]
        return next(x["usd_per_million_batches"] for x in lines if x["item"] == item)
    none, windowed = Assumptions(), Assumptions(sqs_batching_window_s=20, sqs_max_batch_size=500)
    assert line(windowed, "indexing: SQS requests") < line(none, "indexing: SQS requests")
    # 2 sends a batch, 2 queues x (receive + delete) per invocation of m messages: 0.40 per million
    m = index_messages_per_invocation(100, none)
    assert line(none, "indexing: SQS requests") == pytest.approx(2 * (1 + 2 / m) * 0.40)
    # CPU is per record: the duration line never falls below the records' CPU at any batch size.
    # Per batch 2 records (manifest, blob) and 5 S3 requests (GET + 2 PUTs, HEAD + PUT): 2.5 a record;
    # the measured figures are at one vCPU, and a 512 MB function has 512 / 1,769 of one.
    gb_s = PRICE_TABLE.price("lambda.gb_second")
    a = Assumptions()
    per_record_s = (a.index_cpu_ms_per_record + 2.5 * a.index_sdk_cpu_ms_per_request) / 1000 * 1769 / 512
    assert line(windowed, "indexing: Lambda duration") >= 2 * per_record_s * 0.5 * gb_s * 1e6
    fixed_s = a.index_cpu_ms_per_invocation / 1000 * 1769 / 512
    assert line(none, "indexing: Lambda duration") == pytest.approx(
        2 / m * (0.08 + fixed_s + m * per_record_s) * 0.5 * gb_s * 1e6)


@pytest.mark.parametrize("rate", [100.0, 1000.0, 10_000.0])
def test_three_years_cost_at_least_one_and_upkeep_is_the_sum_of_its_lines(rate: float) -> None:
    r = cost_report(rate, 4096, overrides={"retention_days": 30.0})
    one, three = r["histories"]
    assert (one["years"], three["years"]) == (1.0, 3.0)
    assert three["per_million_batches_usd"] >= one["per_million_batches_usd"]
    assert three["ratio_lightmetrics_to_alternative"] >= one["ratio_lightmetrics_to_alternative"]
    assert one["history_lines"] and all(three["history_lines"][k] >= v for k, v in one["history_lines"].items())
    ours = r["designs"]["lightmetrics"]
    upkeep = sum(x["usd_per_month"] for x in ours["lines"] + ours["fixed"] if x["group"] in UPKEEP_PARTS)
    assert ours["derived_state_upkeep_share"] == pytest.approx(upkeep / ours["per_month_usd"])
    assert one["derived_state_upkeep_share"] == pytest.approx(ours["derived_state_upkeep_share"])
    assert r["scale"]["settings"] == settings_for_rate(rate)


def test_each_rate_is_priced_at_its_settings() -> None:
    assert settings_for_rate(100) == {} and settings_for_rate(1000) == SCALE_SETTINGS[1000.0]
    assert settings_for_rate(10_000)["reconcile_shards"] == 256
    base = Assumptions(retention_days=30)
    r = cost_report(1000.0, 4096, overrides={"retention_days": 30.0})
    plain = estimate(1000.0, 4096, assumptions=base)
    fixed = {x["item"]: x["usd_per_month"] for x in r["designs"]["lightmetrics"]["fixed"]}
    plain_fixed = {x["item"]: x["usd_per_month"] for x in plain["designs"]["lightmetrics"]["fixed"]}
    assert fixed["reconciler: shard runs"] == pytest.approx(96 * plain_fixed["reconciler: shard runs"])
    # one schedule whatever the shards: its run is one; its SQS requests 10 sends + 96 receives + 96 deletes
    fanout = "reconciler: fan-out (send, receive, delete per shard)"
    runs = 2_629_800 / 300
    assert fixed[fanout] - plain_fixed[fanout] == pytest.approx(runs * (10 + 96 + 96 - 3) * 0.4e-6)
    # 300 pending pages read by every settle task: retention's control table costs more
    parts, plain_parts = (e["designs"]["lightmetrics"]["by_part_per_month_usd"] for e in (r, plain))
    assert parts["retention"] > plain_parts["retention"]
    same = estimate(1000.0, 4096, assumptions=replace(base, retention_max_pending_pages=300, retention_memory_mb=1769),
                    reconcile_shards=96)
    assert r["designs"]["lightmetrics"]["per_month_usd"] == pytest.approx(
        same["designs"]["lightmetrics"]["per_month_usd"])
    # today's design cannot keep up at 1,000/s whatever the settings: the keep-up model says which limit
    assert r["scale"]["keepup_min_headroom"] < 1 and r["scale"]["keepup_first_limit"]


def test_cli_transcript_fits_100_columns_and_json_is_strict() -> None:
    runner = CliRunner()
    for rate in ("100", "1000", "10000"):
        out = runner.invoke(cli, ["cost", "--batches-per-second", rate, "--frame-bytes", "4096", "--retention-days", "30"])
        assert out.exit_code == 0, out.output
        assert max(len(line.rstrip()) for line in out.output.splitlines()) <= 100
        for text in ("by history", "1 year", "3 years", "derived-state upkeep", "ratio to dynamodb-dedupe",
                     "SQS messages per invocation", "keep-up least headroom"):
            assert text in out.output, (rate, text)
    assert "setting: reconcile_shards" in out.output
    doc = runner.invoke(cli, ["cost", "--batches-per-second", "100", "--frame-bytes", "4096", "--json",
                              "--assume", "sqs_batch_size=2"])
    assert doc.exit_code == 0
    est = json.loads(doc.output, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert est["sqs_messages_per_invocation"] == 2.0 and len(est["histories"]) == 2
