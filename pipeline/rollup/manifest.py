"""The hour's rollup manifest (``manifests/v1/.../generation=N.json``) and its chunk lists.

v2 names its chunks through chunk lists (one per metric partition, named by their sha256); v1
held them inline and is still read; v3 (Parquet parts, :mod:`lightmetrics_pipeline.rollup.parquet`)
is what the job writes. Pure functions, no I/O; the normative description is ``docs/pipeline.md``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import canonical_json
from lightmetrics_pipeline.rollup.codec import ChunkFormatError, check_object_schema, zstd_compress, zstd_decompress

MANIFEST_SCHEMA = "lightmetrics.rollup_manifest.v2"
MANIFEST_SCHEMA_V1 = "lightmetrics.rollup_manifest.v1"  # chunks inline; still read, no longer written
#: Parquet objects (lightmetrics_pipeline.rollup.parquet), the hour named ``hour``: still read, and a
#: generation committed in it is recomputed in it (byte for byte).
MANIFEST_SCHEMA_V3 = "lightmetrics.rollup_manifest.v3"
#: v3 with the hour named ``acceptance_hour`` (as the Parquet column): a ``hour`` field collides with
#: the ``hour=HH/`` folder for readers that derive Hive partitions (DuckDB's and pyarrow's datasets);
#: what the job writes (docs/pipeline.md §6).
MANIFEST_SCHEMA_V4 = "lightmetrics.rollup_manifest.v4"
#: The manifests of Parquet-object generations (format v3 objects), and the one new generations get.
PARQUET_MANIFEST_SCHEMAS = (MANIFEST_SCHEMA_V3, MANIFEST_SCHEMA_V4)
WRITTEN_MANIFEST_SCHEMA = MANIFEST_SCHEMA_V4
CHUNK_LIST_SCHEMA = "lightmetrics.rollup_chunk_list.v1"
#: A generation's chunk entries are split into ceil(chunks / CHUNKS_PER_LIST) chunk lists, by metric.
CHUNKS_PER_LIST = 20_000
#: The manifest names at most this many skipped inputs (the first by manifest-id) and counts them all.
SKIPPED_SAMPLE = 100


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
    return zstd_compress(canonical_json(doc))


def parse_chunk_list(data: bytes) -> dict[str, Any]:
    doc = json.loads(zstd_decompress(data, "chunk list"))
    check_object_schema(doc.get("schema") if isinstance(doc, dict) else None, CHUNK_LIST_SCHEMA, "rollup chunk list")
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


def is_parquet_manifest(doc: dict[str, Any]) -> bool:
    """Whether ``doc`` commits Parquet objects (manifest v3 or v4) rather than chunks (v1, v2)."""
    return doc.get("schema") in PARQUET_MANIFEST_SCHEMAS


def manifest_hour(doc: dict[str, Any]) -> str:
    """The acceptance hour a manifest commits (``acceptance_hour`` from v4 on, ``hour`` before)."""
    return str(doc["acceptance_hour"] if "acceptance_hour" in doc else doc["hour"])


def parse_manifest(data: bytes) -> dict[str, Any]:
    """A rollup manifest, v4/v3 (Parquet objects), v2 (chunk lists) or v1 (chunks inline). A newer
    version is refused (docs/protocol.md §17)."""
    try:
        doc = json.loads(data)
    except ValueError:
        raise ChunkFormatError("rollup manifest is not JSON") from None
    stored = doc.get("schema") if isinstance(doc, dict) else None
    if stored not in (MANIFEST_SCHEMA_V1, MANIFEST_SCHEMA, MANIFEST_SCHEMA_V3):
        check_object_schema(stored, MANIFEST_SCHEMA_V4, "rollup manifest")
    return doc


__all__ = ["CHUNKS_PER_LIST", "CHUNK_LIST_SCHEMA", "MANIFEST_SCHEMA", "MANIFEST_SCHEMA_V1", "MANIFEST_SCHEMA_V3",
    "MANIFEST_SCHEMA_V4", "PARQUET_MANIFEST_SCHEMAS", "SKIPPED_SAMPLE", "WRITTEN_MANIFEST_SCHEMA", "chunk_list_bytes",
    "chunk_list_part", "chunk_list_part_col", "chunk_list_parts", "chunk_list_ref", "chunk_lists", "chunk_order",
    "is_parquet_manifest", "manifest_bytes", "manifest_hour", "manifest_v1_bytes", "parse_chunk_list",
    "parse_manifest"]
