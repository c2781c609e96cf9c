"""The metric names committed rollups hold: ``lmctl query``'s answer to a metric none of the
committed hours asked for holds (a misspelling), with the closest known names (difflib).

A query reads only its metric's part of each hour, so it learns that the metric is absent for
free; the known names cost one more read per hour looked at: the 1h window's objects (v3), or every
chunk list (v2; a v1 manifest lists its chunks inline). Only the newest :data:`NAME_HOURS`
committed hours of the query are looked at — enough to suggest, bounded on a large deployment.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from lightmetrics_pipeline.rollup import manifest as RM
from lightmetrics_pipeline.rollup import parquet as P
from lightmetrics_pipeline.rollup.write_chunks import committed_chunks
from lightmetrics_pipeline.s3io import S3Access, store

#: committed hours (the newest of the query's) whose metric names are read for suggestions
NAME_HOURS = 3
#: how many close names are suggested
SUGGESTIONS = 5


def committed_metric_names(access: S3Access, docs: Iterable[dict[str, Any]]) -> set[str]:
    """Every metric the committed manifests ``docs`` hold."""
    import io

    import pyarrow.parquet as pq

    names: set[str] = set()
    st = store(access)
    for doc in docs:
        if RM.is_parquet_manifest(doc):
            for o in P.objects_of(doc, "1h"):
                data = st.get(o["key"])
                if data is not None:
                    names.update(pq.read_table(io.BytesIO(data), columns=["metric"])["metric"].to_pylist())
            continue
        names.update(c["metric"] for c in committed_chunks(access, doc))
    return names


def closest(metric: str, known: Iterable[str], n: int = SUGGESTIONS) -> list[str]:
    """The known names closest to ``metric`` (difflib's ratio, best first), none if nothing is close.

    >>> closest("cpu.usag", ["mem.rss", "cpu.usage", "disk/io"])
    ['cpu.usage']
    """
    return difflib.get_close_matches(metric, sorted(set(known)), n=n, cutoff=0.6)


__all__ = ["NAME_HOURS", "SUGGESTIONS", "closest", "committed_metric_names"]
