"""The rollup's write stage for format v3: aggregated rows -> Parquet objects (``lightmetrics_pipeline.rollup.parquet``).

The aggregation (:func:`lightmetrics_pipeline.rollup.aggregate.chunk_rows`, one row per hour, series and window) is
persisted and counted per (hour, window) — three rows per hour reach the driver — which fixes
each window's part count ``P`` (a function of the content). Every row gets its part (sha256 of
its metric mod ``P``, in SQL), the rows are repartitioned by (hour, window, part) into one
partition per possible object and sorted within it, and each task writes its objects one after
the other (at most one object's rows in memory) by conditional create. The driver collects one
row per object.

A recompute (``--recompute`` of a committed generation) compares before it writes: it is given the
committed objects' keys by (window, part) (:func:`committed_refs`), and an object whose key (named
by its sha256) is the committed one is not written at all (outcome ``"committed"``: it exists),
while one that differs — or has no committed counterpart — is not written either (outcome
``"differs"``); the driver then refuses the generation (``NondeterministicRollup``) with nothing
new in the bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightmetrics.protocol.keys import UtcHour
from lightmetrics_pipeline.rollup import manifest as RM
from lightmetrics_pipeline.rollup import parquet as P
from lightmetrics_pipeline.s3io import S3Access

WRITTEN_SCHEMA = ("hour_s long, window string, part int, key string, sha256 string, bytes long, rows long, "
                  "series long, outcome string, footer_sha256 string, row_group_sha256 string")


@dataclass
class HourObjects:
    """What the write stage made of one hour: the manifest's objects and totals."""

    parts: dict[str, int]
    objects: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    series: int = 0
    samples: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def totals(self) -> dict[str, int]:
        return {"rows": self.rows, "series": self.series, "samples": self.samples}


#: Per recomputed hour (``hour_s``), the committed generation's object keys by (window, part).
CommittedRefs = dict[int, dict[tuple[str, int], str]]


def committed_refs(manifest: dict[str, Any]) -> dict[tuple[str, int], str]:
    """The object keys a committed v3 manifest names, by (window, part)."""
    return {(str(o["window"]), int(o["part"])): str(o["key"]) for o in manifest["parquet"]["objects"]}


def _write_parts(access: S3Access, generations: dict[int, int], digests: dict[int, str], accumulator: Any,
                 committed: CommittedRefs, row_groups: dict[int, int | None], checks: dict[int, bool]) -> Any:
    """``mapInArrow`` over rows sorted by (hour, window, part): each run of one key is an object.
    An hour in ``committed`` (a recompute) writes nothing: each object is compared by key."""

    def run(batches: Any) -> Any:
        import pyarrow as pa

        from lightmetrics_pipeline import s3io

        schema = pa.schema([("hour_s", pa.int64()), ("window", pa.string()), ("part", pa.int32()),
                            ("key", pa.string()), ("sha256", pa.string()), ("bytes", pa.int64()),
                            ("rows", pa.int64()), ("series", pa.int64()), ("outcome", pa.string()),
                            ("footer_sha256", pa.string()), ("row_group_sha256", pa.string())])
        current: tuple[int, str, int] | None = None
        rows: list[dict[str, Any]] = []
        series = 0

        def flush() -> Any:
            assert current is not None
            hour_s, window, part = current
            data = P.part_bytes(rows, row_groups[hour_s])
            ref = P.part_ref(access.codec, UtcHour(hour_s), generations[hour_s], window, part, data, len(rows), series,
                             checks=checks[hour_s])
            if hour_s in committed:  # a recompute: compare, never write
                outcome = "committed" if committed[hour_s].get((window, part)) == ref["key"] else "differs"
            else:
                with s3io.task_tally() as tally:
                    outcome = s3io.put_if_absent(access, ref["key"], data,
                                                 content_type="application/vnd.apache.parquet")
                accumulator.add(tally.counts)
            group_shas = ",".join(ref["row_group_sha256"]) if "row_group_sha256" in ref else None
            values = [hour_s, window, part, ref["key"], ref["sha256"], ref["bytes"], ref["rows"], ref["series"], outcome,
                      ref.get("footer_sha256"), group_shas]
            return pa.RecordBatch.from_arrays([pa.array([v], type=f.type) for v, f in zip(values, schema)],
                                              schema=schema)

        for batch in batches:
            for r in batch.to_pylist():
                key = (int(r["hour_s"]), str(r["window"]), int(r["part"]))
                if key != current:
                    if current is not None:
                        yield flush()
                    current, rows, series = key, [], 0
                hour_s = key[0]
                rows.extend(P.part_rows(r, generations[hour_s], digests[hour_s]))
                series += 1
        if current is not None:
            yield flush()

    return run


