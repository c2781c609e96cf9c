"""Rollup objects: the chunk (``.lmrollup.zst``), its index entry (``.lmindex.zst``) and the
hour's rollup manifest (``manifests/v1/.../generation=N.json``), plus the quantile sketch.

Pure functions, no Spark, no I/O: the rollup job, ``lmctl query`` and the tests share them. The
normative description (byte layout, field meanings, reader rules) is ``docs/pipeline.md``.

Sketch: DDSketch (the ``ddsketch`` library, Datadog's maintained implementation) with a
logarithmic mapping at 1 % relative accuracy and unbounded dense stores. It is *mergeable
exactly* (merging adds bins, so a 1 h sketch merged from twelve 5 m sketches has the same bins as
one built from the samples) and *deterministic* (no randomness), so a rerun writes byte-identical
chunks. KLL (Apache DataSketches) was considered: its compaction is randomized, so two runs
over the same samples would serialize differently.

Example:
    >>> agg = aggregate_window([1.0, 2.0, 3.0], [10, 20, 30], ["m", "m", "m"], [0, 1, 2], 0)
    >>> (agg.count, agg.sum, agg.last)
    (3, 6.0, 3.0)
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import zstandard

from lightmetrics.protocol.errors import ManifestError, UnsupportedVersionError
from lightmetrics.protocol.keys import ROLLUP_WINDOWS, UtcHour
from lightmetrics.protocol.manifests import canonical_json, check_schema

CHUNK_SCHEMA = "lightmetrics.rollup_chunk.v1"
INDEX_SCHEMA = "lightmetrics.rollup_index.v1"
MANIFEST_SCHEMA = "lightmetrics.rollup_manifest.v2"
MANIFEST_SCHEMA_V1 = "lightmetrics.rollup_manifest.v1"  # chunks inline; still read, no longer written
#: Parquet objects (lightmetrics_pipeline.rollup_parquet): what the job writes; v2 is still read and recomputed.
MANIFEST_SCHEMA_V3 = "lightmetrics.rollup_manifest.v3"
CHUNK_LIST_SCHEMA = "lightmetrics.rollup_chunk_list.v1"
#: A generation's chunk entries are split into ceil(chunks / CHUNKS_PER_LIST) chunk lists, by metric.
CHUNKS_PER_LIST = 20_000
#: The manifest names at most this many skipped inputs (the first by manifest-id) and counts them all.
SKIPPED_SAMPLE = 100
CHUNK_MAGIC = b"LMRC"
CHUNK_VERSION = 1
SKETCH_VERSION = 1
SKETCH_RELATIVE_ACCURACY = 0.01
ZSTD_LEVEL = 3

WINDOW_NS: dict[str, int] = {"1m": 60 * 10**9, "5m": 300 * 10**9, "1h": 3600 * 10**9}
assert tuple(WINDOW_NS) == ROLLUP_WINDOWS

_HEADER = struct.Struct(">4sBI")  # magic, version, header length
_U32 = struct.Struct(">I")
_ROW = struct.Struct(">qQQddddqI")  # window_start, count, nan_count, sum, min, max, last, last_ts, sketch_len
_SKETCH_HEAD = struct.Struct(">Bdd")  # version, relative accuracy, zero count
_BIN = struct.Struct(">id")  # bin key, count


class ChunkFormatError(ValueError):
    """Bytes that are not a valid rollup object."""


# ---------------------------------------------------------------------------------- sketches


def new_sketch() -> Any:
    from ddsketch import DDSketch

    return DDSketch(SKETCH_RELATIVE_ACCURACY)


def sketch_of(values: Iterable[float]) -> Any:
    """A DDSketch of the finite values (NaN and ±inf are not quantile-able and are left out)."""
    sk = new_sketch()
    add = sk.add
    for v in values:
        if math.isfinite(v):
            add(v)
    return sk


def sketch_keys(values: Any) -> tuple[Any, Any]:
    """``(store, key)`` arrays for float64 ``values``, exactly as :func:`sketch_of` bins them:
    store 1 (positive bins), -1 (negative bins), 0 (the zero count) or -2 (not binned: NaN, ±inf),
    and the bin key — in the zero store: -1 for -0.0, 1 for 0.0, 0 for a tiny non-zero value (the
    aggregation reads the sign of a zero ``min``/``max`` from it); 0 for NaN and ±inf.

    The logarithm is taken with numpy; where the scaled logarithm lies within 1e-6 of an integer
    (numpy's and the C library's ``log`` may differ in the last bit there, which would move the
    ceiling), the key is recomputed with the library's own scalar mapping, so every key is the
    library's.

    >>> [k.tolist() for k in sketch_keys(__import__("numpy").array([1.0, -2.0, 0.0, float("nan")]))]
    [[1, -1, 0, -2], [0, 35, 1, 0]]
    """
    import numpy as np

    mapping = new_sketch()._mapping
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    limit = mapping.min_possible
    store = np.where(~finite, -2, np.where(v > limit, 1, np.where(v < -limit, -1, 0))).astype(np.int8)
    binned = (store == 1) | (store == -1)
    mag = np.where(binned, np.abs(np.where(finite, v, 1.0)), 1.0)
    with np.errstate(all="ignore"):
        scaled = np.log(mag) / math.log(2.0) * mapping._multiplier
    keys = np.ceil(scaled)
    near = binned & (np.abs(scaled - np.rint(scaled)) < 1e-6)
    for i in np.flatnonzero(near):
        keys[i] = mapping.key(float(mag[i]))
    zero_sign = np.where(v == 0, np.where(np.signbit(v), -1, 1), 0)
    return store, np.where(binned, keys, np.where(store == 0, zero_sign, 0)).astype(np.int32)


#: Exact sums: a finite non-zero value is ``mant × 2^(32·exp_b + shift)`` with ``|mant| < 2^53`` and
#: ``0 <= shift < 32``, so ``mant × 2^shift`` (< 2^85) sums exactly as DECIMAL(38, 0) per ``exp_b``.
SUM_BUCKET_BITS = 32


def exact_parts(values: Any) -> tuple[Any, Any, Any]:
    """``(exp_b, mant, shift)`` arrays for float64 ``values``, with ``exp_b = -2^31`` where a value
    is zero or not finite (it adds nothing to an exact sum: zeros add 0, infinities are counted).

    >>> [a.tolist() for a in exact_parts(__import__("numpy").array([1.0, -0.75, 0.0]))]
    [[-2, -2, -2147483648], [4503599627370496, -6755399441055744, 0], [12, 11, 0]]
    """
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    used = np.isfinite(v) & (v != 0)
    m, e = np.frexp(np.where(used, v, 1.0))
    mant = (m * 2.0 ** 53).astype(np.int64)  # exact: |m| in [0.5, 1)
    q = e.astype(np.int64) - 53  # v = mant × 2^q
    exp_b = q >> 5  # floor(q / 32)
    shift = q - exp_b * SUM_BUCKET_BITS
    none = np.int64(-2**31)
    return (np.where(used, exp_b, none).astype(np.int32), np.where(used, mant, 0),
            np.where(used, shift, 0).astype(np.int32))


def sum_from_parts(parts: Iterable[tuple[int, int]], positive_inf: bool, negative_inf: bool) -> float:
    """:func:`exact_sum` from ``(exp_b, Σ mant × 2^shift)`` partial sums (any grouping, any order)
    and whether +inf / -inf were among the values: the exact total, correctly rounded.

    >>> import numpy as np; b, m, s = exact_parts(np.array([0.1] * 10))
    >>> sum_from_parts([(int(x), int(y) << int(z)) for x, y, z in zip(b, m, s)], False, False)
    1.0
    """
    if positive_inf or negative_inf:
        return math.nan if positive_inf and negative_inf else (math.inf if positive_inf else -math.inf)
    by_bucket: dict[int, int] = {}
    for b, total in parts:
        by_bucket[int(b)] = by_bucket.get(int(b), 0) + int(total)
    if not by_bucket:
        return 0.0
    low = min(by_bucket)
    total = sum(t << (SUM_BUCKET_BITS * (b - low)) for b, t in by_bucket.items())
    scale = SUM_BUCKET_BITS * low
    try:  # int -> float and int / int are correctly rounded in CPython (subnormals included)
        return float(total << scale) if scale >= 0 else total / (1 << -scale)
    except OverflowError:
        return math.inf if total > 0 else -math.inf


def sketch_from_bins(zero_count: float, positive: Iterable[tuple[int, float]],
                     negative: Iterable[tuple[int, float]]) -> bytes:
    """The serialized sketch (:func:`serialize_sketch`) of grouped bin counts: equal, byte for
    byte, to the sketch built by adding the values one by one (bins only add)."""
    def store(bins: Iterable[tuple[int, float]]) -> bytes:
        kept = sorted((int(k), float(c)) for k, c in bins if c)
        return _U32.pack(len(kept)) + b"".join(_BIN.pack(k, c) for k, c in kept)

    return (_SKETCH_HEAD.pack(SKETCH_VERSION, SKETCH_RELATIVE_ACCURACY, float(zero_count))
            + store(positive) + store(negative))


def merge_sketches(sketches: Iterable[Any]) -> Any:
    out = new_sketch()
    for sk in sketches:
        out.merge(sk)
    return out


def _bins(store: Any) -> list[tuple[int, float]]:
    """A ddsketch store's bins as ``(key, count)``, in key order."""
    if not store.count:
        return []
    return [(k, store.bins[k - store.offset]) for k in range(store.min_key, store.max_key + 1)]


