"""``lmctl bench indexer-cpu``: the indexers' own CPU, measured through the real SQS batch handler
over the in-memory adapters, split into a fixed part per invocation and a part per record — the
figures the cost model's ``index_cpu_*`` defaults come from (docs/cost.md "The indexers' CPU")."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from lightmetrics.cli.main import cli
from lightmetrics.derived.indexing import KIND_ACCEPTED, KIND_RAW_BLOB
from lightmetrics.harness.bench import indexer_cpu
from lightmetrics.harness.bench.indexer_cpu import fit, run_indexer_cpu
from lightmetrics.operator_tools.cost_workload import Assumptions


@pytest.fixture(scope="module")
def report() -> dict:
    return run_indexer_cpu(sizes=(1, 10, 100), invocations=3)


def test_the_report_has_a_row_per_indexer_and_size_and_positive_figures(report: dict) -> None:
    assert set(report["kinds"]) == {KIND_ACCEPTED, KIND_RAW_BLOB}
    for kind in report["kinds"].values():
        assert [r["batch_size"] for r in kind["rows"]] == [1, 10, 100]
        assert all(r["invocations"] == 3 and r["cpu_ms_per_invocation"] > 0 for r in kind["rows"])
        assert all(r["cpu_ms_per_record"] == pytest.approx(r["cpu_ms_per_invocation"] / r["batch_size"])
                   for r in kind["rows"])
        assert kind["fit"]["per_record_ms"] > 0
    assert report["fit"]["per_record_ms"] > 0 and report["sdk_cpu_ms_per_request"] > 0
    assert report["machine"] and report["date"] and report["clock"].startswith("time.process_time")


def test_records_cost_cpu_of_their_own_and_the_fixed_part_is_not_counted_per_record(report: dict) -> None:
    for kind in report["kinds"].values():
        by_size = {r["batch_size"]: r["cpu_ms_per_invocation"] for r in kind["rows"]}
        # a batch of 100 costs more than one of 1 (records do work), and less than 100 invocations
        # of one record (the fixed part is paid once an invocation)
        assert by_size[1] < by_size[100] < 100 * by_size[1]
        # the split reproduces the largest size's invocation (it is fitted through it)
        f = kind["fit"]
        assert f["fixed_ms"] + 100 * f["per_record_ms"] == pytest.approx(by_size[100])


def test_the_cost_models_defaults_are_of_the_measured_order() -> None:
    # The old assumption (100 ms a record at 512 MB, 29 ms at one vCPU) was 10x off a measurement;
    # the defaults are a measurement, so a fresh one on any machine lands within a factor of 10.
    measured = run_indexer_cpu(sizes=(1, 20), invocations=3)
    a = Assumptions()
    fresh = measured["fit"]["per_record_ms"] + 2.5 * measured["sdk_cpu_ms_per_request"]
    default = a.index_cpu_ms_per_record + 2.5 * a.index_sdk_cpu_ms_per_request
    assert default / 10 < fresh < default * 10


def test_fit_splits_fixed_and_per_record() -> None:
    f = fit({1: 0.0015, 10: 0.006, 100: 0.0510})
    assert f["per_record_ms"] == pytest.approx(0.5) and f["fixed_ms"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        run_indexer_cpu(sizes=(10,), invocations=1)


def test_the_command_prints_a_table_and_strict_json() -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["bench", "indexer-cpu", "--sizes", "1,5", "--invocations", "2"])
    assert out.exit_code == 0, out.output
    assert "index-accepted" in out.output and "ms per record" in out.output
    doc = runner.invoke(cli, ["bench", "indexer-cpu", "--sizes", "1,5", "--invocations", "2", "--json"])
    assert doc.exit_code == 0, doc.output
    parsed = json.loads(doc.output)
    assert parsed["target"] == "indexer-cpu" and parsed["params"]["sizes"] == [1, 5]
    bad = runner.invoke(cli, ["bench", "indexer-cpu", "--sizes", "7"])
    assert bad.exit_code == 2


def test_metrics_are_on_while_measuring_and_the_environment_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    # the local runtime turns Powertools metrics off process-wide; a Lambda has them on, and their
    # EMF flush is part of an invocation's CPU
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    seen = []
    real = indexer_cpu.sqs_index_handler

    def spy(**kw):  # type: ignore[no-untyped-def]
        handler = real(**kw)

        def call(event, context):  # type: ignore[no-untyped-def]
            seen.append(os.environ["POWERTOOLS_METRICS_DISABLED"])
            return handler(event, context)
        return call

    monkeypatch.setattr(indexer_cpu, "sqs_index_handler", spy)
    run_indexer_cpu(sizes=(1, 2), invocations=1, kinds=(KIND_ACCEPTED,))
    assert seen and set(seen) == {"false"}
    assert os.environ["POWERTOOLS_METRICS_DISABLED"] == "true"
