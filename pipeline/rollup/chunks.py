"""The rollup chunk (``.lmrollup.zst``), its index entry (``.lmindex.zst``) and the series key.

Pure functions, no Spark, no I/O: the rollup job, ``lmctl query`` and the tests share them. The
normative description (byte layout, field meanings, reader rules) is ``docs/pipeline.md``. The
sketch inside a chunk row is :mod:`lightmetrics_pipeline.rollup.sketch`, a row's aggregates
:mod:`lightmetrics_pipeline.rollup.window_agg`, the hour's manifest :mod:`lightmetrics_pipeline.rollup.manifest`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import canonical_json
from lightmetrics_pipeline.rollup.codec import ChunkFormatError, check_object_schema, zstd_compress, zstd_decompress
from lightmetrics_pipeline.rollup.sketch import SKETCH_RELATIVE_ACCURACY
from lightmetrics_pipeline.rollup.window_agg import WINDOW_NS, WindowAgg

CHUNK_SCHEMA = "lightmetrics.rollup_chunk.v1"
INDEX_SCHEMA = "lightmetrics.rollup_index.v1"
CHUNK_MAGIC = b"LMRC"
CHUNK_VERSION = 1
_HEADER = struct.Struct(">4sBI")  # magic, version, header length
_U32 = struct.Struct(">I")
_ROW = struct.Struct(">qQQddddqI")  # window_start, count, nan_count, sum, min, max, last, last_ts, sketch_len


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
    return zstd_compress(b"".join(parts))


def decode_chunk(data: bytes) -> Chunk:
    body = zstd_decompress(data, "chunk")
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
    check_object_schema(header.get("schema"), CHUNK_SCHEMA, "rollup chunk header")
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
    return zstd_compress(canonical_json({"schema": INDEX_SCHEMA, **entry}))


def decode_index_entry(data: bytes) -> dict[str, Any]:
    doc = json.loads(zstd_decompress(data, "index entry"))
    check_object_schema(doc.get("schema") if isinstance(doc, dict) else None, INDEX_SCHEMA, "rollup index entry")
    return doc


__all__ = ["CHUNK_MAGIC", "CHUNK_SCHEMA", "CHUNK_VERSION", "Chunk", "INDEX_SCHEMA", "chunk_header", "chunk_id",
    "decode_chunk", "decode_index_entry", "encode_chunk", "encode_index_entry", "inputs_digest", "parse_series",
    "series_key"]