def serialize_sketch(sk: Any) -> bytes:
    """``u8 version | f64 relative_accuracy | f64 zero_count | store(+) | store(-)`` (docs/pipeline.md),
    where a store is ``u32 n | n × (i32 key, f64 count)``, its non-empty bins in increasing key order:
    one encoder with :func:`sketch_from_bins`, so the two paths cannot drift apart."""
    if sk._mapping.relative_accuracy != SKETCH_RELATIVE_ACCURACY:
        raise ValueError(f"a rollup sketch has relative accuracy {SKETCH_RELATIVE_ACCURACY}")
    return sketch_from_bins(sk._zero_count, _bins(sk._store), _bins(sk._negative_store))


def _read_store(data: bytes, pos: int, store: Any) -> int:
    if pos + _U32.size > len(data):
        raise ChunkFormatError("truncated sketch store")
    (n,) = _U32.unpack_from(data, pos)
    pos += _U32.size
    if pos + _BIN.size * n > len(data):
        raise ChunkFormatError("truncated sketch bins")
    prev = None
    for _ in range(n):
        key, count = _BIN.unpack_from(data, pos)
        pos += _BIN.size
        if (prev is not None and key <= prev) or not count > 0:
            raise ChunkFormatError("sketch bins must have increasing keys and positive counts")
        store.add(key, count)
        prev = key
    return pos


