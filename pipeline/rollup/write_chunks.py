"""The rollup's write stage for format v2 (per-series chunks, index entries, chunk lists), and its readers.

The job writes format v3 (:mod:`lightmetrics_pipeline.rollup.write_parquet`); this stage stays for
``--recompute`` of a generation committed as v1 or v2 (it must re-issue the same writes, all 412)
and as the baseline the benchmark and the tests compare v3 against. One chunk and one index entry
per (hour, series, window), written in the aggregation's tasks (``mapInArrow``), then the hour's
chunk lists, one task each (docs/pipeline.md §6, v2).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from lightmetrics.protocol.keys import UtcHour
from lightmetrics_pipeline.rollup import chunks as C
from lightmetrics_pipeline.rollup import codec as RC
from lightmetrics_pipeline.rollup import manifest as RM
from lightmetrics_pipeline.s3io import S3Access

WRITTEN_SCHEMA = ("hour_s long, metric string, series string, window string, samples long, doc string, "
                  "chunk_outcome string, index_outcome string")
LIST_SCHEMA = "hour_s long, part int, parts int, key string, sha256 string, bytes long, chunks long, outcome string"


def _write_chunks(access: S3Access, generations: dict[int, int], accumulator: Any, workers: int = 16) -> Any:
    """``mapInArrow`` over :func:`lightmetrics_pipeline.rollup.aggregate.chunk_rows`: encode each chunk, then
    conditionally create it and its index entry. Out: one small row per chunk (its manifest
    entry as JSON and the outcomes), never the bytes."""

    def run(batches: Any) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        import pyarrow as pa

        from lightmetrics_pipeline import s3io
        from lightmetrics_pipeline.rollup.aggregate import encode_chunk_row

        codec = access.codec

        def write(row: dict[str, Any]) -> tuple[Any, ...]:
            hour_s = int(row["hour_s"])
            hour = UtcHour(hour_s)
            header, _aggs, data = encode_chunk_row(row, generations[hour_s])
            metric, cid = header["metric"], header["chunk_id"]
            key = codec.rollup_chunk(header["window"], hour, metric, cid)
            sha = hashlib.sha256(data).hexdigest()
            chunk_outcome = s3io.put_if_absent(access, key, data, content_type="application/zstd")
            doc = {"chunk_id": cid, "window": header["window"], "metric": metric, "labels": header["labels"],
                   "series": header["series"], "sample_ts_min_ns": header["sample_ts_min_ns"],
                   "sample_ts_max_ns": header["sample_ts_max_ns"], "samples": header["samples"],
                   "rows": header["rows"], "sha256": sha, "bytes": len(data)}
            entry = {"chunk_key": key, "chunk_id": cid, "chunk_sha256": sha, "chunk_bytes": len(data),
                     "hour": str(hour), "window": header["window"], "metric": metric, "labels": header["labels"],
                     "series": header["series"], "generation": generations[hour_s],
                     "sample_ts_min_ns": header["sample_ts_min_ns"], "sample_ts_max_ns": header["sample_ts_max_ns"],
                     "samples": header["samples"], "rows": header["rows"]}
            index_outcome = s3io.put_if_absent(access, codec.rollup_index(hour, cid), C.encode_index_entry(entry),
                                               content_type="application/zstd")
            return (hour_s, metric, header["series"], header["window"], header["samples"], json.dumps(doc),
                    chunk_outcome, index_outcome)

        schema = pa.schema([("hour_s", pa.int64()), ("metric", pa.string()), ("series", pa.string()),
                            ("window", pa.string()), ("samples", pa.int64()), ("doc", pa.string()),
                            ("chunk_outcome", pa.string()), ("index_outcome", pa.string())])
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lm-rollup-write") as pool:
            for batch in batches:  # Arrow record batches: the nested rows arrive as plain dicts and lists
                with s3io.task_tally() as tally:
                    out = list(pool.map(write, batch.to_pylist()))
                accumulator.add(tally.counts)
                yield pa.RecordBatch.from_arrays([pa.array([o[i] for o in out], type=f.type)
                                                  for i, f in enumerate(schema)], schema=schema)

    return run


def _write_lists(access: S3Access, generations: dict[int, int], accumulator: Any) -> Any:
    """``applyInPandas`` per (hour, chunk-list part): the list's bytes, created under its sha256."""

    def build(pdf: Any) -> Any:
        import pandas as pd

        from lightmetrics_pipeline import s3io

        hour_s, part, parts = int(pdf["hour_s"].iloc[0]), int(pdf["part"].iloc[0]), int(pdf["parts"].iloc[0])
        hour = UtcHour(hour_s)
        data = RM.chunk_list_bytes(hour=hour, generation=generations[hour_s], part=part, parts=parts,
                                  chunks=[json.loads(d) for d in pdf["doc"]])
        ref = RM.chunk_list_ref(access.codec, hour, part, data, len(pdf))
        with s3io.task_tally() as tally:
            outcome = s3io.put_if_absent(access, ref["key"], data, content_type="application/zstd")
        accumulator.add(tally.counts)
        return pd.DataFrame([{"hour_s": hour_s, "part": part, "parts": parts, "key": ref["key"], "sha256": ref["sha256"],
                              "bytes": ref["bytes"], "chunks": ref["chunks"], "outcome": outcome}])

    return build



