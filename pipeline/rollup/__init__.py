"""Hourly rollups: closed acceptance hours -> immutable rollup objects of a committed generation, and
reading them back (docs/pipeline.md):

* ``job``            — the rollup job (:class:`~lightmetrics_pipeline.rollup.job.RollupJob`): plan, generations,
  commit point
* ``plan``, ``preflight``, ``lease`` — what a run decides for each hour, what it can do before Spark starts,
  the one lease (``lease#rollup``)
* ``inputs``, ``decode``, ``aggregate`` — an hour's inputs listed in executors, frames decoded (``mapInPandas``),
  aggregated in Spark SQL
* ``sketch``, ``window_agg`` — the quantile sketch (DDSketch) and a window's aggregates (reference definition)
* ``codec``, ``chunks``, ``manifest``, ``parquet`` — the objects: zstd framing, the v1/v2 chunk and index entry,
  the v1/v2 manifest, format v3 (Parquet and its manifest)
* ``write_parquet``, ``write_chunks``, ``committed`` — the write stages of v3 and v2, a committed generation read back
* ``query``, ``query_names`` — ``lmctl query``: rollups read back, plotted; the metric names they hold
"""