def sketch_bins(data: bytes) -> tuple[float, list[tuple[int, float]], list[tuple[int, float]]]:
    """``(zero_count, positive bins, negative bins)`` of a serialized sketch, bins as ``(key,
    count)`` in increasing key order (no ``ddsketch`` objects: the Parquet rows' quantiles)."""
    version, _accuracy, zero = _SKETCH_HEAD.unpack_from(data, 0)
    if version != SKETCH_VERSION:
        raise ChunkFormatError(f"unsupported sketch version {version}")
    pos = _SKETCH_HEAD.size
    stores = []
    for _ in range(2):
        (n,) = _U32.unpack_from(data, pos)
        pos += _U32.size
        stores.append([_BIN.unpack_from(data, pos + i * _BIN.size) for i in range(n)])
        pos += n * _BIN.size
    return zero, stores[0], stores[1]


def deserialize_sketch(data: bytes) -> Any:
    from ddsketch.ddsketch import BaseDDSketch
    from ddsketch.mapping import LogarithmicMapping
    from ddsketch.store import DenseStore

    if len(data) < _SKETCH_HEAD.size:
        raise ChunkFormatError("truncated sketch")
    version, accuracy, zero = _SKETCH_HEAD.unpack_from(data, 0)
    if version != SKETCH_VERSION:
        raise ChunkFormatError(f"unsupported sketch version {version}")
    pos_store, neg_store = DenseStore(), DenseStore()
    pos = _read_store(data, _SKETCH_HEAD.size, pos_store)
    pos = _read_store(data, pos, neg_store)
    if pos != len(data):
        raise ChunkFormatError("bytes after the sketch")
    return BaseDDSketch(LogarithmicMapping(accuracy), pos_store, neg_store, zero)


