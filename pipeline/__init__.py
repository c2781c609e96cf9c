"""The Lightmetrics data pipeline on Spark (PySpark 4.x): inventory audit and hourly rollups.

Modules:

* :mod:`lightmetrics_pipeline.session`   — the one SparkSession factory (``local[2]`` here, EMR Serverless in AWS)
* :mod:`lightmetrics_pipeline.s3io`      — boto3 inside executors (no Hadoop S3A jars), request tallies
* :mod:`lightmetrics_pipeline.inventory` — S3 Inventory reports: read (manifest.json + Parquet/CSV.gz), write
  (``lmctl inventory snapshot``), generate (tests, benchmark)
* :mod:`lightmetrics_pipeline.audit`     — the inventory audit (DataFrame joins, live confirmation, audit/v1/)
* :mod:`lightmetrics_pipeline.sketch`    — the quantile sketch (DDSketch): binning and byte layout
* :mod:`lightmetrics_pipeline.window_agg` — a window's aggregates and their reference definition (exact sum, extremes, last)
* :mod:`lightmetrics_pipeline.chunks`    — the v1/v2 chunk and index entry formats, series keys, chunk ids
* :mod:`lightmetrics_pipeline.rollup_manifest` — the v1/v2 rollup manifest and its chunk lists
* :mod:`lightmetrics_pipeline.rollup_codec` — what every rollup object shares: zstd framing, schema check, format error
* :mod:`lightmetrics_pipeline.rollup_parquet` — rollup format v3: the Parquet object and the v3 manifest
* :mod:`lightmetrics_pipeline.decode`    — vectorized frame decoding (``mapInPandas``)
* :mod:`lightmetrics_pipeline.aggregate` — the rollup's aggregation in Spark SQL
* :mod:`lightmetrics_pipeline.rollup`    — hourly rollups: plan, generations, commit point, lease
* :mod:`lightmetrics_pipeline.rollup_inputs` — listing an hour's inputs in executors (agents, then agent ranges)
* :mod:`lightmetrics_pipeline.rollup_write_parquet` — the write stage of format v3 (Parquet objects)
* :mod:`lightmetrics_pipeline.rollup_write_chunks`  — the write stage of format v2 (recompute of v1/v2, baseline)
* :mod:`lightmetrics_pipeline.query`     — reading rollups back (``lmctl query``), plotting
* :mod:`lightmetrics_pipeline.jobs`      — job entry points (the CLI and EMR Serverless call these)

The normative description is ``docs/pipeline.md``.
"""
