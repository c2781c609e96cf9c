"""``lmctl bench pipeline``: throughput of the Spark jobs on this machine (a benchmark, not a test).

1. **audit rows/s** — a generated inventory report of ``inventory_keys`` keys (Parquet, the real
   format; a consistent bucket plus a few planted defects that are confirmed live), read and
   audited end to end (classification, joins, confirmation, outputs, summary);
2. **rollup samples/s** — ``batches`` accepted batches of ``samples_per_batch`` samples written
   into the embedded runtime (moto), rolled up end to end (listing, acceptance records, blobs,
   decode, aggregation, chunk + index + manifest writes);
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
              progress: Callable[[str], Any] | None = None) -> dict[str, Any]:
    import os
    import uuid

    from pyspark.sql import functions as F

    from lightmetrics.config import Settings
    from lightmetrics.keys import KeyCodec, UtcHour
    from lightmetrics.local.environment import local_environment
    from lightmetrics.local.server import LocalRuntime

    from pipeline import inventory as inv
    from pipeline.audit import run_audit
    from pipeline.decode import FRAME_SAMPLE_SCHEMA, decode_batches, per_row_udf
    from pipeline.rollup import RollupJob
    from pipeline.s3io import S3Access
    from pipeline.session import get_spark
    from pipeline.synthetic import generate_inventory, load_batches

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
        spark = get_spark("lightmetrics-bench")
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
        out["rollup_chunks"] = rollup.hours[0].chunks

        # -- 3. decoder: vectorized vs per-row UDF on the same frames --------------------------------
        say("decoder: vectorized vs per-row UDF ...")
        blobs = [s3.get_object(Bucket=bucket, Key=k["Key"])["Body"].read()
                 for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="raw-blobs/v1/")
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


__all__ = ["run_bench"]