def quantile(sk: Any, q: float) -> float | None:
    return None if sk.count == 0 else float(sk.get_quantile_value(q))


# ------------------------------------------------------------------------------- aggregation


@dataclass(frozen=True)
class WindowAgg:
    """The aggregates of one series in one sample-time window.

    ``count`` counts every sample; ``nan_count`` those whose value is NaN. ``sum``/``min``/``max``
    are over the non-NaN values (``min``/``max`` are NaN when there are none; ±inf take part;
    :func:`exact_sum`, :func:`signed_extreme`).
    ``last`` is the value of the latest sample by ``(ts_unix_ns, manifest-id, sample index)``, so
    it is deterministic when timestamps tie. ``sketch`` covers the finite values.
    """

    window_start_ns: int
    count: int
    nan_count: int
    sum: float
    min: float
    max: float
    last: float
    last_ts_ns: int
    sketch: bytes

    def to_json(self) -> dict[str, Any]:
        sk = deserialize_sketch(self.sketch)
        return {"window_start_ns": self.window_start_ns, "count": self.count, "nan_count": self.nan_count,
                "sum": self.sum, "min": self.min, "max": self.max, "last": self.last, "last_ts_ns": self.last_ts_ns,
                "p50": quantile(sk, 0.5), "p90": quantile(sk, 0.9), "p99": quantile(sk, 0.99)}


def exact_sum(values: Sequence[float]) -> float:
    """The rollup's ``sum`` of non-NaN values, independent of their order: correctly rounded
    (``math.fsum``; an exact sum beyond the double range is ±inf); with infinities present, inf
    or -inf, or NaN when both signs are there.

    >>> exact_sum([0.1] * 10), exact_sum([1e308, 1e308, -1e308]), exact_sum([1e308, 1e308]), exact_sum([1.0, -math.inf])
    (1.0, 1e+308, inf, -inf)
    """
    infinite = {v for v in values if math.isinf(v)}
    if infinite:
        return infinite.pop() if len(infinite) == 1 else math.nan
    try:
        return float(math.fsum(values))
    except OverflowError:
        from fractions import Fraction

        exact = sum(Fraction(v) for v in values)  # fsum gives up on intermediate overflow
        try:
            return float(exact)  # correctly rounded
        except OverflowError:
            return math.inf if exact > 0 else -math.inf


def signed_extreme(extreme: float, values: Iterable[float], lowest: bool) -> float:
    """``min``/``max`` as the rollup stores them: -0.0 and 0.0 compare equal, so a zero extreme is
    -0.0 for ``min`` when a -0.0 is among the values, 0.0 for ``max`` when a 0.0 is (else the other
    zero) — the same bits whatever the order of the samples."""
    if extreme != 0:
        return extreme
    signs = {math.copysign(1.0, v) for v in values if v == 0}
    if lowest:
        return -0.0 if -1.0 in signs else 0.0
    return 0.0 if 1.0 in signs else -0.0