def write_parquet(samples: Any, access: S3Access, generations: dict[int, int], digests: dict[int, str],
                  accumulator: Any, tasks: Any, aggregate_tasks: int, count_tasks: Any,
                  committed: CommittedRefs | None = None,
                  row_groups: dict[int, int | None] | None = None,
                  range_checks: dict[int, bool] | None = None) -> dict[int, HourObjects]:
    """Aggregate the decoded ``samples`` (no error rows) and write the v3 objects of every hour in
    ``generations``; per hour, what its manifest names. The hours in ``committed`` are recomputes:
    their objects are compared with the committed ones by key, and none is written. ``row_groups``
    gives an hour's row-group size where it is not the current one (a recompute keeps its
    generation's: :func:`lightmetrics_pipeline.rollup.parquet.rows_per_row_group`), and ``range_checks``
    whether its objects' entries carry their row groups' sha256 where they do not (a recompute of a
    generation committed without them: :func:`lightmetrics_pipeline.rollup.parquet.records_range_checks`)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from lightmetrics_pipeline.rollup.aggregate import chunk_rows

    rows = chunk_rows(samples, aggregate_tasks).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        one_h = F.col("window") == "1h"
        counts = rows.groupBy("hour_s", "window").agg(
            F.sum(F.size("rows")).alias("rows"), F.count("*").alias("series"),
            F.sum(F.when(one_h, F.expr("aggregate(rows, 0L, (n, r) -> n + r.count)")).otherwise(0)).alias("samples"),
        ).collect()  # three rows per hour
        hours: dict[int, HourObjects] = {}
        layout = {hs: (row_groups or {}).get(hs, P.ROWS_PER_ROW_GROUP) for hs in generations}
        checks = {hs: (range_checks or {}).get(hs, True) for hs in generations}
        for c in counts:
            h = hours.setdefault(int(c["hour_s"]), HourObjects({}))
            h.parts[str(c["window"])] = P.part_count(int(c["rows"]))
            h.rows += int(c["rows"])
            if c["window"] == "1h":
                h.series, h.samples = int(c["series"]), int(c["samples"])
        if not hours:
            return {}
        pairs = [(f"{hs}|{w}", n) for hs, h in hours.items() for w, n in h.parts.items()]
        parts_of = F.create_map(*[F.lit(x) for pair in pairs for x in pair])[
            F.concat_ws("|", F.col("hour_s").cast("string"), F.col("window"))]
        part = RM.chunk_list_part_col(F.get_json_object(F.col("series"), "$[0]"), parts_of)
        objects = sum(n for _, n in pairs)
        written = rows.select("hour_s", "window", part.alias("part"), "series", "rows") \
            .repartition(max(1, min(2_000, objects)), "hour_s", "window", "part") \
            .sortWithinPartitions("hour_s", "window", "part", "series") \
            .mapInArrow(count_tasks(tasks, "write", _write_parts(access, generations, digests, accumulator,
                                                                       committed or {}, layout, checks)),
                        WRITTEN_SCHEMA).collect()  # one row per object
    finally:
        rows.unpersist()
    for w in written:
        h = hours[int(w["hour_s"])]
        h.objects.append({"window": w["window"], "part": int(w["part"]), "key": w["key"], "sha256": w["sha256"],
                          "bytes": int(w["bytes"]), "rows": int(w["rows"]), "series": int(w["series"]),
                          **({} if w["footer_sha256"] is None else {
                              "footer_sha256": w["footer_sha256"],
                              "row_group_sha256": w["row_group_sha256"].split(",")})})
        h.outcomes[w["outcome"]] = h.outcomes.get(w["outcome"], 0) + 1
    return hours


__all__ = ["CommittedRefs", "HourObjects", "WRITTEN_SCHEMA", "committed_refs", "write_parquet"]
