"""The Lightmetrics data pipeline on Spark (PySpark 4.x): inventory audit and hourly rollups.

Modules:

* :mod:`lightmetrics_pipeline.session`   — the one SparkSession factory (``local[2]`` here, EMR Serverless in AWS)
* :mod:`lightmetrics_pipeline.s3io`      — boto3 inside executors (no Hadoop S3A jars), request tallies
* :mod:`lightmetrics_pipeline.inventory` — S3 Inventory reports: read (manifest.json + Parquet/CSV.gz), write
  (``lmctl inventory snapshot``), generate (tests, benchmark)
* :mod:`lightmetrics_pipeline.audit`     — the inventory audit (DataFrame joins, live confirmation, audit/v1/)
* :mod:`lightmetrics_pipeline.chunks`    — the rollup chunk, index entry and rollup manifest formats
* :mod:`lightmetrics_pipeline.decode`    — vectorized frame decoding (``mapInPandas``)
* :mod:`lightmetrics_pipeline.rollup`    — hourly rollups: generations, chunks, commit point, lease
* :mod:`lightmetrics_pipeline.query`     — reading rollups back (``lmctl query``), plotting
* :mod:`lightmetrics_pipeline.jobs`      — job entry points (the CLI and EMR Serverless call these)

The normative description is ``docs/pipeline.md``.
"""