def _last_key(ts: int, manifest_id: str, ordinal: int) -> tuple[int, str, int]:
    return (ts, manifest_id, ordinal)


def aggregate_window(values: Sequence[float], ts: Sequence[int], manifest_ids: Sequence[str],
                     ordinals: Sequence[int], window_start_ns: int, sketch: Any = None) -> WindowAgg:
    """Aggregate one window's samples (the reference definition; ``sketch`` may be prebuilt)."""
    finite_or_inf = [v for v in values if not math.isnan(v)]
    best = max(range(len(values)), key=lambda i: _last_key(ts[i], manifest_ids[i], ordinals[i]))
    sk = sketch if sketch is not None else sketch_of(values)
    return WindowAgg(
        window_start_ns=window_start_ns,
        count=len(values),
        nan_count=len(values) - len(finite_or_inf),
        sum=exact_sum(finite_or_inf),
        min=signed_extreme(min(finite_or_inf), finite_or_inf, True) if finite_or_inf else math.nan,
        max=signed_extreme(max(finite_or_inf), finite_or_inf, False) if finite_or_inf else math.nan,
        last=float(values[best]),
        last_ts_ns=int(ts[best]),
        sketch=serialize_sketch(sk),
    )


def merge_aggs(aggs: Sequence[WindowAgg]) -> WindowAgg:
    """Merge aggregates of the same window from several chunks (several acceptance hours)."""
    if len(aggs) == 1:
        return aggs[0]
    non_nan_min = [a.min for a in aggs if not math.isnan(a.min)]
    non_nan_max = [a.max for a in aggs if not math.isnan(a.max)]
    latest = max(aggs, key=lambda a: (a.last_ts_ns, a.last if not math.isnan(a.last) else -math.inf))
    return WindowAgg(
        window_start_ns=aggs[0].window_start_ns,
        count=sum(a.count for a in aggs),
        nan_count=sum(a.nan_count for a in aggs),
        sum=float(sum(a.sum for a in aggs)),
        min=min(non_nan_min) if non_nan_min else math.nan,
        max=max(non_nan_max) if non_nan_max else math.nan,
        last=latest.last,
        last_ts_ns=latest.last_ts_ns,
        sketch=serialize_sketch(merge_sketches(deserialize_sketch(a.sketch) for a in aggs)),
    )


