"""The audit's outputs: confirmed findings as JSON-lines part files per category (the consumers'
folders, docs/pipeline.md §3), each written by its own task, and the reader of a committed run.
"""

from __future__ import annotations

import json
import math
from typing import Any

from lightmetrics_pipeline.s3io import S3Access

#: Rows per output part file: a category's rows are split over ceil(rows / this) files, each
#: written by its own task.
ROWS_PER_PART = 50_000


def writer(access: S3Access, prefix_key: str, accumulator: Any) -> Any:
    """``mapInPandas``: each ``(category, part)`` of this partition as one JSON-lines file, its
    lines sorted (the same findings make the same files)."""

    def write(batches: Any) -> Any:
        import pandas as pd
        from pyspark import TaskContext

        from lightmetrics_pipeline import s3io

        by_file: dict[tuple[str, int], list[str]] = {}
        for pdf in batches:
            for category, part, doc in zip(pdf["category"], pdf["part"], pdf["doc"]):
                by_file.setdefault((category, int(part)), []).append(doc + "\n")
        task = TaskContext.get().partitionId()
        out = []
        with s3io.task_tally() as tally:
            for (category, part), lines in sorted(by_file.items()):
                key = f"{prefix_key}{category}/part-{part:05d}.jsonl"
                body = "".join(sorted(lines)).encode()
                outcome = s3io.put_if_absent(access, key, body, content_type="application/x-ndjson")
                out.append((category, key, len(lines), outcome, task))
        accumulator.add(tally.counts)
        if out:
            yield pd.DataFrame(out, columns=["category", "key", "rows", "outcome", "task"])

    return write


def output_parts(counts: dict[str, int], rows_per_part: int = ROWS_PER_PART) -> dict[str, int]:
    """Part files per category: enough that none holds more than ``rows_per_part`` rows.

    >>> output_parts({"orphan-blob-candidates": 360_000, "repair": 3, "integrity": 0})
    {'integrity': 0, 'orphan-blob-candidates': 8, 'repair': 1}
    """
    return {c: math.ceil(n / rows_per_part) for c, n in sorted(counts.items())}


def routes(spark: Any, partitions: int) -> list[int]:
    """For each partition ``j`` of ``repartition(partitions, col)``, a value of ``col`` Spark sends
    to ``j`` (its hash partitioning is ``pmod(hash(col), partitions)``, evaluated here by Spark
    itself): rows routed by these values land one file group per partition, none shared."""
    from pyspark.sql import functions as F

    found = spark.range(0, 64 * partitions).select(F.expr(f"pmod(hash(id), {partitions})").alias("p"), "id") \
        .groupBy("p").agg(F.min("id").alias("id")).collect()
    by_partition = {int(r["p"]): int(r["id"]) for r in found}
    if len(by_partition) != partitions:  # 64 draws per partition: practically impossible
        raise RuntimeError(f"no route to {partitions - len(by_partition)} of {partitions} partitions")
    return [by_partition[j] for j in range(partitions)]



def write_findings(spark: Any, findings: Any, counts: dict[str, int], access: S3Access, out_prefix: str,
                   accumulator: Any, rows_per_part: int) -> tuple[dict[str, list[str]], dict[str, int], int]:
    """Write ``findings`` (category, doc) as part files: (files per category, rows written per
    category, write tasks). Each (category, part) is one file and one task: a line's part is its
    rank among its category's lines, sorted, modulo the category's parts — the same findings make
    the same files, and parts differ by at most one row, so none exceeds ``rows_per_part`` (a hash
    of the line did not bound them); Spark's own hash routes each part to its partition."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    files: dict[str, list[str]] = {}
    rows_written: dict[str, int] = {}
    parts = output_parts(counts, rows_per_part)
    total = sum(parts.values())
    if not total:
        return files, rows_written, 0
    offset, first = 0, {}
    for category, n in parts.items():
        first[category] = offset
        offset += n
    part = F.pmod(F.row_number().over(Window.partitionBy("category").orderBy("doc")) - 1, F.col("n"))
    to_write = findings.join(F.broadcast(spark.createDataFrame(
        [(c, n, first[c]) for c, n in parts.items() if n], "category string, n long, first long")), "category") \
        .withColumn("part", part)
    # bigint, as in routes: Spark hashes an int and a bigint of one value differently
    route = F.element_at(F.array(*[F.lit(r).cast("long") for r in routes(spark, total)]),
                         (F.col("first") + F.col("part") + 1).cast("int"))
    written = to_write.repartition(total, route.alias("route")).select("category", "part", "doc").mapInPandas(
        writer(access, out_prefix, accumulator), "category string, key string, rows long, outcome string, task int"
    ).collect()
    for r in written:
        files.setdefault(r["category"], []).append(r["key"])
        rows_written[r["category"]] = rows_written.get(r["category"], 0) + r["rows"]
    for keys in files.values():
        keys.sort()
    return files, rows_written, len({r["task"] for r in written})


def read_findings(access: S3Access, run_id: str, category: str) -> list[dict[str, Any]]:
    """Every row of one category of a committed run (the walk and the GC read these)."""
    from lightmetrics_pipeline import s3io

    st = s3io.store(access)
    prefix = access.codec.audit_run(run_id)
    if st.head(f"{prefix}summary.json") is None:
        raise FileNotFoundError(f"audit run {run_id} has no summary (not committed)")
    rows = []
    for key, _ in s3io.list_all(access, f"{prefix}{category}/")[0]:
        body = st.get(key) or b""
        rows.extend(json.loads(line) for line in body.splitlines() if line.strip())
    return rows



__all__ = ["ROWS_PER_PART", "output_parts", "read_findings", "routes", "write_findings", "writer"]
