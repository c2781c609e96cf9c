"""Rollup format v3: Parquet objects holding many series, and the v3 manifest that commits them.

For each committed (hour, generation) and each window the job writes ``P`` Parquet objects; an
object holds the rows (series × window start) of every series whose metric falls in its part
(:func:`lightmetrics_pipeline.rollup.manifest.chunk_list_part`: the first 32 bits of sha256(metric) mod ``P``), so a
query of one metric reads one object per window. ``P = ceil(rows / ROWS_PER_PART)`` — a function
of the content, so a rerun writes the same objects. Each object is named by the sha256 of its
bytes and created by conditional create; its bytes are a pure function of its rows (sorted by
metric, series, window start; zstd at a fixed level; no wall clock in the file), so a rerun is a
412. The normative description is ``docs/pipeline.md`` §6.

Columns are plain Parquet types (strings, a string map, int64, double, binary, a UTC
microsecond timestamp), so Athena, Spark or pyarrow read them without our code; ``sketch`` keeps
the exact DDSketch bins (``chunks.serialize_sketch``) for merging, and ``p50``/``p90``/``p99``
are its quantiles for SQL users.

Example:
    >>> part_count(0), part_count(250_000), part_count(250_001)
    (1, 1, 2)
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Sequence
from typing import Any

from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import canonical_json
from lightmetrics_pipeline.rollup import chunks as C
from lightmetrics_pipeline.rollup import manifest as RM
from lightmetrics_pipeline.rollup import sketch as SK
from lightmetrics_pipeline.rollup import window_agg as W

MANIFEST_SCHEMA_V3 = RM.MANIFEST_SCHEMA_V3
MANIFEST_SCHEMA_V4 = RM.MANIFEST_SCHEMA_V4
#: Rows per Parquet object (and its one row group): ~150 bytes a row with a small sketch, so an
#: object stays in the tens of MB; a generation's window of N rows has ceil(N / this) objects.
ROWS_PER_PART = 250_000
#: The highest generation the job builds for an hour (docs/pipeline.md §1): the Athena table projects
#: exactly the generations 1..this (infra/components/rollup_catalog.py), so every committed
#: generation is one Athena sees; an hour at it is refused a new generation (status
#: ``generation-limit``, exit 1) rather than committing one that would drop out of ``rollups_current``.
MAX_GENERATION = 999
#: Rows per row group of an object the job writes now (the manifest records it: ``rows_per_row_group``).
#: ``lmctl query`` reads an object's footer, then only the row groups whose ``metric`` statistics
#: span the metric asked (rows are sorted by metric). An S3 GET costs ~20-50 ms before its first
#: byte and then moves ~50-100 MB/s, so a row group of 2^14 rows (~0.6 MB compressed at ~35 bytes
#: a row) costs about one request's latency to fetch: smaller groups would save little time but
#: grow the footer (~3 KB of column metadata per group) that every read fetches — at this size a
#: full object's footer (16 groups, ~50 KB) fits the one 64 KiB tail read
#: (:data:`lightmetrics_pipeline.rollup.ranged_read.TAIL_BYTES`). docs/performance.md gives the figures.
ROWS_PER_ROW_GROUP = 16_384
PARQUET_COMPRESSION = "zstd"
PARQUET_COMPRESSION_LEVEL = 3
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))

#: (name, Arrow type as text) of every column, in file order: docs/pipeline.md §6, and the Glue
#: table's columns (infra/components/rollup_catalog.py) are derived from this list.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("metric", "string"), ("labels", "map<string,string>"), ("series", "string"),
    ("window_start", "timestamp"), ("window_start_ns", "bigint"), ("count", "bigint"), ("nan_count", "bigint"),
    ("sum", "double"), ("min", "double"), ("max", "double"), ("last", "double"), ("last_ts_ns", "bigint"),
    ("sketch", "binary"), ("p50", "double"), ("p90", "double"), ("p99", "double"),
    ("acceptance_hour", "string"), ("rollup_generation", "int"), ("inputs_sha256", "string"),
)


def arrow_schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "map<string,string>": pa.map_(pa.string(), pa.string()),
             "timestamp": pa.timestamp("us", tz="UTC"), "bigint": pa.int64(), "double": pa.float64(),
             "binary": pa.binary(), "int": pa.int32()}
    return pa.schema([pa.field(name, types[t]) for name, t in COLUMNS])


def part_count(rows: int) -> int:
    """How many objects a window of ``rows`` rows of one generation has (at least 1)."""
    return max(1, -(-rows // ROWS_PER_PART))


def quantiles(agg: W.WindowAgg, mapping: Any) -> list[float | None]:
    """:data:`QUANTILES` of ``agg``'s sketch, computed from its bins exactly as the ``ddsketch``
    library's ``get_quantile_value`` does (same ranks, same keys, the library's own ``mapping.value``)
    without building a sketch object per row. None when the sketch holds no value."""
    zero, positive, negative = SK.sketch_bins(agg.sketch)
    neg_count = sum(c for _, c in negative)
    total = neg_count + zero + sum(c for _, c in positive)
    out: list[float | None] = []
    for _, q in QUANTILES:
        if total == 0:
            out.append(None)
            continue
        rank = q * (total - 1)
        if rank < neg_count:
            out.append(-mapping.value(_key_at_rank(negative, neg_count - rank - 1, lower=False)))
        elif rank < zero + neg_count:
            out.append(0.0)
        else:
            out.append(mapping.value(_key_at_rank(positive, rank - zero - neg_count, lower=True)))
    return out


def _key_at_rank(bins: list[tuple[int, float]], rank: float, lower: bool) -> int:
    running = 0.0
    for key, count in bins:  # non-empty bins in increasing key order: empty ones never end the walk
        running += count
        if (lower and running > rank) or (not lower and running >= rank + 1):
            return key
    return bins[-1][0]


def part_rows(chunk_row: dict[str, Any], generation: int, inputs_sha256: str) -> list[dict[str, Any]]:
    """The Parquet rows of one :func:`lightmetrics_pipeline.rollup.aggregate.chunk_rows` row (one series, one window)."""
    from lightmetrics_pipeline.rollup.aggregate import window_agg

    series = str(chunk_row["series"])
    metric, labels = C.parse_series(series)
    hour = str(UtcHour(int(chunk_row["hour_s"])))
    mapping = SK.quantile_mapping()
    out = []
    for r in chunk_row["rows"]:
        agg = window_agg(r)
        p50, p90, p99 = quantiles(agg, mapping)
        out.append({"metric": metric, "labels": list(labels), "series": series,
                    "window_start": agg.window_start_ns // 1000, "window_start_ns": agg.window_start_ns,
                    "count": agg.count, "nan_count": agg.nan_count, "sum": agg.sum, "min": agg.min, "max": agg.max,
                    "last": agg.last, "last_ts_ns": agg.last_ts_ns, "sketch": agg.sketch, "p50": p50, "p90": p90,
                    "p99": p99, "acceptance_hour": hour, "rollup_generation": generation,
                    "inputs_sha256": inputs_sha256})
    return out


def part_bytes(rows: Iterable[dict[str, Any]], rows_per_row_group: int | None = ROWS_PER_ROW_GROUP) -> bytes:
    """One Parquet object of ``rows`` (:func:`part_rows`), deterministic: rows sorted by (metric,
    series, window start), row groups of ``rows_per_row_group`` rows (None: one row group, the
    layout of generations whose manifest records no ``rows_per_row_group``), zstd at a fixed level,
    statistics on, no wall clock (pyarrow writes none; ``created_by`` names the library version,
    fixed for a deployed job)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ordered = sorted(rows, key=lambda r: (r["metric"], r["series"], r["window_start_ns"]))
    schema = arrow_schema()
    table = pa.Table.from_arrays([pa.array([r[f.name] for r in ordered], type=f.type) for f in schema],
                                 schema=schema)  # column by column: much faster than from_pylist
    sink = io.BytesIO()
    pq.write_table(table, sink, compression=PARQUET_COMPRESSION, compression_level=PARQUET_COMPRESSION_LEVEL,
                   row_group_size=max(1, rows_per_row_group or len(ordered)), use_dictionary=True, write_statistics=True,
                   version="2.6", data_page_version="1.0", store_schema=True)
    return sink.getvalue()