def chunk_writes(samples: Any, access: S3Access, generations: dict[int, int], accumulator: Any, tasks: Any,
                 write_tasks: int, count_tasks: Any) -> Any:
    """The chunks of the decoded ``samples`` (error rows left out), aggregated in Spark SQL and
    written in ``write_tasks`` tasks: the aggregation's repartition by (hour, series) has that
    explicit count, and nothing shuffles after it, so the writes run in exactly that many tasks."""
    from pyspark.sql import functions as F

    from lightmetrics_pipeline.rollup.aggregate import chunk_rows

    rows = chunk_rows(samples.where(F.col("error").isNull()).drop("error"), write_tasks)
    return rows.mapInArrow(count_tasks(tasks, "write", _write_chunks(access, generations, accumulator)),
                           WRITTEN_SCHEMA)



def write_chunks(samples: Any, access: S3Access, generations: dict[int, int], accumulator: Any, tasks: Any,
                 write_tasks: int, count_tasks: Any) -> dict[int, tuple[list[dict[str, Any]], dict[str, int], Counter[str]]]:
    """Write the v2 chunks, index entries and chunk lists of every hour in ``generations``; per
    hour: ``(chunk list refs, totals, write outcomes)``. Collected: a row per hour and per list."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    written = chunk_writes(samples, access, generations, accumulator, tasks, write_tasks, count_tasks) \
        .persist(StorageLevel.MEMORY_AND_DISK)  # the chunk writes run once; rows are manifest entries, no bytes
    try:
        per_hour = written.groupBy("hour_s").agg(
            F.count("*").alias("chunks"),
            F.count(F.when(F.col("window") == "1h", 1)).alias("series"),
            F.sum(F.when(F.col("window") == "1h", F.col("samples")).otherwise(0)).alias("samples"),
            *[F.count(F.when(F.col(c) == o, 1)).alias(f"{c} {o}") for c in ("chunk_outcome", "index_outcome")
              for o in ("created", "exists")]).collect()
        totals = {int(r["hour_s"]): r.asDict() for r in per_hour}
        parts = {h: RM.chunk_list_parts(int(t["chunks"])) for h, t in totals.items()}
        if not parts:
            return {}
        parts_of = F.create_map(*[F.lit(x) for h, n in parts.items() for x in (h, n)])[F.col("hour_s")]
        part = RM.chunk_list_part_col(F.col("metric"), parts_of)
        lists = written.select("hour_s", "doc", parts_of.cast("int").alias("parts"), part.alias("part")) \
            .groupBy("hour_s", "part").applyInPandas(_write_lists(access, generations, accumulator), LIST_SCHEMA) \
            .collect()  # one row per chunk list
    finally:
        written.unpersist()
    out: dict[int, tuple[list[dict[str, Any]], dict[str, int], Counter[str]]] = {}
    for h, t in totals.items():
        writes: Counter[str] = Counter()
        for name in ("chunk_outcome", "index_outcome"):
            for o in ("created", "exists"):
                writes[o] += int(t[f"{name} {o}"])
        out[h] = ([], {"chunks": int(t["chunks"]), "series": int(t["series"]), "samples": int(t["samples"]),
                       "parts": parts[h]}, writes)
    for r in lists:
        out[int(r["hour_s"])][2][r["outcome"]] += 1
        out[int(r["hour_s"])][0].append({"part": int(r["part"]), "key": r["key"], "sha256": r["sha256"],
                                         "bytes": int(r["bytes"]), "chunks": int(r["chunks"])})
    return out


def list_refs(codec: Any, doc: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """``(parts, chunk list refs)`` of a manifest; for a v1 manifest (chunks inline), the lists a
    v2 manifest of the same chunks references (built here: its chunks are in memory already)."""
    if doc.get("schema") == RM.MANIFEST_SCHEMA_V1:
        hour = UtcHour.parse(doc["hour"])
        built = RM.chunk_lists(hour=hour, generation=int(doc["generation"]), chunks=doc["chunks"])
        refs = [RM.chunk_list_ref(codec, hour, part, data, n) for part, data, n in built]
        return RM.chunk_list_parts(len(doc["chunks"])), refs
    return int(doc["chunk_lists"]["parts"]), list(doc["chunk_lists"]["lists"])



def committed_chunks(access: S3Access, doc: dict[str, Any], metric: str | None = None) -> list[dict[str, Any]]:
    """The chunk entries a committed manifest names — of ``metric`` only if given (then one chunk
    list is read: the metric's part) — each list checked against the sha256 the manifest records."""
    from lightmetrics_pipeline import s3io

    if doc.get("schema") == RM.MANIFEST_SCHEMA_V1:
        return [c for c in doc["chunks"] if metric is None or c["metric"] == metric]
    parts = int(doc["chunk_lists"]["parts"])
    wanted = None if metric is None else RM.chunk_list_part(metric, parts)
    out: list[dict[str, Any]] = []
    st = s3io.store(access)
    for ref in doc["chunk_lists"]["lists"]:
        if wanted is not None and int(ref["part"]) != wanted:
            continue
        data = st.get(ref["key"])
        if data is None or hashlib.sha256(data).hexdigest() != ref["sha256"]:
            raise RC.ChunkFormatError(f"chunk list {ref['key']} of {doc.get('_key', 'a manifest')} is missing or "
                                     "does not match its sha256")
        out.extend(c for c in RM.parse_chunk_list(data)["chunks"] if metric is None or c["metric"] == metric)
    return out


__all__ = ["LIST_SCHEMA", "WRITTEN_SCHEMA", "chunk_writes", "committed_chunks", "list_refs", "write_chunks"]