def window_start(ts_ns: int, window: str) -> int:
    w = WINDOW_NS[window]
    return (ts_ns // w) * w


# ------------------------------------------------------------------------------------ series


def series_key(metric: str, labels: Iterable[tuple[str, str]]) -> str:
    """The canonical text of a series: ``["<metric>",[["k","v"],...]]`` with labels sorted by key."""
    return canonical_json([metric, [list(p) for p in sorted(labels)]]).decode("utf-8")


def parse_series(key: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    metric, labels = json.loads(key)
    return metric, tuple((k, v) for k, v in labels)


def chunk_id(hour: UtcHour, window: str, series: str, generation: int, manifest_ids: Iterable[str]) -> str:
    """sha256 over (hour, window, series, generation, sorted manifest-ids) — docs/protocol.md §3.

    The hashed bytes are the canonical JSON of
    ``{"generation": g, "hour": "YYYY-MM-DDTHH", "manifest_ids": [sorted], "series": s, "window": w}``.
    """
    doc = {"hour": str(hour), "window": window, "series": series, "generation": generation,
           "manifest_ids": sorted(manifest_ids)}
    return hashlib.sha256(canonical_json(doc)).hexdigest()


def inputs_digest(manifest_ids: Iterable[str]) -> str:
    """sha256 of the hour's sorted input manifest-ids joined by ``\\n`` (the generation's inputs)."""
    return hashlib.sha256("\n".join(sorted(manifest_ids)).encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------ chunks


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=False,
                                    write_dict_id=False).compress(data)


def _unzstd(data: bytes, what: str) -> bytes:
    try:
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=256 * 1024 * 1024)
    except zstandard.ZstdError as exc:
        raise ChunkFormatError(f"{what}: not a zstd frame: {exc}") from None


@dataclass(frozen=True)
class Chunk:
    """One decoded chunk: its header fields and its rows (sorted by window start)."""

    header: dict[str, Any]
    rows: tuple[WindowAgg, ...]

    @property
    def metric(self) -> str:
        return str(self.header["metric"])

    @property
    def labels(self) -> dict[str, str]:
        return {k: v for k, v in self.header["labels"]}

    @property
    def window(self) -> str:
        return str(self.header["window"])


def chunk_header(*, hour: UtcHour, window: str, series: str, generation: int, chunk_id_: str,
                 manifest_ids: Sequence[str], ts_min: int, ts_max: int, samples: int, rows: int) -> dict[str, Any]:
    metric, labels = parse_series(series)
    return {
        "schema": CHUNK_SCHEMA,
        "hour": str(hour),
        "window": window,
        "window_ns": WINDOW_NS[window],
        "metric": metric,
        "labels": [list(p) for p in labels],
        "series": series,
        "generation": generation,
        "chunk_id": chunk_id_,
        "manifest_ids": sorted(manifest_ids),
        "sample_ts_min_ns": ts_min,
        "sample_ts_max_ns": ts_max,
        "samples": samples,
        "rows": rows,
        "sketch": {"kind": "ddsketch", "mapping": "logarithmic", "relative_accuracy": SKETCH_RELATIVE_ACCURACY},
    }


def encode_chunk(header: dict[str, Any], rows: Sequence[WindowAgg]) -> bytes:
    """``zstd( "LMRC" | u8 1 | u32 len | header JSON | u32 rows | row* )`` — see docs/pipeline.md."""
    head = canonical_json(header)
    parts = [_HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, len(head)), head, _U32.pack(len(rows))]
    for r in sorted(rows, key=lambda r: r.window_start_ns):
        parts.append(_ROW.pack(r.window_start_ns, r.count, r.nan_count, r.sum, r.min, r.max, r.last, r.last_ts_ns,
                               len(r.sketch)))
        parts.append(r.sketch)
    return _zstd(b"".join(parts))


def decode_chunk(data: bytes) -> Chunk:
    body = _unzstd(data, "chunk")
    if len(body) < _HEADER.size:
        raise ChunkFormatError("chunk too short")
    magic, version, head_len = _HEADER.unpack_from(body, 0)
    if magic != CHUNK_MAGIC:
        raise ChunkFormatError("bad chunk magic")
    if version != CHUNK_VERSION:
        raise ChunkFormatError(f"unsupported chunk version {version}")
    pos = _HEADER.size
    try:
        header = json.loads(body[pos:pos + head_len])
    except ValueError:
        raise ChunkFormatError("chunk header is not JSON") from None
    _schema(header.get("schema"), CHUNK_SCHEMA, "rollup chunk header")
    pos += head_len
    (n,) = _U32.unpack_from(body, pos)
    pos += _U32.size
    rows = []
    for _ in range(n):
        if pos + _ROW.size > len(body):
            raise ChunkFormatError("truncated chunk row")
        ws, count, nan_count, s, lo, hi, last, last_ts, sk_len = _ROW.unpack_from(body, pos)
        pos += _ROW.size
        sketch = body[pos:pos + sk_len]
        if len(sketch) != sk_len:
            raise ChunkFormatError("truncated chunk sketch")
        pos += sk_len
        rows.append(WindowAgg(ws, count, nan_count, s, lo, hi, last, last_ts, bytes(sketch)))
    if pos != len(body):
        raise ChunkFormatError("bytes after the last chunk row")
    return Chunk(header, tuple(rows))


def encode_index_entry(entry: dict[str, Any]) -> bytes:
    return _zstd(canonical_json({"schema": INDEX_SCHEMA, **entry}))


