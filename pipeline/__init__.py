"""The Lightmetrics data pipeline on Spark (PySpark 4.x): inventory audit and hourly rollups.

One sub-package per job, and what every job shares at the top:

* :mod:`lightmetrics_pipeline.jobs`      — job entry points (the CLI and EMR Serverless, ``emr_main.py``, call these)
* :mod:`lightmetrics_pipeline.session`   — the one SparkSession factory (``local[2]`` here, EMR Serverless in AWS)
* :mod:`lightmetrics_pipeline.s3io`      — boto3 inside executors (no Hadoop S3A jars), request tallies
* :mod:`lightmetrics_pipeline.synthetic` — generated data for the scale tests and the benchmark
* :mod:`lightmetrics_pipeline.inventory` — S3 Inventory reports: read (manifest.json + Parquet/CSV.gz), write
  (``lmctl inventory snapshot``)
* :mod:`lightmetrics_pipeline.audit`     — the inventory audit (DataFrame joins, live confirmation, audit/v1/)
* :mod:`lightmetrics_pipeline.rollup`    — hourly rollups (plan, generations, commit point, lease; the formats
  v1-v3, the sketch, decoding and aggregation) and reading them back (``lmctl query``)

The normative description is ``docs/pipeline.md``.
"""