def read_part(data: bytes, metric: str | None = None) -> Any:
    """A v3 object's rows as an Arrow table (only ``metric``'s if given), with plain pyarrow."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(data))
    return table if metric is None else table.filter(pc.equal(table["metric"], metric))


def window_aggs(table: Any) -> list[tuple[str, dict[str, str], W.WindowAgg]]:
    """``(series, labels, aggregate)`` of each row of a v3 table."""
    out = []
    for r in table.to_pylist():
        out.append((r["series"], dict(r["labels"]), W.WindowAgg(
            int(r["window_start_ns"]), int(r["count"]), int(r["nan_count"]), float(r["sum"]), float(r["min"]),
            float(r["max"]), float(r["last"]), int(r["last_ts_ns"]), bytes(r["sketch"]))))
    return out


def row_group_byte_range(row_group: Any) -> tuple[int, int]:
    """``[start, end)`` of a row group's column chunks (dictionary page first when there is one):
    the bytes a reader of that row group decodes, page headers included."""
    starts, ends = [], []
    for j in range(row_group.num_columns):
        c = row_group.column(j)
        start = c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset
        starts.append(start)
        ends.append(start + c.total_compressed_size)
    return min(starts), max(ends)


def footer_start(size: int, tail: bytes) -> int:
    """Where the footer of a Parquet object of ``size`` bytes starts, from its last 8 bytes (``tail``
    ends with them): the footer's length (little-endian) and the magic ``PAR1``."""
    return size - 8 - int.from_bytes(tail[-8:-4], "little")


