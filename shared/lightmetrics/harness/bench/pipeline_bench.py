"""``lmctl bench pipeline``: throughput of the Spark jobs on this machine (a benchmark, not a test).

1. **audit rows/s** — a generated inventory report of ``inventory_keys`` keys (Parquet, the real
   format; a consistent bucket plus a few planted defects that are confirmed live), read and
   audited end to end (classification, joins, confirmation, outputs, summary);
2. **rollup samples/s** — ``batches`` accepted batches of ``samples_per_batch`` samples written
   into the embedded runtime (moto), rolled up end to end (listing, acceptance records, blobs,
   decode, aggregation, chunk + index + manifest writes);
2b. **rollup shapes** — an hour of 10,000 series × 5 samples and one of 40 series × 12,500 (both
   with ``spark.driver.maxResultSize=1m``): end to end in format v3 (Parquet objects), then the
   same hour's inputs end to end in format v2 (a chunk and an index entry per series and window:
   the rollup before v3, the baseline), then the aggregation alone on the same decoded samples —
   Spark SQL (``lightmetrics_pipeline.rollup.aggregate``) against the per-series Python the rollup used before
   (``applyInPandas`` per series, ``chunks.aggregate_window``; kept here only as the baseline),
   both encoding the chunks, neither writing;
3. **decoder** — the same frames, already in a DataFrame (S3 out of the picture): the vectorized
   ``mapInPandas`` decoder against a per-row Python UDF returning an array of structs (once with
   the same parser, once with the core's object-building ``decode_frame``), each followed by the
   same global aggregate, after a warm-up run of each.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_NS = 1_000_000_000


def run_bench(*, inventory_keys: int = 1_000_000, batches: int = 1000, samples_per_batch: int = 500,
              rollup_shapes: tuple[tuple[int, int], ...] = ((10_000, 5), (40, 12_500)),
              progress: Callable[[str], Any] | None = None) -> dict[str, Any]:
    import os
    import uuid

    from pyspark.sql import functions as F

    from lightmetrics.deployment.settings import Settings
    from lightmetrics.local.environment import local_environment
    from lightmetrics.local.server import LocalRuntime
    from lightmetrics.protocol.keys import KeyCodec, KeyKind, UtcHour
    from lightmetrics_pipeline.audit.job import run_audit
    from lightmetrics_pipeline.inventory import report as inv
    from lightmetrics_pipeline.rollup.decode import FRAME_SAMPLE_SCHEMA, decode_batches, per_row_udf
    from lightmetrics_pipeline.rollup.job import RollupJob
    from lightmetrics_pipeline.s3io import S3Access
    from lightmetrics_pipeline.session import get_spark
    from lightmetrics_pipeline.synthetic import generate_inventory, load_batches

    say = progress or (lambda _m: None)
    out: dict[str, Any] = {"cores": os.cpu_count(), "spark_master": "local[2]"}
    runtime = LocalRuntime(port=0).start()
    saved = dict(os.environ)
    os.environ.update(local_environment(runtime.endpoint_url, {}))
    try:
        bucket = f"lm-bench-{uuid.uuid4().hex[:8]}"
        s3 = runtime.boto3_client("s3")
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        settings = Settings.from_env({}, bucket=bucket)
        access = S3Access.from_settings(settings, endpoint_url=runtime.endpoint_url, component="bench")
        t = time.monotonic()
        spark = get_spark("lightmetrics-bench", conf={"spark.driver.maxResultSize": "1m"})
        out["spark_start_s"] = round(time.monotonic() - t, 1)

        # -- 1. audit ------------------------------------------------------------------------------
        say(f"generating an inventory of {inventory_keys:,} keys ...")
        now_s = int(time.time())
        with tempfile.TemporaryDirectory(prefix="lm-bench-inv-") as d:
            t = time.monotonic()
            gen = generate_inventory(Path(d), bucket=bucket, identities=max(1, inventory_keys // 5), now_s=now_s,
                                     orphan_derived=10)
            out["inventory_generate_s"] = round(time.monotonic() - t, 1)
            for key in gen.planted["derived-without-source"]:
                s3.put_object(Bucket=bucket, Key=key, Body=b"{}", IfNoneMatch="*")
            say("auditing ...")
            t = time.monotonic()
            report = inv.open_report(d, access)
            audit = run_audit(spark, inv.inventory_dataframe(spark, report, access), access, run_id="bench",
                              now_s=now_s, retry_horizon_s=settings.retry_horizon_s)
            secs = time.monotonic() - t
        out["audit_rows"] = gen.rows
        out["audit_seconds"] = round(secs, 1)
        out["audit_rows_per_s"] = round(gen.rows / secs)
        out["audit_phase_seconds"] = {k: round(v, 1) for k, v in audit.phases.items()}
        out["audit_confirmed"] = audit.confirmed
        out["audit_write_tasks"] = audit.write_tasks
        out["audit_cold_session"] = True  # the session's first job: JIT and Python workers start cold

        # -- 2. rollup -----------------------------------------------------------------------------
        say(f"writing {batches:,} batches x {samples_per_batch} samples ...")
        codec = KeyCodec(settings.prefix)
        accepted_at = (now_s - 7200) * _NS
        hour = UtcHour.of_unix_ns(accepted_at)
        t = time.monotonic()
        samples = load_batches(s3, bucket, codec, batches=batches, samples_per_batch=samples_per_batch,
                               accepted_at_ns=accepted_at, base_ns=accepted_at - 3600 * _NS)
        out["rollup_load_s"] = round(time.monotonic() - t, 1)
        say("rolling up ...")
        t = time.monotonic()
        rollup = RollupJob(spark, access, table=None).run([hour], first_open=hour.next())
        secs = time.monotonic() - t
        out["rollup_samples"] = samples
        out["rollup_seconds"] = round(secs, 1)
        out["rollup_samples_per_s"] = round(samples / secs)
        out["rollup_objects"] = rollup.hours[0].objects

        # -- 2b. rollup shapes: high and low cardinality ------------------------------------------------
        for i, (series, per_series) in enumerate(rollup_shapes):
            say(f"rollup of {series:,} series x {per_series:,} samples ...")
            shape_bucket = f"{bucket}-s{i}"  # its own bucket: the decoder section reads every blob of this one
            s3.create_bucket(Bucket=shape_bucket)
            shape = out[f"rollup_{series}x{per_series}"] = rollup_shape(
                spark, s3, shape_bucket, access.with_bucket(shape_bucket), UtcHour.of_unix_ns(accepted_at) + (-1 - i),
                series, per_series)
            say(f"  {series:,} x {per_series:,}: {shape}")

        # -- 3. decoder: vectorized vs per-row UDF on the same frames --------------------------------
        say("decoder: vectorized vs per-row UDF ...")
        blobs = [s3.get_object(Bucket=bucket, Key=k["Key"])["Body"].read()
                 for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=codec.root(KeyKind.RAW_BLOB))
                 for k in page.get("Contents", [])]
        frames = spark.createDataFrame([(str(i), b) for i, b in enumerate(blobs)], "manifest_id string, frame binary") \
            .repartition(4).cache()
        frames.count()

        # The same global aggregate after each decoder (touching every column), so what differs is
        # the decoding and the Python <-> JVM transfer, not a shuffle.
        def summary(df: Any) -> Any:
            return df.agg(F.count("*").alias("n"), F.sum("value").alias("s"), F.max("ts_ns").alias("t"),
                          F.max(F.length("series")).alias("l"), F.sum("ord").alias("o")).collect()

        def vectorized() -> Any:
            return summary(frames.mapInPandas(decode_batches, FRAME_SAMPLE_SCHEMA))

        def per_row() -> Any:
            return summary(frames.select(F.explode(per_row_udf()("frame")).alias("x")).select("x.*"))

        def per_row_full() -> Any:
            return summary(frames.select(F.explode(per_row_udf(full_decoder=True)("frame")).alias("x")).select("x.*"))

        timings = {}
        for name, fn in (("vectorized", vectorized), ("per_row_udf", per_row), ("per_row_udf_full", per_row_full)):
            fn()  # warm-up (worker start, codegen)
            t = time.monotonic()
            result = fn()
            timings[name] = time.monotonic() - t
            assert sum(r["n"] for r in result) == samples
        frames.unpersist()
        out["decoder_samples"] = samples
        out["decoder_vectorized_samples_per_s"] = round(samples / timings["vectorized"])
        out["decoder_per_row_udf_samples_per_s"] = round(samples / timings["per_row_udf"])
        out["decoder_speedup"] = round(timings["per_row_udf"] / timings["vectorized"], 2)
        out["decoder_per_row_udf_full_decoder_samples_per_s"] = round(samples / timings["per_row_udf_full"])
        out["decoder_speedup_vs_full_decoder_udf"] = round(timings["per_row_udf_full"] / timings["vectorized"], 2)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        runtime.stop()
    return out


# ------------------------------------------------------------------------------ rollup shapes


def rollup_shape(spark: Any, s3: Any, bucket: str, access: Any, hour: Any, series: int, per_series: int,
                 per_batch: int = 500, compare_v2: bool = True) -> dict[str, Any]:
    """One hour of ``series`` × ``per_series`` samples: the rollup end to end (v3, then v2 on the
    same inputs), then its aggregation alone (SQL vs the previous per-series Python) on the same
    decoded samples."""
    from functools import partial

    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from lightmetrics_pipeline.rollup.job import RollupJob, decode_samples, tasks_for
    from lightmetrics_pipeline.s3io import counter_accumulator
    from lightmetrics_pipeline.synthetic import load_batches, series_samples

    accepted_at = (hour.start_unix_s + 1800) * _NS
    base = hour.start_unix_s * _NS - 3600 * _NS
    total = series * per_series
    batches = -(-total // per_batch)
    load_batches(s3, bucket, access.codec, batches=batches, samples_per_batch=per_batch, accepted_at_ns=accepted_at,
                 base_ns=base, agent_prefix=f"shape-{series}x{per_series}",
                 samples_of=partial(series_samples, series=series, per_series=per_series, per_batch=per_batch,
                                    base_ns=base))
    job = RollupJob(spark, access, table=None)
    t = time.monotonic()
    report = job.run([hour], first_open=hour.next())
    secs = time.monotonic() - t
    h = report.hours[0]
    out: dict[str, Any] = {"samples": total, "batches": batches, "seconds": round(secs, 1),
                           "samples_per_s": round(total / secs), "objects": h.objects, "rows": h.rows,
                           "status": h.status, "put_requests": report.requests.total("PutObject"),
                           "tasks": report.tasks, "driver_max_result_size": spark.conf.get("spark.driver.maxResultSize")}
    if compare_v2:
        # The same inputs in format v2 (the rollup before v3), as the next generation: planned and
        # executed the same way, the plan told to build although the hour is up to date.
        v2 = RollupJob(spark, access, table=None, rollup_format=2)
        t = time.monotonic()
        plan = v2.plan([hour], first_open=hour.next())
        plan.hours[0].status, plan.hours[0].generation, plan.hours[0].supersedes, plan.hours[0].format = \
            "build", 2, 1, 2
        old = v2.execute(plan).hours[0]
        v2_secs = time.monotonic() - t
        out["v2_seconds"] = round(v2_secs, 1)
        out["v2_samples_per_s"] = round(total / v2_secs)
        out["v2_status"] = old.status
        out["v2_chunks"] = old.chunks
        out["v2_put_requests"] = sum(old.writes.values())
        out["speedup_v3_over_v2"] = round(v2_secs / secs, 1)
    # The aggregation alone, on the same decoded samples (persisted first), encoding but not writing.
    plan = job.plan([hour], first_open=hour.next())
    acc = counter_accumulator(spark)
    samples = decode_samples(plan.entries, access, {hour.start_unix_s: 1}, acc, counter_accumulator(spark), batches) \
        .where(F.col("error").isNull()).drop("error").persist(StorageLevel.MEMORY_AND_DISK)
    samples.count()
    timings = {}
    for name, df in (("sql", _sql_chunks(samples, tasks_for(3 * series, 2_000))),
                     ("per_series_python", _per_series_python_chunks(samples))):
        t = time.monotonic()
        n = df.agg(F.count("*"), F.sum("bytes")).collect()[0][0]
        timings[name] = time.monotonic() - t
        assert n == 3 * h.series, (name, n, h.series)
    samples.unpersist()
    plan.entries.unpersist()
    out["aggregate_sql_s"] = round(timings["sql"], 1)
    out["aggregate_per_series_python_s"] = round(timings["per_series_python"], 1)
    out["aggregate_speedup"] = round(timings["per_series_python"] / timings["sql"], 1)
    return out


def _sql_chunks(samples: Any, partitions: int) -> Any:
    """Chunks (hour, size) from ``lightmetrics_pipeline.rollup.aggregate``: the rollup's aggregation and encoding."""
    def encode(batches: Any) -> Any:
        import pyarrow as pa

        from lightmetrics_pipeline.rollup.aggregate import encode_chunk_row

        for batch in batches:
            sizes = [len(encode_chunk_row(r, 1)[2]) for r in batch.to_pylist()]
            yield pa.RecordBatch.from_pydict({"bytes": pa.array(sizes, pa.int64())})

    from lightmetrics_pipeline.rollup.aggregate import chunk_rows

    return chunk_rows(samples, partitions).mapInArrow(encode, "bytes long")


