"""The inventory audit: the reconciler's comparison at inventory scale, with Spark.

Input: an S3 Inventory report of the authority bucket (all versions; only current versions that
are not delete markers count as present). Inventory has no user metadata and no content, so
identities come from keys: every layout key is classified and its fields (manifest-id, sha256,
hour) extracted with Spark SQL regular expressions, and every finding is a DataFrame join —
nothing collects a key set on the driver (a test runs it with ``spark.driver.maxResultSize=1m``
on a million keys).

Findings (candidates from the joins; each is then **confirmed with live requests** inside the
executors, because inventory lags — only confirmed findings are written):

``repair``
    an acceptance record without its ``accepted-by-time`` / ``accepted-by-blob`` entry, or whose
    blob has no ``raw-blobs-by-time`` entry; a quarantine manifest without ``quarantine-by-blob``.
    Confirmed by GET of the record and HEADs of the exact derived keys (hours tombstoned by
    retention are skipped: nothing is re-created under a tombstone). The walk consumes it.
``derived-without-source``
    a derived entry whose source does not exist (accepted-by-time/-by-blob without the record,
    raw-blobs-by-time without the blob, quarantine-by-blob without the quarantine manifest).
    Confirmed by a HEAD of the source (and, for a blob, the reaped state is not a violation).
``integrity``
    an acceptance record whose blob is missing (or has another size) outside a tombstoned hour.
    Confirmed by GET of the record, HEAD of the blob and of the hour's tombstone.
A missing blob that GC has marked is **in GC's hands** (docs/protocol.md §15: the intent is
recorded in the reap's ``marks#`` items before the delete marker; the settle purges it or, if it is
referenced, restores it): neither ``integrity`` nor ``derived-without-source``. The marked keys are
read from the control table by the driver (at most the reap's pending pages of marks) at the start,
and again once the candidates are confirmed for the blobs found missing — a GC run may have marked
them meanwhile (:class:`MarkedBlobs`).

``orphan-blob-candidates``
    raw blobs older than ``LM_RETRY_HORIZON_S`` that no ``accepted-by-blob`` entry references
    (conflict evidence only once its conflict was resolved longer ago than the evidence window);
    the daily GC proves them (docs/protocol.md §15 G-B3). Confirmed with
    the GC proof (docs/protocol.md §15): HEAD of the blob (identity metadata, age), GET of the
    acceptance record at that identity, HEAD of the quarantine key. GC proves again at delete time.
``overlapping-ranges``
    acceptance records of one boot whose sequence ranges overlap (legal, but those samples would
    be counted twice). Confirmed by HEADs of both records.

Outputs go to ``audit/v1/run=<id>/<category>/part-NNNNN.jsonl`` (canonical JSON lines, at most
``ROWS_PER_PART`` per file, each file written by its own task) by conditional create, then
``audit/v1/run=<id>/summary.json`` last: the summary is the run's commit point (readers ignore a
run without one).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.derived.indexing import parse_record
from lightmetrics.protocol.errors import ManifestError
from lightmetrics.protocol.identity import BatchIdentity, hex_to_id
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest, canonical_json
from lightmetrics.reaps.gc import resolution_settles
from lightmetrics_pipeline.s3io import S3Access, Tally, counter_accumulator, put_if_absent, row_mapper, task_tally

CATEGORIES = ("repair", "derived-without-source", "integrity", "orphan-blob-candidates", "overlapping-ranges")

_ID = r"agent=([0-9a-f]+)/boot=([0-9a-f]+)/(\d{20})-(\d{20})"
_HOUR = r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})"
_SHA = r"sha256/([0-9a-f]{2})/([0-9a-f]{2})/(\1\2[0-9a-f]{60})"

#: kind -> (prefix, Java regex over the namespace-relative key, {column: group})
KINDS: dict[str, tuple[str, str, dict[str, int]]] = {
    "accepted": ("accepted/v1/", rf"^accepted/v1/{_ID}\.json$", {"agent": 1, "boot": 2, "s": 3, "e": 4}),
    "by_time": ("accepted-by-time/v1/",
                rf"^accepted-by-time/v1/{_HOUR}/([0-9a-f]+)\.([0-9a-f]+)\.(\d{{20}})-(\d{{20}})\.json$",
                {"date": 1, "hh": 2, "agent": 3, "boot": 4, "s": 5, "e": 6}),
    "by_blob": ("accepted-by-blob/v1/", rf"^accepted-by-blob/v1/{_SHA}/{_ID}\.json$",
                {"sha": 3, "agent": 4, "boot": 5, "s": 6, "e": 7}),
    "blob": ("raw-blobs/v1/", rf"^raw-blobs/v1/{_SHA}\.lmbatch$", {"sha": 3}),
    "blob_by_time": ("raw-blobs-by-time/v1/", rf"^raw-blobs-by-time/v1/{_HOUR}/sha256=([0-9a-f]{{64}})\.json$",
                     {"date": 1, "hh": 2, "sha": 3}),
    "quarantine": ("quarantine/v1/", rf"^quarantine/v1/identity-conflict/{_ID}/([0-9a-f]{{64}})\.json$",
                   {"agent": 1, "boot": 2, "s": 3, "e": 4, "sha": 5}),
    "quarantine_by_blob": ("quarantine-by-blob/v1/", rf"^quarantine-by-blob/v1/{_SHA}/{_ID}\.json$",
                           {"sha": 3, "agent": 4, "boot": 5, "s": 6, "e": 7}),
    "tombstone": ("retention/v1/raw/", rf"^retention/v1/raw/{_HOUR}/(tombstone|reaped)\.json$", {"date": 1, "hh": 2}),
}
#: layout prefixes the audit does not classify (rollups, resolutions, audits): counted only
OTHER_PREFIXES = ("conflict-resolutions/v1/", "manifests/v1/", "rollup/v1/", "index/v1/", "retention/v1/", "audit/v1/")


@dataclass
class AuditReport:
    run_id: str
    inventory: dict[str, Any]
    rows_scanned: int = 0
    keys_by_kind: dict[str, int] = field(default_factory=dict)
    unparsed: dict[str, int] = field(default_factory=dict)
    candidates: dict[str, int] = field(default_factory=dict)
    confirmed: dict[str, int] = field(default_factory=dict)
    files: dict[str, list[str]] = field(default_factory=dict)
    requests: Tally = field(default_factory=Tally)
    seconds: float = 0.0
    summary_key: str = ""
    output_prefix: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    write_tasks: int = 0

    @property
    def violations(self) -> int:
        return sum(self.confirmed.get(c, 0) for c in ("derived-without-source", "integrity"))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "lightmetrics.audit_summary.v1",
            "run_id": self.run_id,
            "inventory": self.inventory,
            "rows_scanned": self.rows_scanned,
            "keys_by_kind": self.keys_by_kind,
            "unparsed_keys": self.unparsed,
            "candidates": self.candidates,
            "confirmed": self.confirmed,
            "files": self.files,
            "write_tasks": self.write_tasks,
            "s3_requests": self.requests.to_json(),
            "seconds": round(self.seconds, 2),
            "phase_seconds": {k: round(v, 2) for k, v in self.phases.items()},
            "output_prefix": self.output_prefix,
        }


# ------------------------------------------------------------------------------ classification


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


# ------------------------------------------------------------------------------ confirmation


class MarkedBlobs(frozenset):  # type: ignore[type-arg]
    """The blob keys in GC's recorded marks as read at one instant, and how to read them again.

    Every delete marker GC places is recorded in a ``marks#`` item *before* it is placed, and the
    item is deleted only once the mark is settled (docs/protocol.md §15, G-I3). So a blob the
    audit found missing under a marker GC placed after the first read is in a read taken after that
    HEAD, or its settle has finished (a referenced blob is current again; a purged blob's
    ``raw-blobs-by-time`` entry is gone) — :meth:`read_again` is that later read.

    >>> MarkedBlobs({"raw-blobs/v1/sha256/ab/cd/abcd.lmbatch"}).read_again()
    MarkedBlobs({'raw-blobs/v1/sha256/ab/cd/abcd.lmbatch'})
    """

    reader: Any = None

    def read_again(self) -> "MarkedBlobs":
        return self if self.reader is None else self.reader()


def gc_marked_blobs(table: Any, codec: Any) -> MarkedBlobs:
    """The blob keys in GC's recorded marks (intents and marks not yet settled, docs/protocol.md
    §15): one Query of the reap's checkpoint items; :meth:`MarkedBlobs.read_again` queries again."""
    from lightmetrics.reaps.gc_marks import read_marks_items

    marked = MarkedBlobs(m["key"] for item in read_marks_items(table, codec) for m in item["marks"])
    marked.reader = lambda: gc_marked_blobs(table, codec)
    return marked


