"""Reading a committed rollup generation back, and comparing two manifests of one generation.

Readers (``lmctl query``, the job's planning) take the highest generation listed under
``manifests/v1/<hour>/`` (docs/pipeline.md); a recompute compares what it would commit with what
is committed by the objects both name.
"""

from __future__ import annotations

from typing import Any

from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics_pipeline.rollup import manifest as RM
from lightmetrics_pipeline.rollup.write_chunks import list_refs
from lightmetrics_pipeline.s3io import S3Access


def same_chunks(codec: Any, a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two manifests of one generation name the same objects (v3/v4: the same schema and
    Parquet objects; v1/v2: the same chunks, by id and bytes)."""
    if RM.is_parquet_manifest(a) or RM.is_parquet_manifest(b):
        return a.get("schema") == b.get("schema") and a.get("parquet") == b.get("parquet")
    return list_refs(codec, a) == list_refs(codec, b)


def differing_objects(committed: dict[str, Any], mine: dict[str, Any], shown: int = 5) -> str:
    """What differs between two v3 manifests of one generation, for an error message: per
    (window, part), the committed sha256 and the recomputed one (``-`` where one has no object)."""
    if not RM.is_parquet_manifest(committed) or not RM.is_parquet_manifest(mine):
        return "chunks differ"
    if committed["schema"] != mine["schema"]:
        return f"schema {committed['schema']} vs {mine['schema']}"

    def refs(doc: dict[str, Any]) -> dict[tuple[str, int], str]:
        return {(str(o["window"]), int(o["part"])): str(o["sha256"]) for o in doc["parquet"]["objects"]}

    a, b = refs(committed), refs(mine)
    diff = [f"{w} part {p}: committed {a.get((w, p), '-')[:12]}, recomputed {b.get((w, p), '-')[:12]}"
            for w, p in sorted(set(a) | set(b)) if a.get((w, p)) != b.get((w, p))]
    if committed["parquet"].get("parts") != mine["parquet"].get("parts"):
        diff.insert(0, f"parts {committed['parquet'].get('parts')} vs {mine['parquet'].get('parts')}")
    more = f" and {len(diff) - shown} more" if len(diff) > shown else ""
    return "; ".join(diff[:shown]) + more if diff else "object sizes or counts differ"


def read_committed(access: S3Access, hour: UtcHour) -> dict[str, Any] | None:
    """What readers do: the highest generation listed under ``manifests/v1/<hour>/`` (every listed
    manifest is complete — it is written after all its chunks and chunk lists). The listing is
    delimited by ``/``: the chunk lists, in their own folder, are not listed."""
    from lightmetrics_pipeline import s3io

    codec = access.codec
    keys, _ = s3io.list_all(access, codec.rollup_manifest_hour(hour), delimiter="/")
    best: tuple[int, str] | None = None
    for key, _size in keys:
        try:
            parsed = codec.parse(key)
        except Exception:
            continue
        if parsed.kind is KeyKind.ROLLUP_MANIFEST and parsed.generation is not None:
            if best is None or parsed.generation > best[0]:
                best = (parsed.generation, key)
    if best is None:
        return None
    doc = RM.parse_manifest(s3io.store(access).get(best[1]) or b"")
    doc["_key"] = best[1]
    return doc


__all__ = ["differing_objects", "read_committed", "same_chunks"]