def _per_series_python_chunks(samples: Any) -> Any:
    """The baseline: the rollup's aggregation before issue 15 — ``applyInPandas`` per (hour, series),
    a Python loop per window, DDSketch fed one value at a time (``chunks.aggregate_window``)."""
    def build(pdf: Any) -> Any:
        import numpy as np
        import pandas as pd

        from lightmetrics.protocol.keys import UtcHour
        from lightmetrics_pipeline.rollup import chunks as C
        from lightmetrics_pipeline.rollup import sketch as SK
        from lightmetrics_pipeline.rollup import window_agg as W

        hour = UtcHour(int(pdf["hour_s"].iloc[0]))
        series = str(pdf["series"].iloc[0])
        ts = pdf["ts_ns"].to_numpy(dtype="int64")
        values = pdf["value"].to_numpy(dtype="float64")
        mids, ords = pdf["manifest_id"].to_numpy(dtype=object), pdf["ord"].to_numpy(dtype="int64")
        contributors = sorted(set(mids.tolist()))
        sizes, fine = [], {}
        for window, w in W.WINDOW_NS.items():
            starts = (ts // w) * w
            order = np.argsort(starts, kind="stable")
            uniq, first = np.unique(starts[order], return_index=True)
            rows = []
            for ws, lo, hi in zip(uniq.tolist(), first.tolist(), list(first[1:]) + [len(order)]):
                idx = order[lo:hi]
                if window == "1m":
                    sk = fine[ws] = SK.sketch_of(values[idx].tolist())
                else:
                    sk = SK.merge_sketches(s for k, s in fine.items() if ws <= k < ws + w)
                rows.append(W.aggregate_window(values[idx].tolist(), ts[idx].tolist(), mids[idx].tolist(),
                                               ords[idx].tolist(), ws, sketch=sk))
            cid = C.chunk_id(hour, window, series, 1, contributors)
            header = C.chunk_header(hour=hour, window=window, series=series, generation=1, chunk_id_=cid,
                                    manifest_ids=contributors, ts_min=int(ts.min()), ts_max=int(ts.max()),
                                    samples=len(ts), rows=len(rows))
            sizes.append(len(C.encode_chunk(header, rows)))
        return pd.DataFrame({"bytes": sizes})

    return samples.groupBy("hour_s", "series").applyInPandas(build, "bytes long")


__all__ = ["rollup_shape", "run_bench"]