def decode_index_entry(data: bytes) -> dict[str, Any]:
    doc = json.loads(_unzstd(data, "index entry"))
    _schema(doc.get("schema") if isinstance(doc, dict) else None, INDEX_SCHEMA, "rollup index entry")
    return doc


# ------------------------------------------------------------------------------ the manifest


def chunk_order(c: dict[str, Any]) -> tuple[str, str, str]:
    """The order of chunk entries in a chunk list (and in a v1 manifest)."""
    return (c["metric"], json.dumps(c["labels"]), c["window"])


def chunk_list_parts(chunks: int) -> int:
    """How many chunk lists a generation of ``chunks`` chunks has (a function of its content)."""
    return max(1, -(-chunks // CHUNKS_PER_LIST))


def chunk_list_part(metric: str, parts: int) -> int:
    """The chunk list holding ``metric``'s chunks: the first 32 bits of sha256(metric) mod
    ``parts`` — a query for one metric reads one list (in Spark: :func:`chunk_list_part_col`).

    >>> chunk_list_part("cpu.usage", 1)
    0
    """
    return int(hashlib.sha256(metric.encode("utf-8")).hexdigest()[:8], 16) % parts


def chunk_list_part_col(metric: Any, parts: Any) -> Any:
    """:func:`chunk_list_part` as a Spark column of the columns ``metric`` and ``parts``."""
    from pyspark.sql import functions as F

    return F.pmod(F.conv(F.substring(F.sha2(metric, 256), 1, 8), 16, 10).cast("long"), parts.cast("long")).cast("int")


def chunk_list_bytes(*, hour: UtcHour, generation: int, part: int, parts: int,
                     chunks: Sequence[dict[str, Any]]) -> bytes:
    """One chunk list (``lightmetrics.rollup_chunk_list.v1``, zstd of canonical JSON): the entries of
    the chunks of generation ``generation`` whose metric falls in ``part``, in :func:`chunk_order`."""
    doc = {"schema": CHUNK_LIST_SCHEMA, "hour": str(hour), "generation": generation, "part": part, "parts": parts,
           "chunks": sorted(chunks, key=chunk_order)}
    return _zstd(canonical_json(doc))


def parse_chunk_list(data: bytes) -> dict[str, Any]:
    doc = json.loads(_unzstd(data, "chunk list"))
    _schema(doc.get("schema") if isinstance(doc, dict) else None, CHUNK_LIST_SCHEMA, "rollup chunk list")
    return doc


def chunk_lists(*, hour: UtcHour, generation: int,
                chunks: Sequence[dict[str, Any]]) -> list[tuple[int, bytes, int]]:
    """``(part, bytes, chunks in it)`` of every non-empty chunk list of a generation whose entries
    are all at hand (the job builds each list in an executor from its part alone; the same function)."""
    parts = chunk_list_parts(len(chunks))
    by_part: dict[int, list[dict[str, Any]]] = {}
    for c in chunks:
        by_part.setdefault(chunk_list_part(c["metric"], parts), []).append(c)
    return [(p, chunk_list_bytes(hour=hour, generation=generation, part=p, parts=parts, chunks=cs), len(cs))
            for p, cs in sorted(by_part.items())]


def chunk_list_ref(codec: Any, hour: UtcHour, part: int, data: bytes, chunks: int) -> dict[str, Any]:
    """The manifest's reference to one chunk list: its key (named by its sha256), sha256, size."""
    sha = hashlib.sha256(data).hexdigest()
    return {"part": part, "key": codec.rollup_chunk_list(hour, sha), "sha256": sha, "bytes": len(data),
            "chunks": chunks}


def manifest_bytes(*, hour: UtcHour, generation: int, supersedes: int | None, input_count: int, input_sha256: str,
                   skipped: Sequence[dict[str, str]], skipped_count: int, parts: int,
                   lists: Sequence[dict[str, Any]], totals: dict[str, int]) -> bytes:
    """The hour's commit point (``lightmetrics.rollup_manifest.v2``). Its content is a pure function
    of the inputs: no wall-clock, no owner, so a rerun of the same generation produces the same
    bytes. Its size does not grow with the chunks: they are named by the chunk lists it references
    (key + sha256), and skipped inputs are counted, with the first :data:`SKIPPED_SAMPLE` named."""
    doc = {
        "schema": MANIFEST_SCHEMA,
        "hour": str(hour),
        "generation": generation,
        "supersedes": supersedes,
        "inputs": {"count": input_count, "sha256": input_sha256},
        "skipped": {"count": skipped_count,
                    "first": sorted(skipped, key=lambda s: s["manifest_id"])[:SKIPPED_SAMPLE]},
        "chunk_lists": {"parts": parts, "lists": sorted(lists, key=lambda r: r["part"])},
        "totals": {"chunks": int(totals["chunks"]), "series": int(totals["series"]),
                   "samples": int(totals["samples"])},
    }
    return canonical_json(doc)


def manifest_v1_bytes(*, hour: UtcHour, generation: int, supersedes: int | None, input_count: int,
                      input_sha256: str, skipped: Sequence[dict[str, str]], chunks: Sequence[dict[str, Any]]) -> bytes:
    """A v1 manifest (chunks inline), as written before v2: kept for the readers' tests."""
    ordered = sorted(chunks, key=chunk_order)
    return canonical_json({
        "schema": MANIFEST_SCHEMA_V1, "hour": str(hour), "generation": generation, "supersedes": supersedes,
        "inputs": {"count": input_count, "sha256": input_sha256},
        "skipped": sorted(skipped, key=lambda s: s["manifest_id"]), "chunks": ordered,
        "totals": {"chunks": len(ordered), "series": len({c["series"] for c in ordered}),
                   "samples": sum(c["samples"] for c in ordered if c["window"] == "1h")},
    })


def parse_manifest(data: bytes) -> dict[str, Any]:
    """A rollup manifest, v3 (Parquet objects), v2 (chunk lists) or v1 (chunks inline). A newer
    version is refused (docs/protocol.md §17)."""
    try:
        doc = json.loads(data)
    except ValueError:
        raise ChunkFormatError("rollup manifest is not JSON") from None
    stored = doc.get("schema") if isinstance(doc, dict) else None
    if stored not in (MANIFEST_SCHEMA_V1, MANIFEST_SCHEMA):
        _schema(stored, MANIFEST_SCHEMA_V3, "rollup manifest")
    return doc


def _schema(stored: object, known: str, what: str) -> None:
    """A newer schema version is refused with the core's UnsupportedVersionError (protocol §17);
    any other mismatch is a ChunkFormatError."""
    try:
        check_schema(stored, known, what)
    except UnsupportedVersionError:
        raise
    except ManifestError as exc:
        raise ChunkFormatError(str(exc)) from None


__all__ = [
    "CHUNK_LIST_SCHEMA", "CHUNK_SCHEMA", "CHUNKS_PER_LIST", "INDEX_SCHEMA", "MANIFEST_SCHEMA", "MANIFEST_SCHEMA_V1",
    "SKETCH_RELATIVE_ACCURACY", "SKIPPED_SAMPLE", "WINDOW_NS", "chunk_list_bytes", "chunk_list_part",
    "chunk_list_parts", "chunk_list_ref", "chunk_lists", "chunk_order", "exact_sum", "manifest_v1_bytes",
    "parse_chunk_list", "signed_extreme", "sketch_from_bins", "sketch_keys", "exact_parts", "sum_from_parts",
    "Chunk", "ChunkFormatError", "WindowAgg", "aggregate_window", "chunk_header", "chunk_id", "decode_chunk",
    "decode_index_entry", "deserialize_sketch", "encode_chunk", "encode_index_entry", "inputs_digest",
    "manifest_bytes", "merge_aggs", "merge_sketches", "new_sketch", "parse_manifest", "parse_series", "quantile",
    "serialize_sketch", "series_key", "sketch_of", "window_start",
]