def range_checks(data: bytes) -> dict[str, Any]:
    """What a reader of only some of an object's bytes checks them against (docs/protocol.md §4.6):
    ``footer_sha256``, of the bytes from the footer's start to the end (footer, its length, the
    magic), and ``row_group_sha256``, of each row group's :func:`row_group_byte_range`, in order."""
    import pyarrow.parquet as pq

    md = pq.read_metadata(io.BytesIO(data))
    ranges = [row_group_byte_range(md.row_group(i)) for i in range(md.num_row_groups)]
    return {"footer_sha256": hashlib.sha256(data[footer_start(len(data), data):]).hexdigest(),
            "row_group_sha256": [hashlib.sha256(data[s:e]).hexdigest() for s, e in ranges]}


def records_range_checks(doc: dict[str, Any]) -> bool:
    """Whether a v3 manifest's objects carry :func:`range_checks` (a generation committed before
    they were recorded does not, and its recompute leaves them out again: the same bytes)."""
    return all("row_group_sha256" in o for o in doc["parquet"]["objects"])


def part_ref(codec: Any, hour: UtcHour, generation: int, window: str, part: int, data: bytes, rows: int,
             series: int, *, checks: bool = True) -> dict[str, Any]:
    """The v3 manifest's entry for one object: window, part, key (named by its sha256), sha256,
    bytes, rows, series, and (``checks``) its :func:`range_checks`."""
    sha = hashlib.sha256(data).hexdigest()
    return {"window": window, "part": part, "key": codec.rollup_part(window, hour, generation, part, sha),
            "sha256": sha, "bytes": len(data), "rows": rows, "series": series,
            **(range_checks(data) if checks else {})}


def manifest_v3_bytes(*, hour: UtcHour, generation: int, supersedes: int | None, input_count: int,
                      input_sha256: str, skipped: Sequence[dict[str, str]], skipped_count: int,
                      parts: dict[str, int], objects: Sequence[dict[str, Any]], totals: dict[str, int],
                      schema: str = RM.MANIFEST_SCHEMA_V4, rows_per_row_group: int | None = ROWS_PER_ROW_GROUP) -> bytes:
    """The hour's commit point (``lightmetrics.rollup_manifest.v4``; ``schema`` v3 for the recompute
    of a generation committed in it: the hour is then named ``hour``): pure function of the inputs
    (no wall clock, no owner); names every Parquet object (a part without rows has none) and the
    part count of each window, which a reader needs to find a metric's part, and the objects'
    ``rows_per_row_group`` (left out when None: one row group each, as before it was recorded)."""
    if schema not in RM.PARQUET_MANIFEST_SCHEMAS:
        raise ValueError(f"not a Parquet-object manifest schema: {schema}")
    doc = {
        "schema": schema,
        ("hour" if schema == RM.MANIFEST_SCHEMA_V3 else "acceptance_hour"): str(hour),
        "generation": generation,
        "supersedes": supersedes,
        "inputs": {"count": input_count, "sha256": input_sha256},
        "skipped": {"count": skipped_count,
                    "first": sorted(skipped, key=lambda s: s["manifest_id"])[:RM.SKIPPED_SAMPLE]},
        "parquet": {"rows_per_part": ROWS_PER_PART,
                    **({} if rows_per_row_group is None else {"rows_per_row_group": rows_per_row_group}),
                    "parts": {w: int(parts.get(w, 1)) for w in W.WINDOW_NS},
                    "objects": sorted(objects, key=lambda o: (list(W.WINDOW_NS).index(o["window"]), o["part"]))},
        "totals": {"objects": len(objects), "rows": int(totals["rows"]), "series": int(totals["series"]),
                   "samples": int(totals["samples"])},
    }
    # v4 is one newline-terminated JSON line (pyarrow's JSON reader reads a last line without its
    # newline as nulls); v3 had no newline, and its recompute keeps its bytes.
    return canonical_json(doc) + (b"" if schema == RM.MANIFEST_SCHEMA_V3 else b"\n")


def rows_per_row_group(doc: dict[str, Any]) -> int | None:
    """The row-group size a v3 manifest's objects were written with; None: one row group each (a
    generation committed before the manifest recorded it)."""
    n = doc["parquet"].get("rows_per_row_group")
    return None if n is None else int(n)


def objects_of(doc: dict[str, Any], window: str | None = None, metric: str | None = None) -> list[dict[str, Any]]:
    """The objects a v3 manifest names — of ``window`` and the part holding ``metric`` if given."""
    out = []
    for o in doc["parquet"]["objects"]:
        if window is not None and o["window"] != window:
            continue
        if metric is not None and o["part"] != RM.chunk_list_part(metric, int(doc["parquet"]["parts"][o["window"]])):
            continue
        out.append(o)
    return out


__all__ = ["COLUMNS", "MANIFEST_SCHEMA_V3", "MANIFEST_SCHEMA_V4", "MAX_GENERATION", "ROWS_PER_PART", "ROWS_PER_ROW_GROUP",
           "arrow_schema", "footer_start", "manifest_v3_bytes", "objects_of", "part_bytes", "part_count", "part_ref",
           "part_rows", "quantiles", "range_checks", "read_part", "records_range_checks", "row_group_byte_range",
           "rows_per_row_group", "window_aggs"]
