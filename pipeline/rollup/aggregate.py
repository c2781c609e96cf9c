"""The rollup's aggregation in Spark SQL, and the chunk encoding from its rows.

Decoded samples (``lightmetrics_pipeline.rollup.decode.SAMPLE_SCHEMA``: each value already carries its DDSketch bin,
``sk_store``/``sk_key``) are repartitioned by (hour, series) into an explicit number of partitions,
exploded into their three windows (``window_start = ts - pmod(ts, w)``, integer arithmetic) and
aggregated in the JVM, with no shuffle after the repartition (every grouping below contains
(hour, series)):

1. per (hour, series, window, window start, bin): ``count``, NaN count, ``min``/``max`` of the
   non-NaN values, ``last`` by ``max_by(value, struct(ts_ns, manifest_id, ord))`` — the tie-break
   of :func:`lightmetrics_pipeline.rollup.window_agg.aggregate_window` — and the bin's sample count;
2. per (hour, series, window, window start): the same combined, the bins collected (the sketch is
   a grouped count of keys: bins only add);
3. per (hour, series, window): the rows of one chunk, sorted by window start, joined with the
   series' contributors and sample-time range.

``sum``: the format defines it as correctly rounded (``math.fsum``, order independent), which
Spark's double ``sum`` is not. Each value arrives split into exact integer parts
(:func:`lightmetrics_pipeline.rollup.window_agg.exact_parts`: ``mant × 2^shift`` per exponent bucket ``exp_b``), summed
exactly as DECIMAL(38, 0) per bucket in SQL; the encoding step (:func:`encode_chunk_row`) adds
the few bucket sums of a window as Python integers and rounds once
(:func:`lightmetrics_pipeline.rollup.window_agg.sum_from_parts`). The sign of a zero ``min``/``max`` (Spark
compares -0.0 and 0.0 equal) comes from the zero store's key. The per-series Python of
:func:`lightmetrics_pipeline.rollup.window_agg.aggregate_window` stays as the reference the tests compare
this against, bit for bit.

Example:
    >>> rows = chunk_rows(samples, partitions=8)                      # doctest: +SKIP
    >>> header, aggs, data = encode_chunk_row(rows.first().asDict(True), 1)   # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Any

from lightmetrics.protocol.keys import UtcHour
from lightmetrics_pipeline.rollup import chunks as C
from lightmetrics_pipeline.rollup import sketch as SK
from lightmetrics_pipeline.rollup import window_agg as W

#: ``chunk_rows`` output: one row per (hour, series, window).
CHUNK_ROW_COLUMNS = ("hour_s", "series", "window", "rows", "ts_min", "ts_max", "manifest_ids")


def chunk_rows(samples: Any, partitions: int) -> Any:
    """One row per (hour_s, series, window): ``rows`` (array of window aggregates, by window
    start), ``ts_min``, ``ts_max``, ``manifest_ids`` (sorted contributors of the series in the
    hour). ``samples`` are decoded sample rows without errors."""
    from pyspark.sql import functions as F

    # A NaN leaves a pandas UDF as null (pandas' missing value): a sample row always has a value, so null is NaN.
    by_series = samples.repartition(partitions, "hour_s", "series") \
        .withColumn("value", F.coalesce(F.col("value"), F.lit(math.nan)))
    windows = F.explode(F.array(*[
        F.struct(F.lit(name).alias("window"), (F.col("ts_ns") - F.pmod(F.col("ts_ns"), F.lit(w))).alias("ws"))
        for name, w in W.WINDOW_NS.items()]))
    x = by_series.select("hour_s", "series", "manifest_id", "ts_ns", "value", "ord", "sk_store", "sk_key", "exp_b",
                         "mant", "shift", windows.alias("w")).select("*", "w.window", "w.ws").drop("w")
    nan = F.isnan("value")
    number = F.when(~nan, F.col("value"))
    order = F.struct("ts_ns", "manifest_id", "ord")  # chunks._last_key
    exact = F.expr("cast(mant as decimal(38,0)) * cast(shiftleft(1L, shift) as decimal(38,0))")  # < 2^85: exact
    per_bin = x.groupBy("hour_s", "series", "window", "ws", "sk_store", "sk_key", "exp_b").agg(
        F.count(F.lit(1)).alias("n"),
        F.count(F.when(nan, 1)).alias("nan_n"),
        F.min(number).alias("lo"),
        F.max(number).alias("hi"),
        F.max_by("value", order).alias("last"),
        F.max(order).alias("last_key"),
        F.sum(exact).cast("decimal(38,0)").alias("part"),
        F.count(F.when(F.col("value") == F.lit(math.inf), 1)).alias("pinf"),
        F.count(F.when(F.col("value") == F.lit(-math.inf), 1)).alias("ninf"),
    )
    binned = F.col("sk_store").isin(1, -1)
    zero_store = F.col("sk_store") == 0
    per_window = per_bin.groupBy("hour_s", "series", "window", "ws").agg(
        F.sum("n").alias("count"),
        F.sum("nan_n").alias("nan_count"),
        F.min("lo").alias("min"),
        F.max("hi").alias("max"),
        F.max_by("last", "last_key").alias("last"),
        F.max(F.col("last_key.ts_ns")).alias("last_ts_ns"),
        F.sum(F.when(zero_store, F.col("n")).otherwise(F.lit(0))).alias("zero"),
        F.collect_list(F.when(binned, F.struct("sk_store", "sk_key", "n"))).alias("bins"),
        F.collect_list(F.when(F.col("exp_b").isNotNull(), F.struct("exp_b", "part"))).alias("parts"),
        F.sum("pinf").alias("pinf"),
        F.sum("ninf").alias("ninf"),
        F.bool_or(zero_store & (F.col("sk_key") == -1)).alias("neg_zero"),  # sketch_keys: the zero's sign
        F.bool_or(zero_store & (F.col("sk_key") == 1)).alias("pos_zero"),
    )
    per_chunk = per_window.groupBy("hour_s", "series", "window").agg(
        F.sort_array(F.collect_list(F.struct("ws", "count", "nan_count", "min", "max", "last", "last_ts_ns", "zero",
                                             "bins", "parts", "pinf", "ninf", "neg_zero", "pos_zero"))).alias("rows"))
    series = by_series.groupBy("hour_s", "series").agg(
        F.min("ts_ns").alias("ts_min"), F.max("ts_ns").alias("ts_max"),
        F.array_sort(F.collect_set("manifest_id")).alias("manifest_ids"))
    return per_chunk.join(series, ["hour_s", "series"]).select(*CHUNK_ROW_COLUMNS)


def _float(v: Any) -> float:
    return math.nan if v is None else float(v)


def window_agg(r: dict[str, Any]) -> W.WindowAgg:
    """One window row of :func:`chunk_rows` as the chunk stores it."""
    lo, hi = _float(r["min"]), _float(r["max"])
    if lo == 0:  # Spark compares -0.0 and 0.0 equal; the format says which (chunks.signed_extreme)
        lo = -0.0 if r["neg_zero"] else 0.0
    if hi == 0:
        hi = 0.0 if r["pos_zero"] else -0.0
    bins = r["bins"]
    return W.WindowAgg(
        window_start_ns=int(r["ws"]),
        count=int(r["count"]),
        nan_count=int(r["nan_count"]),
        sum=W.sum_from_parts([(p["exp_b"], int(p["part"])) for p in r["parts"]], r["pinf"] > 0, r["ninf"] > 0),
        min=lo,
        max=hi,
        last=float(r["last"]),
        last_ts_ns=int(r["last_ts_ns"]),
        sketch=SK.sketch_from_bins(float(r["zero"]), [(b["sk_key"], b["n"]) for b in bins if b["sk_store"] == 1],
                                  [(b["sk_key"], b["n"]) for b in bins if b["sk_store"] == -1]),
    )


def encode_chunk_row(row: dict[str, Any], generation: int) -> tuple[dict[str, Any], list[W.WindowAgg], bytes]:
    """``(header, rows, chunk bytes)`` of one :func:`chunk_rows` row (``row['rows']`` as dicts)."""
    hour = UtcHour(int(row["hour_s"]))
    window, series = str(row["window"]), str(row["series"])
    contributors = [str(m) for m in row["manifest_ids"]]
    aggs = [window_agg(r) for r in row["rows"]]
    cid = C.chunk_id(hour, window, series, generation, contributors)
    header = C.chunk_header(hour=hour, window=window, series=series, generation=generation, chunk_id_=cid,
                            manifest_ids=contributors, ts_min=int(row["ts_min"]), ts_max=int(row["ts_max"]),
                            samples=sum(a.count for a in aggs), rows=len(aggs))
    return header, aggs, C.encode_chunk(header, aggs)


__all__ = ["CHUNK_ROW_COLUMNS", "chunk_rows", "encode_chunk_row", "window_agg"]
