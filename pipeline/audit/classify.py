"""The audit's classification of inventory rows: every layout key's kind and fields, in Spark SQL.

Inventory has no user metadata and no content, so identities come from keys: each key's kind comes
from its prefix, then one regular expression per kind (the key codec's layout in Java syntax) both
validates it and extracts its fields (docs/pipeline.md §3).
"""

from __future__ import annotations

from typing import Any

from lightmetrics.protocol.keys import KeyCodec, KeyKind, layout_root, layout_roots

_ID = r"agent=([0-9a-f]+)/boot=([0-9a-f]+)/(\d{20})-(\d{20})"
_HOUR = r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})"
_SHA = r"sha256/([0-9a-f]{2})/([0-9a-f]{2})/(\1\2[0-9a-f]{60})"
# The roots come from the codec ([a-z-]+/v1/: literal in a Java regex as they are); keys are namespace-relative.
_ACCEPTED, _BY_TIME, _BY_BLOB = layout_roots(KeyKind.ACCEPTED, KeyKind.ACCEPTED_BY_TIME, KeyKind.ACCEPTED_BY_BLOB)
_BLOB, _BLOB_BY_TIME = layout_roots(KeyKind.RAW_BLOB, KeyKind.RAW_BLOBS_BY_TIME)
_QUARANTINE, _QUARANTINE_BY_BLOB = layout_root(KeyKind.QUARANTINE), layout_root(KeyKind.QUARANTINE_BY_BLOB)
_CONFLICTS = KeyCodec().quarantine_root()  # the quarantine's identity-conflict folder
_RAW_RETENTION = KeyCodec().retention_scope_root("raw")

#: kind -> (prefix, Java regex over the namespace-relative key, {column: group})
KINDS: dict[str, tuple[str, str, dict[str, int]]] = {
    "accepted": (_ACCEPTED, rf"^{_ACCEPTED}{_ID}\.json$", {"agent": 1, "boot": 2, "s": 3, "e": 4}),
    "by_time": (_BY_TIME,
                rf"^{_BY_TIME}{_HOUR}/([0-9a-f]+)\.([0-9a-f]+)\.(\d{{20}})-(\d{{20}})\.json$",
                {"date": 1, "hh": 2, "agent": 3, "boot": 4, "s": 5, "e": 6}),
    "by_blob": (_BY_BLOB, rf"^{_BY_BLOB}{_SHA}/{_ID}\.json$",
                {"sha": 3, "agent": 4, "boot": 5, "s": 6, "e": 7}),
    "blob": (_BLOB, rf"^{_BLOB}{_SHA}\.lmbatch$", {"sha": 3}),
    "blob_by_time": (_BLOB_BY_TIME, rf"^{_BLOB_BY_TIME}{_HOUR}/sha256=([0-9a-f]{{64}})\.json$",
                     {"date": 1, "hh": 2, "sha": 3}),
    "quarantine": (_QUARANTINE, rf"^{_CONFLICTS}{_ID}/([0-9a-f]{{64}})\.json$",
                   {"agent": 1, "boot": 2, "s": 3, "e": 4, "sha": 5}),
    "quarantine_by_blob": (_QUARANTINE_BY_BLOB, rf"^{_QUARANTINE_BY_BLOB}{_SHA}/{_ID}\.json$",
                           {"sha": 3, "agent": 4, "boot": 5, "s": 6, "e": 7}),
    "tombstone": (_RAW_RETENTION, rf"^{_RAW_RETENTION}{_HOUR}/(tombstone|reaped)\.json$", {"date": 1, "hh": 2}),
}
#: layout prefixes the audit does not classify (rollups, resolutions, audits): counted only
OTHER_PREFIXES = layout_roots(KeyKind.CONFLICT_RESOLUTION, KeyKind.ROLLUP_MANIFEST, KeyKind.ROLLUP_PART,
                              KeyKind.ROLLUP_INDEX, KeyKind.RETENTION_TOMBSTONE, KeyKind.AUDIT)

#: The fields a key can carry, in the order of the classification's field string.
FIELD_NAMES = ("agent", "boot", "s", "e", "sha", "date", "hh")
#: Starts a valid key's field string (never the start of a layout key, so it also says "valid").
_FIELDS_MARK = "|"


def _field_template(groups: dict[str, int]) -> str:
    """The ``regexp_replace`` replacement that turns a valid key of a kind into its field string:
    ``|agent|boot|s|e|sha|date|hh`` (empty where the kind has no such field).

    >>> _field_template({"sha": 3})
    '|||||$3||'
    """
    return _FIELDS_MARK + "|".join(f"${groups[f]}" if f in groups else "" for f in FIELD_NAMES)


def classify(inventory: Any, prefix: str) -> Any:
    """Current, non-delete-marker rows of the namespace, one per key, with extracted fields.

    Columns: kind, key, size, lm (LastModified, unix s), valid, agent, boot, s, e, sha, mid, hour_s.
    The kind comes from the prefix; then **one** regular expression per key (its kind's, the key
    codec's layout in Java syntax) both validates it and rewrites it into its field string
    (:func:`_field_template`), which is split into the fields. JVM string functions only; the
    expressions stay small, so the generated code stays under the JIT's method size limit (nested
    per-field, per-kind conditions made it run interpreted, several times slower).
    """
    from pyspark.sql import functions as F

    cur = inventory.where(F.coalesce(F.col("is_latest"), F.lit(True)) & ~F.coalesce(F.col("is_delete_marker"), F.lit(False)))
    if prefix:
        cur = cur.where(F.col("key").startswith(prefix))
    rel = F.substring(F.col("key"), len(prefix) + 1, 1 << 20) if prefix else F.col("key")
    cur = cur.select(F.col("key"), rel.alias("rel"), F.col("size"), F.col("last_modified_date").cast("long").alias("lm"))
    kind = F.lit(None).cast("string")
    for pfx in OTHER_PREFIXES:
        kind = F.when(F.col("rel").startswith(pfx), F.lit("other")).otherwise(kind)
    for name, (pfx, _, _) in reversed(list(KINDS.items())):
        kind = F.when(F.col("rel").startswith(pfx), F.lit(name)).otherwise(kind)
    fields = F.lit("")
    for name, (_, pattern, groups) in KINDS.items():
        fields = F.when(F.col("kind") == name, F.regexp_replace("rel", pattern, _field_template(groups))).otherwise(fields)
    cur = cur.withColumn("kind", kind).withColumn("fields", fields)
    valid = F.col("fields").startswith(_FIELDS_MARK)
    parts = F.split(F.when(valid, F.substring("fields", 2, 1 << 20)).otherwise(F.lit("|" * (len(FIELD_NAMES) - 1))),
                    r"\|")
    cur = cur.select("kind", "key", "size", "lm", valid.alias("valid"),
                     *[F.element_at(parts, i + 1).alias(f) for i, f in enumerate(FIELD_NAMES)])
    mid = F.when(F.col("agent") != "", F.concat_ws(".", "agent", "boot", F.concat("s", F.lit("-"), "e")))
    hour_s = F.when(F.col("date") != "", F.unix_timestamp(F.concat_ws(" ", "date", "hh"), "yyyy-MM-dd HH"))
    return cur.withColumn("mid", mid).withColumn("hour_s", hour_s).drop("date", "hh")


__all__ = ["FIELD_NAMES", "KINDS", "OTHER_PREFIXES", "classify"]