def _identity(agent_hex: str, boot_hex: str, s: Any, e: Any) -> BatchIdentity:
    return BatchIdentity.create(hex_to_id(agent_hex), hex_to_id(boot_hex), int(s), int(e))


class _Live:
    """Live reads inside an executor (one per task; tombstone HEADs cached per hour)."""

    def __init__(self, access: S3Access) -> None:
        from lightmetrics_pipeline import s3io

        self.store = s3io.store(access)
        self.codec = access.codec
        self._tomb: dict[int, bool] = {}

    def tombstoned(self, hour: UtcHour) -> bool:
        if hour.start_unix_s not in self._tomb:
            self._tomb[hour.start_unix_s] = self.store.head(self.codec.retention_tombstone("raw", hour)) is not None
        return self._tomb[hour.start_unix_s]

    def manifest(self, key: str) -> AcceptedBatchManifest | None | str:
        raw = self.store.get(key)
        if raw is None:
            return None
        try:
            return parse_record(self.codec, key, raw)  # the core's one record validation
        except ManifestError as exc:
            return f"invalid: {exc}"


MANIFEST_CHECK_COLUMNS = ["category", "manifest_key", "manifest_id", "frame_sha256", "accepted_hour", "missing",
                          "blob_key", "detail"]


def _check_manifest(access: S3Access, gc_marked: frozenset[str] = frozenset()) -> Any:
    """Live state of one acceptance record: its derived entries and its blob (repair + integrity)."""

    def check(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = _Live(access)
        key = row["key"]
        m = live.manifest(key)
        if not isinstance(m, AcceptedBatchManifest):
            return []  # gone or invalid now: the reconciler/walk raise those as blockers, not the audit
        ident = m.identity
        hour = UtcHour.of_unix_ns(m.accepted_at_unix_ns)
        if live.tombstoned(hour):
            return []  # the expected reaped state; nothing is re-created under a tombstone
        codec = live.codec
        base = {"manifest_key": key, "manifest_id": ident.manifest_id, "frame_sha256": m.frame_sha256,
                "accepted_hour": str(hour), "blob_key": m.raw_blob_key}
        missing = []
        if live.store.head(codec.accepted_by_time(hour, ident)) is None:
            missing.append("accepted-by-time")
        if live.store.head(codec.accepted_by_blob(m.frame_sha256, ident)) is None:
            missing.append("accepted-by-blob")
        out = []
        head = live.store.head(m.raw_blob_key)
        if head is None and m.raw_blob_key in gc_marked:
            pass  # GC's settle restores a referenced blob it marked (§15): not missing
        elif head is None:  # held: GC may have marked it since the marks were read (run_audit reads again)
            out.append({**base, "category": "integrity", "missing": "", "detail": "blob missing, hour not tombstoned",
                        "held_blob": m.raw_blob_key})
        elif head.size != m.frame_bytes:
            out.append({**base, "category": "integrity", "missing": "",
                        "detail": f"blob is {head.size} bytes, the record says {m.frame_bytes}"})
        else:
            blob_hour = UtcHour((int(head.last_modified_unix_s) // 3600) * 3600)
            if live.store.head(codec.raw_blobs_by_time(blob_hour, m.frame_sha256)) is None:
                missing.append("raw-blobs-by-time")
        if missing:
            out.append({**base, "category": "repair", "missing": ",".join(missing), "detail": "accepted"})
        return out

    return check


def _check_quarantine(access: S3Access) -> Any:
    def check(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = _Live(access)
        ident = _identity(row["agent"], row["boot"], row["s"], row["e"])
        if live.store.head(row["key"]) is None:
            return []
        if live.store.head(live.codec.quarantine_by_blob(row["sha"], ident)) is not None:
            return []
        return [{"category": "repair", "manifest_key": row["key"], "manifest_id": ident.manifest_id,
                 "frame_sha256": row["sha"], "accepted_hour": "", "missing": "quarantine-by-blob",
                 "blob_key": live.codec.raw_blob(row["sha"]), "detail": "quarantine"}]

    return check


DERIVED_COLUMNS = ["entry_key", "entry_kind", "source_key", "detail"]


def _check_derived(access: S3Access, gc_marked: frozenset[str] = frozenset()) -> Any:
    def check(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = _Live(access)
        if live.store.head(row["source_key"]) is not None:
            return []  # the source exists now (inventory lag)
        if row["entry_kind"] == "raw-blobs-by-time" and row["source_key"] in gc_marked:
            return []  # GC marked the blob; its settle deletes the entry with it (§15)
        if row["entry_kind"] == "raw-blobs-by-time":
            raw = live.store.get(row["entry_key"])
            if raw is None:
                return []
            try:
                doc = json.loads(raw)
                if doc.get("agent_hex") and doc.get("boot_hex") and doc.get("seq_start") is not None:
                    ident = _identity(doc["agent_hex"], doc["boot_hex"], doc["seq_start"], doc["seq_end"])
                    m = live.manifest(live.codec.accepted(ident))
                    if isinstance(m, AcceptedBatchManifest) and live.tombstoned(UtcHour.of_unix_ns(m.accepted_at_unix_ns)):
                        return []  # retention reaped the blob; its entry goes with the hour
            except (ValueError, KeyError, TypeError):
                pass
        elif live.store.head(row["entry_key"]) is None:
            return []
        held = {"held_blob": row["source_key"], "held_entry": row["entry_key"]} \
            if row["entry_kind"] == "raw-blobs-by-time" else {}  # as for a missing blob, see run_audit
        return [{"entry_key": row["entry_key"], "entry_kind": row["entry_kind"], "source_key": row["source_key"],
                 "detail": "its source does not exist", **held}]

    return check


ORPHAN_COLUMNS = ["blob_key", "sha256", "size", "last_modified_unix_s", "agent_hex", "boot_hex", "seq_start", "seq_end",
                  "reason"]


def _check_orphan(access: S3Access, horizon_before_s: int) -> Any:
    def check(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = _Live(access)
        head = live.store.head(row["key"])
        if head is None or head.last_modified_unix_s >= horizon_before_s:
            return []  # collected since, or re-created (a late retry): not past the horizon
        md = head.metadata
        base = {"blob_key": row["key"], "sha256": row["sha"], "size": head.size,
                "last_modified_unix_s": int(head.last_modified_unix_s), "agent_hex": md.get("lm-agent-hex"),
                "boot_hex": md.get("lm-boot-hex"), "seq_start": md.get("lm-seq-start"), "seq_end": md.get("lm-seq-end")}
        try:
            ident = _identity(md["lm-agent-hex"], md["lm-boot-hex"], md["lm-seq-start"], md["lm-seq-end"])
        except Exception:
            return [{**base, "reason": "no identity metadata (GC reads the frame header)"}]
        m = live.manifest(live.codec.accepted(ident))
        if isinstance(m, str):
            return []  # a record this reader cannot read may name the blob: never a candidate (G2a)
        if isinstance(m, AcceptedBatchManifest) and m.frame_sha256 == row["sha"]:
            if live.tombstoned(UtcHour.of_unix_ns(m.accepted_at_unix_ns)):
                return [{**base, "reason": "its acceptance hour is tombstoned (retention)"}]
            return []  # referenced: not an orphan (its accepted-by-blob entry is on the repair list)
        if live.store.head(live.codec.quarantine(ident, row["sha"])) is not None:
            # Conflict evidence: kept until its conflict is resolved and the evidence window (the
            # retry horizon) has passed since (GC's check 3, docs/protocol.md §15 G3).
            resolution = live.store.head(live.codec.conflict_resolution(ident, row["sha"]))
            if not resolution_settles(resolution) or resolution.last_modified_unix_s >= horizon_before_s:
                return []
            return [{**base, "reason": "conflict evidence, resolved more than the evidence window ago"}]
        why = "no acceptance record" if m is None else "the acceptance record names another blob"
        return [{**base, "reason": f"{why}, no quarantine manifest"}]

    return check


OVERLAP_COLUMNS = ["first_key", "second_key", "first_range", "second_range", "detail"]


def _check_overlap(access: S3Access) -> Any:
    def check(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = _Live(access)
        if live.store.head(row["prev_key"]) is None or live.store.head(row["key"]) is None:
            return []
        return [{"first_key": row["prev_key"], "second_key": row["key"], "first_range": row["prev_range"],
                 "second_range": f"{int(row['s'])}-{int(row['e'])}",
                 "detail": "sequence ranges of one boot overlap (samples would be counted twice)"}]

    return check


# ------------------------------------------------------------------------------ the job

#: One schema for every candidate (the columns a check reads; null where its check has none).
CANDIDATE_COLUMNS = ["check", "cand", "key", "sha", "agent", "boot", "s", "e", "entry_key", "entry_kind", "source_key",
                     "prev_key", "prev_range"]
#: A confirmed finding: its category, its canonical-JSON line, and for a missing blob the keys
#: GC's marks are read again for (``held_blob``; ``held_entry`` for a ``raw-blobs-by-time`` entry).
FINDING_SCHEMA = "category string, doc string, held_blob string, held_entry string"
#: Rows per output part file: a category's rows are split over ceil(rows / this) files, each
#: written by its own task.
ROWS_PER_PART = 50_000


def _confirm(access: S3Access, gc_marked: frozenset[str], horizon_before_s: int) -> Any:
    """The live confirmation of every candidate, one function for all categories (one Python stage):
    ``row["check"]`` picks the check; each confirmed row becomes ``(category, canonical JSON line)``."""
    checks = {
        "manifest": (_check_manifest(access, gc_marked), None, MANIFEST_CHECK_COLUMNS),
        "quarantine": (_check_quarantine(access), None, MANIFEST_CHECK_COLUMNS),
        "derived": (_check_derived(access, gc_marked), "derived-without-source", DERIVED_COLUMNS),
        "orphan": (_check_orphan(access, horizon_before_s), "orphan-blob-candidates", ORPHAN_COLUMNS),
        "overlap": (_check_overlap(access), "overlapping-ranges", OVERLAP_COLUMNS),
    }

    def confirm(row: dict[str, Any]) -> list[dict[str, Any]]:
        check, category, columns = checks[row["check"]]
        return [{"category": category or found["category"],
                 "doc": canonical_json({c: found.get(c) for c in columns if c != "category"}).decode(),
                 "held_blob": found.get("held_blob"), "held_entry": found.get("held_entry")}
                for found in check(row)]

    return confirm


def _recheck_held(access: S3Access, marked_again: frozenset[str]) -> Any:
    """A missing blob, looked at again after GC's marks were read again: in the marks (GC holds it
    under its grace), current again (GC restored it), or its ``raw-blobs-by-time`` entry gone
    (GC purged both) — not a finding; otherwise the finding stands."""

    def recheck(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = _Live(access)
        if row["held_blob"] in marked_again or live.store.head(row["held_blob"]) is not None:
            return []
        if row["held_entry"] and live.store.head(row["held_entry"]) is None:
            return []
        return [row]

    return recheck


def _writer(access: S3Access, prefix_key: str, accumulator: Any) -> Any:
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


def _routes(spark: Any, partitions: int) -> list[int]:
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


def run_audit(
    spark: Any,
    inventory: Any,
    access: S3Access,
    *,
    run_id: str,
    now_s: int,
    retry_horizon_s: int,
    inventory_info: dict[str, Any] | None = None,
    workers: int = 16,
    gc_marked: frozenset[str] = frozenset(),
    progress: Any = None,
    rows_per_part: int = ROWS_PER_PART,
) -> AuditReport:
    """Run the audit over ``inventory`` (a DataFrame with the inventory columns) and write its outputs.

    ``gc_marked``: the blob keys GC has marked and not settled (:func:`gc_marked_blobs`), not
    missing; a blob found missing that is not among them is looked at again after GC's marks are
    read again (:meth:`MarkedBlobs.read_again`), since a GC run may have marked it meanwhile.
    ``rows_per_part``: the most rows of one output file (a category's files are written in
    parallel, one task each)."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    started = time.monotonic()
    last = [started]

    def mark(name: str) -> None:
        now = time.monotonic()
        report.phases[name] = report.phases.get(name, 0.0) + now - last[0]
        last[0] = now
        if progress is not None:
            progress(f"{name} done")

    codec = access.codec
    out_prefix = codec.audit_run(run_id)
    report = AuditReport(run_id, inventory_info or {}, output_prefix=out_prefix)
    acc = counter_accumulator(spark)
    ns = access.prefix
    marked_at_start = frozenset(gc_marked)  # shipped to executors: a plain set

    # Cached narrow: an identity's fields are the manifest-id's parts (with_identity), not stored twice.
    cl = classify(inventory, ns).select("kind", "key", "lm", "valid", "sha", "mid", "hour_s") \
        .persist(StorageLevel.MEMORY_AND_DISK)
    cached: list[Any] = [cl]
    try:
        stats = cl.groupBy("kind", "valid").count().collect()  # one row per kind: small
        for r in stats:
            kind = r["kind"] or "outside-layout"
            report.rows_scanned += r["count"]
            if r["valid"] or kind in ("other", "outside-layout"):
                report.keys_by_kind[kind] = report.keys_by_kind.get(kind, 0) + r["count"]
            else:
                report.unparsed[kind] = report.unparsed.get(kind, 0) + r["count"]
        ok = cl.where("valid")
        mark("classify")

        # The kinds that are few in a healthy bucket (quarantine, its index, tombstones): one scan
        # of the classified rows, then every join reads this small copy.
        few = ok.where(F.col("kind").isin("quarantine", "quarantine_by_blob", "tombstone")) \
            .select("kind", "key", "mid", "sha", "hour_s").persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(few)
        few.count()  # filled now, once: otherwise each join's stage would run into it at the same time

        def with_identity(df: Any) -> Any:
            """``df`` with agent, boot, s, e: the parts of its manifest-id ``agent.boot.s-e``."""
            parts = F.split("mid", r"\.")
            return df.withColumn("agent", F.element_at(parts, 1)).withColumn("boot", F.element_at(parts, 2)) \
                .withColumn("s", F.substring(F.element_at(parts, 3), 1, 20)) \
                .withColumn("e", F.substring(F.element_at(parts, 3), 22, 20))

        def of(kind: str, *cols: Any) -> Any:
            return with_identity(few.where(F.col("kind") == kind)).select(*cols)

        Q = of("quarantine", "key", "mid", "sha", "agent", "boot", "s", "e")
        QB = of("quarantine_by_blob", "key", "mid", "sha", "agent", "boot", "s", "e")
        TS = F.broadcast(few.where((F.col("kind") == "tombstone") & F.col("key").endswith("/tombstone.json"))
                         .select(F.col("hour_s").alias("th")).distinct())
        null_s, null_l = F.lit(None).cast("string"), F.lit(None).cast("long")

        def accepted_key(df: Any) -> Any:
            return F.concat(F.lit(ns + "accepted/v1/agent="), df["agent"], F.lit("/boot="), df["boot"], F.lit("/"),
                            df["s"], F.lit("-"), df["e"], F.lit(".json"))

        def blob_key(sha: Any) -> Any:
            return F.concat(F.lit(ns + "raw-blobs/v1/sha256/"), F.substring(sha, 1, 2), F.lit("/"),
                            F.substring(sha, 3, 2), F.lit("/"), sha, F.lit(".lmbatch"))

        def candidates(df: Any, check: str, **cols: Any) -> Any:
            """``df``'s rows in :data:`CANDIDATE_COLUMNS` (``cols``: name -> column; others null)."""
            return df.select(F.lit(check).alias("check"), *[
                (cols[c] if c in cols else F.col(c) if c in df.columns else null_s).cast("string").alias(c)
                for c in CANDIDATE_COLUMNS[1:]])

        # -- pass 1, by manifest-id: acceptance records vs accepted-by-time / accepted-by-blob -------
        by_mid = ok.where(F.col("kind").isin("accepted", "by_time", "by_blob")).groupBy("mid").agg(
            F.max(F.when(F.col("kind") == "accepted", 1).otherwise(0)).alias("a"),
            F.max(F.when(F.col("kind") == "by_time", 1).otherwise(0)).alias("t"),
            F.max(F.when(F.col("kind") == "by_blob", 1).otherwise(0)).alias("b"),
            F.first(F.when(F.col("kind") == "accepted", F.col("key")), ignorenulls=True).alias("a_key"),
            F.collect_list(F.when(F.col("kind") == "by_time", F.col("key"))).alias("t_keys"),
            F.collect_list(F.when(F.col("kind") == "by_blob", F.col("key"))).alias("b_keys"),
            F.min(F.when(F.col("kind") == "by_time", F.col("hour_s"))).alias("acc_hour"),
            F.first(F.when(F.col("kind") == "by_blob", F.col("sha")), ignorenulls=True).alias("sha"),
        ).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(by_mid)
        by_mid.count()  # filled once (four consumers below)
        by_mid = with_identity(by_mid)
        mid_repair = by_mid.where((F.col("a") == 1) & ((F.col("t") == 0) | (F.col("b") == 0))) \
            .select(F.col("a_key").alias("key"), "acc_hour", F.lit("repair").alias("cand"))

        # -- pass 2, by sha256: referenced blobs vs raw blobs / raw-blobs-by-time / quarantine-by-blob ----
        by_sha = (
            by_mid.where(F.col("b") == 1).select("sha", F.when(F.col("a") == 1, F.col("a_key")).alias("a_key"),
                                                  "acc_hour", F.lit("ref").alias("kind"), null_s.alias("key"),
                                                  null_l.alias("lm"), null_l.alias("hour_s"))
            .unionByName(ok.where(F.col("kind").isin("blob", "blob_by_time", "quarantine_by_blob")).select(
                "sha", null_s.alias("a_key"), null_l.alias("acc_hour"), "kind", "key", "lm", "hour_s"))
        ).groupBy("sha").agg(
            F.max(F.when(F.col("kind") == "ref", 1).otherwise(0)).alias("ref"),
            F.first("a_key", ignorenulls=True).alias("a_key"),
            F.min("acc_hour").alias("acc_hour"),
            F.max(F.when(F.col("kind") == "blob", 1).otherwise(0)).alias("r"),
            F.first(F.when(F.col("kind") == "blob", F.col("key")), ignorenulls=True).alias("r_key"),
            F.first(F.when(F.col("kind") == "blob", F.col("lm")), ignorenulls=True).alias("lm"),
            F.collect_list(F.when(F.col("kind") == "blob_by_time", F.struct("key", "hour_s"))).alias("rts"),
            F.max(F.when(F.col("kind") == "quarantine_by_blob", 1).otherwise(0)).alias("qb"),
        ).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(by_sha)
        by_sha.count()  # filled once (four consumers below)
        has_a = F.col("a_key").isNotNull()
        sha_repair = by_sha.where(has_a & (F.col("r") == 1) & (F.size("rts") == 0)) \
            .select(F.col("a_key").alias("key"), "acc_hour", F.lit("repair").alias("cand"))
        sha_integrity = by_sha.where(has_a & (F.col("r") == 0)) \
            .select(F.col("a_key").alias("key"), "acc_hour", F.lit("integrity").alias("cand"))

        # -- repair + integrity candidates: one row per acceptance record, tombstoned hours left out ----
        manifest_cands = mid_repair.unionByName(sha_repair).unionByName(sha_integrity) \
            .join(TS, F.col("acc_hour") == F.col("th"), "left_anti") \
            .groupBy("key").agg(F.concat_ws(",", F.array_sort(F.collect_set("cand"))).alias("cand"))
        q_missing = Q.join(F.broadcast(QB.select("mid", "sha")), ["mid", "sha"], "left_anti")

        # -- derived entries without their source ----------------------------------------------------
        no_a = by_mid.where(F.col("a") == 0)
        rt_gone = by_sha.where(F.col("r") == 0).select("sha", F.explode("rts").alias("rt")) \
            .join(TS, F.col("rt.hour_s") == F.col("th"), "left_anti")
        derived = (
            no_a.select(F.explode("t_keys").alias("entry_key"), F.lit("accepted-by-time").alias("entry_kind"),
                        accepted_key(no_a).alias("source_key"))
            .union(no_a.select(F.explode("b_keys"), F.lit("accepted-by-blob"), accepted_key(no_a)))
            .union(rt_gone.select(F.col("rt.key"), F.lit("raw-blobs-by-time"), blob_key(F.col("sha"))))
            .union(QB.join(F.broadcast(Q.select("mid", "sha")), ["mid", "sha"], "left_anti")
                   .select("key", F.lit("quarantine-by-blob"),
                           F.concat(F.lit(ns + "quarantine/v1/identity-conflict/agent="), F.col("agent"),
                                    F.lit("/boot="), F.col("boot"), F.lit("/"), F.col("s"), F.lit("-"), F.col("e"),
                                    F.lit("/"), F.col("sha"), F.lit(".json"))))
        )

        # -- orphan blobs past the retry horizon -------------------------------------------------------
        horizon_before = now_s - retry_horizon_s
        # Conflict evidence (named by quarantine-by-blob) too: a resolved one is collected (G3).
        orphans = by_sha.where((F.col("r") == 1) & (F.col("ref") == 0) & (F.col("lm") < horizon_before))

        # -- overlapping sequence ranges within one boot (records from pass 1: no new scan) ------------
        w = Window.partitionBy("agent", "boot").orderBy("sn", "en", "key").rowsBetween(Window.unboundedPreceding, -1)
        ranges = by_mid.where(F.col("a") == 1).select(
            F.col("a_key").alias("key"), "agent", "boot", F.col("s").cast("decimal(20,0)").alias("sn"),
            F.col("e").cast("decimal(20,0)").alias("en"), "s", "e")
        prev = ranges.withColumn("prev", F.max(F.struct("en", "key", "sn")).over(w))
        overlaps = prev.where(F.col("prev").isNotNull() & (F.col("sn") <= F.col("prev.en"))).select(
            "key", "s", "e", F.col("prev.key").alias("prev_key"),
            F.concat(F.col("prev.sn").cast("string"), F.lit("-"), F.col("prev.en").cast("string")).alias("prev_range"))

        # -- every candidate confirmed in one Python stage: (category, canonical JSON line) -------------
        all_candidates = (
            candidates(manifest_cands, "manifest")
            .union(candidates(q_missing, "quarantine", cand=F.lit("repair")))
            .union(candidates(derived, "derived", cand=F.lit("derived-without-source")))
            .union(candidates(orphans, "orphan", key=F.col("r_key"), cand=F.lit("orphan-blob-candidates")))
            .union(candidates(overlaps, "overlap", cand=F.lit("overlapping-ranges")))
        )
        # As many confirmation tasks as the session has cores (each runs `workers` requests at once),
        # not one per partition of every candidate source (dozens of mostly empty Python tasks).
        findings = all_candidates.coalesce(spark.sparkContext.defaultParallelism).mapInPandas(
            row_mapper(_confirm(access, marked_at_start, horizon_before), ["category", "doc", "held_blob", "held_entry"],
                       acc, workers=workers, tag="cand"), FINDING_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(findings)
        held = findings.where(F.col("held_blob").isNotNull()).count()
        if held:
            # GC may have marked a blob after the marks were read: read them again, after every HEAD
            # that found a blob missing, and look at those blobs once more (MarkedBlobs).
            again = frozenset(gc_marked.read_again()) if isinstance(gc_marked, MarkedBlobs) else marked_at_start
            rechecked = findings.where(F.col("held_blob").isNotNull()).mapInPandas(
                row_mapper(_recheck_held(access, again), ["category", "doc", "held_blob", "held_entry"], acc,
                           workers=workers), FINDING_SCHEMA)
            findings = findings.where(F.col("held_blob").isNull()).union(rechecked) \
                .persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(findings)
        counts = {r["category"]: int(r["count"]) for r in findings.groupBy("category").count().collect()}
        mark("join+confirm")

        # -- write the confirmed findings, then the summary (the commit point) -------------------------
        report.confirmed = {c: counts.get(c, 0) for c in CATEGORIES}
        report.files = {c: [] for c in CATEGORIES}
        parts = output_parts(counts, rows_per_part)
        total = sum(parts.values())
        if total:
            # Each (category, part) is one file and one task: a category's part is a hash of the line
            # (the same findings, the same files); Spark's own hash routes each to its partition.
            offset, first = 0, {}
            for category, n in parts.items():
                first[category] = offset
                offset += n
            routes = _routes(spark, total)
            part = F.expr("pmod(xxhash64(doc), n)")
            to_write = findings.join(F.broadcast(spark.createDataFrame(
                [(c, n, first[c]) for c, n in parts.items() if n], "category string, n long, first long")), "category") \
                .withColumn("part", part)
            # bigint, as in _routes: Spark hashes an int and a bigint of one value differently
            route = F.element_at(F.array(*[F.lit(r).cast("long") for r in routes]),
                                 (F.col("first") + F.col("part") + 1).cast("int"))
            written = to_write.repartition(total, route.alias("route")).select("category", "part", "doc").mapInPandas(
                _writer(access, out_prefix, acc), "category string, key string, rows long, outcome string, task int"
            ).collect()
            report.write_tasks = len({r["task"] for r in written})
            rows_written = {c: 0 for c in CATEGORIES}
            for r in written:
                report.files[r["category"]].append(r["key"])
                rows_written[r["category"]] += r["rows"]
            for files in report.files.values():
                files.sort()
            if rows_written != report.confirmed:  # the summary commits exactly what the files hold
                raise RuntimeError(f"audit {run_id}: rows written {rows_written} != confirmed {report.confirmed}")
        mark("write")
    finally:
        for df in cached:
            df.unpersist()
    counted = dict(acc.value)
    report.candidates = {c: counted.pop(f"candidate {c}", 0) for c in CATEGORIES}
    report.requests.add(counted)
    report.seconds = time.monotonic() - started
    report.summary_key = f"{out_prefix}summary.json"
    with task_tally() as tally:
        put_if_absent(access, report.summary_key, canonical_json(report.to_json()))
        # Then the run's commit marker (docs/protocol.md §15 G-B3): the scheduled GC takes the newest.
        put_if_absent(access, access.codec.audit_committed(int(now_s), run_id),
                      canonical_json({"schema": "lightmetrics.audit_committed.v1", "run_id": run_id,
                                      "summary_key": report.summary_key, "committed_at_unix_s": int(now_s)}))
    report.requests.add(tally)
    return report


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


__all__ = ["CATEGORIES", "AuditReport", "MarkedBlobs", "classify", "gc_marked_blobs", "output_parts", "read_findings",
           "run_audit"]
