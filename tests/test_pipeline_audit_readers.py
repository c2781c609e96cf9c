"""Inventory reports through Spark's own Parquet and CSV readers (issue 15): the same rows and
columns as the executors' pandas reader, keys that need URL encoding included."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from lightmetrics_pipeline.inventory import report as inv

KEYS = [
    "accepted/v1/agent=61/boot=62/00000000000000000000-00000000000000000009.json",
    "odd/a key with spaces.json",
    "odd/plus+sign+and%percent&amp=eq?q#hash.json",
    "odd/ünïcødé/日本語/ключ.json",
    "odd/comma,quote\"and'apostrophe/tab\tend.json",
    "odd/slash//double/~tilde/(paren)[br]{c}.json",
]


def _rows() -> list[dict]:  # type: ignore[type-arg]
    t = datetime(2025, 11, 24, 16, 1, 2, 345000, tzinfo=timezone.utc)
    rows = [{"bucket": "b", "key": k, "version_id": f"v{i}", "is_latest": True, "is_delete_marker": False,
             "size": 100 + i, "last_modified_date": t, "e_tag": "0" * 32, "storage_class": "STANDARD",
             "is_multipart_uploaded": False, "checksum_algorithm": None} for i, k in enumerate(KEYS)]
    rows[1]["is_latest"] = False
    rows.append({"bucket": "b", "key": KEYS[1], "version_id": None, "is_latest": True, "is_delete_marker": True,
                 "size": None, "last_modified_date": t, "e_tag": None, "storage_class": None,
                 "is_multipart_uploaded": None, "checksum_algorithm": None})
    return rows


def _collect(df) -> list[tuple]:  # type: ignore[no-untyped-def, type-arg]
    return sorted((tuple(r) for r in df.collect()), key=repr)


@pytest.mark.parametrize("file_format", ["Parquet", "CSV"])
def test_spark_readers_give_the_executor_readers_rows(spark, tmp_path, file_format):  # type: ignore[no-untyped-def]
    written = inv.write_report(_rows(), inv.Destination.parse(str(tmp_path)), source_bucket="b",
                               file_format=file_format, now_ms=1_764_000_060_000, rows_per_file=4)
    report = inv.open_report(str(tmp_path))
    assert len(report.files) == 2 and written.rows == len(KEYS) + 1
    by_spark = inv.inventory_dataframe(spark, report, spark_reader=True)
    by_executors = inv.inventory_dataframe(spark, report, spark_reader=False)  # the pandas reader
    assert by_spark.columns == by_executors.columns == list(inv.COLUMNS)
    assert [(f.name, f.dataType) for f in by_spark.schema] == [(f.name, f.dataType) for f in by_executors.schema]
    got = _collect(by_spark)
    assert got == _collect(by_executors)
    assert sorted({r[1] for r in got}) == sorted(KEYS)  # decoded: spaces, '+', '%', unicode, quotes
    if file_format == "CSV":  # the plan is Spark's CSV scan, no Python
        plan = by_spark._jdf.queryExecution().executedPlan().toString()
        assert "FileScan csv" in plan and "MapInPandas" not in plan


def test_a_data_file_whose_md5_differs_is_refused(spark, tmp_path):  # type: ignore[no-untyped-def]
    inv.write_report(_rows(), inv.Destination.parse(str(tmp_path)), source_bucket="b", file_format="CSV",
                     now_ms=1_764_000_060_000)
    report = inv.open_report(str(tmp_path))
    with open(report.files[0].ref, "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(inv.InventoryError, match="MD5"):
        inv.inventory_dataframe(spark, report)


def test_s3_is_read_by_spark_only_where_hadoop_has_an_s3_file_system(spark) -> None:  # type: ignore[no-untyped-def]
    from lightmetrics_pipeline.s3io import S3Access

    # No EMRFS or S3A jars here, and the local runtime (an endpoint override) is never read by Spark.
    assert inv.spark_reads_s3(spark, S3Access("b")) is False
    assert inv.spark_reads_s3(spark, S3Access("b", endpoint_url="http://127.0.0.1:1")) is False
