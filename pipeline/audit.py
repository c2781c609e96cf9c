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
read once, from the control table, by the driver (at most the reap's pending pages of marks).

``orphan-blob-candidates``
    raw blobs older than ``LM_RETRY_HORIZON_S`` that no ``accepted-by-blob`` entry references
    (conflict evidence only once its conflict was resolved longer ago than the evidence window);
    the daily GC proves them (docs/protocol.md §15 G-B3). Confirmed with
    the GC proof (docs/protocol.md §15): HEAD of the blob (identity metadata, age), GET of the
    acceptance record at that identity, HEAD of the quarantine key. GC proves again at delete time.
``overlapping-ranges``
    acceptance records of one boot whose sequence ranges overlap (legal, but those samples would
    be counted twice). Confirmed by HEADs of both records.

Outputs go to ``audit/v1/run=<id>/<category>/part-NNNNN.jsonl`` (canonical JSON lines) by
conditional create, then ``audit/v1/run=<id>/summary.json`` last: the summary is the run's commit
point (readers ignore a run without one).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.errors import ManifestError
from lightmetrics.gc import resolution_settles
from lightmetrics.identity import BatchIdentity, hex_to_id
from lightmetrics.indexing import parse_record
from lightmetrics.keys import UtcHour
from lightmetrics.manifests import AcceptedBatchManifest, canonical_json

from pipeline.s3io import S3Access, Tally, counter_accumulator, put_if_absent, row_mapper, task_tally

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
            "s3_requests": self.requests.to_json(),
            "seconds": round(self.seconds, 2),
            "phase_seconds": {k: round(v, 2) for k, v in self.phases.items()},
            "output_prefix": self.output_prefix,
        }


# ------------------------------------------------------------------------------ classification


def _fields(kind: str, parts: Any) -> dict[str, Any]:
    """Field expressions of a *valid* key of ``kind`` (``parts`` = the key split on ``/``): once the
    kind's regular expression has matched, every field sits at a fixed place, so plain substrings
    extract it (one regex evaluation per key instead of one per field)."""
    from pyspark.sql import functions as F

    def part(i: int) -> Any:
        return F.element_at(parts, i)

    def after(i: int, skip: int) -> Any:  # "agent=6162" -> "6162"
        return F.expr(f"substring(element_at(parts, {i}), {skip + 1})")

    def seq(col: Any) -> tuple[Any, Any]:
        return F.substring(col, 1, 20), F.substring(col, 22, 20)

    if kind == "accepted":  # accepted/v1/agent=A/boot=B/S-E.json
        s, e = seq(part(5))
        return {"agent": after(3, 6), "boot": after(4, 5), "s": s, "e": e}
    if kind == "by_time":  # accepted-by-time/v1/date=D/hour=H/A.B.S-E.json
        mid = F.split(part(5), r"\.")
        s, e = seq(F.element_at(mid, 3))
        return {"date": after(3, 5), "hh": after(4, 5), "agent": F.element_at(mid, 1), "boot": F.element_at(mid, 2),
                "s": s, "e": e}
    if kind in ("by_blob", "quarantine_by_blob"):  # .../sha256/h1/h2/SHA/agent=A/boot=B/S-E.json
        s, e = seq(part(9))
        return {"sha": part(6), "agent": after(7, 6), "boot": after(8, 5), "s": s, "e": e}
    if kind == "blob":  # raw-blobs/v1/sha256/h1/h2/SHA.lmbatch
        return {"sha": F.substring(part(6), 1, 64)}
    if kind == "blob_by_time":  # raw-blobs-by-time/v1/date=D/hour=H/sha256=SHA.json
        return {"date": after(3, 5), "hh": after(4, 5), "sha": F.substring(part(5), 8, 64)}
    if kind == "quarantine":  # quarantine/v1/identity-conflict/agent=A/boot=B/S-E/SHA.json
        s, e = seq(part(6))
        return {"agent": after(4, 6), "boot": after(5, 5), "s": s, "e": e, "sha": F.substring(part(7), 1, 64)}
    if kind == "tombstone":  # retention/v1/raw/date=D/hour=H/tombstone.json
        return {"date": after(4, 5), "hh": after(5, 5)}
    raise ValueError(kind)


def classify(inventory: Any, prefix: str) -> Any:
    """Current, non-delete-marker rows of the namespace, one per key, with extracted fields.

    Columns: kind, key, size, lm (LastModified, unix s), valid, agent, boot, s, e, sha, mid, hour_s.
    The kind comes from the prefix, validity from the kind's regular expression (the key codec's
    layout, in Java syntax), the fields from fixed positions. JVM string functions only.
    """
    from pyspark.sql import functions as F

    cur = inventory.where(F.coalesce(F.col("is_latest"), F.lit(True)) & ~F.coalesce(F.col("is_delete_marker"), F.lit(False)))
    if prefix:
        cur = cur.where(F.col("key").startswith(prefix))
    cur = cur.select(F.col("key"), F.substring(F.col("key"), len(prefix) + 1, 1 << 20).alias("rel"),
                     F.col("size"), F.col("last_modified_date").cast("long").alias("lm"))
    kind = F.lit(None).cast("string")
    for pfx in OTHER_PREFIXES:
        kind = F.when(F.col("rel").startswith(pfx), F.lit("other")).otherwise(kind)
    for name, (pfx, _, _) in reversed(list(KINDS.items())):
        kind = F.when(F.col("rel").startswith(pfx), F.lit(name)).otherwise(kind)
    cur = cur.withColumn("kind", kind).withColumn("parts", F.split("rel", "/"))
    valid = F.lit(False)
    for name, (_, pattern, _) in KINDS.items():
        valid = F.when(F.col("kind") == name, F.col("rel").rlike(pattern)).otherwise(valid)
    cur = cur.withColumn("valid", valid)
    names = ("agent", "boot", "s", "e", "sha", "date", "hh")
    exprs = {}
    for f in names:
        expr = F.lit("")
        for kind_name in KINDS:
            got = _fields(kind_name, F.col("parts")).get(f)
            if got is not None:
                expr = F.when(F.col("valid") & (F.col("kind") == kind_name), got).otherwise(expr)
        exprs[f] = expr
    cur = cur.select("kind", "key", "size", "lm", "valid", F.col("parts"), *[v.alias(k) for k, v in exprs.items()])
    mid = F.when(F.col("agent") != "", F.concat_ws(".", "agent", "boot", F.concat("s", F.lit("-"), "e")))
    hour_s = F.when(F.col("date") != "", F.unix_timestamp(F.concat_ws(" ", "date", "hh"), "yyyy-MM-dd HH"))
    return cur.withColumn("mid", mid).withColumn("hour_s", hour_s).drop("date", "hh", "parts")


# ------------------------------------------------------------------------------ confirmation


def gc_marked_blobs(table: Any, codec: Any) -> frozenset[str]:
    """The blob keys in GC's recorded marks (intents and marks not yet settled, docs/protocol.md
    §15): one Query of the reap's checkpoint items."""
    from lightmetrics.reap.marks import read_marks_items

    return frozenset(m["key"] for item in read_marks_items(table, codec) for m in item["marks"])


def _identity(agent_hex: str, boot_hex: str, s: Any, e: Any) -> BatchIdentity:
    return BatchIdentity.create(hex_to_id(agent_hex), hex_to_id(boot_hex), int(s), int(e))


class _Live:
    """Live reads inside an executor (one per task; tombstone HEADs cached per hour)."""

    def __init__(self, access: S3Access) -> None:
        from pipeline import s3io

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
        elif head is None:
            out.append({**base, "category": "integrity", "missing": "", "detail": "blob missing, hour not tombstoned"})
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
        return [{"entry_key": row["entry_key"], "entry_kind": row["entry_kind"], "source_key": row["source_key"],
                 "detail": "its source does not exist"}]

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


def _schema(columns: list[str], ints: tuple[str, ...] = ()) -> str:
    return ", ".join(f"`{c}` {'long' if c in ints else 'string'}" for c in columns)


def _writer(access: S3Access, prefix_key: str, accumulator: Any) -> Any:
    """``mapInPandas``: this partition's documents of each category as one JSON-lines file."""

    def write(batches: Any) -> Any:
        import pandas as pd
        from pyspark import TaskContext

        from pipeline import s3io

        by_category: dict[str, list[bytes]] = {}
        for pdf in batches:
            for category, doc in zip(pdf["category"], pdf["doc"]):
                by_category.setdefault(category, []).append(canonical_json(json.loads(doc)) + b"\n")
        part = TaskContext.get().partitionId()
        out = []
        with s3io.task_tally() as tally:
            for category, lines in sorted(by_category.items()):
                key = f"{prefix_key}{category}/part-{part:05d}.jsonl"
                outcome = s3io.put_if_absent(access, key, b"".join(sorted(lines)), content_type="application/x-ndjson")
                out.append((category, key, len(lines), outcome))
        accumulator.add(tally.counts)
        if out:
            yield pd.DataFrame(out, columns=["category", "key", "rows", "outcome"])

    return write


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
) -> AuditReport:
    """Run the audit over ``inventory`` (a DataFrame with the inventory columns) and write its outputs.
    ``gc_marked``: the blob keys GC has marked and not settled (:func:`gc_marked_blobs`), not missing."""
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

    cl = classify(inventory, ns).persist(StorageLevel.MEMORY_AND_DISK)
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

        def of(kind: str, *cols: Any) -> Any:
            return ok.where(F.col("kind") == kind).select(*cols)

        A = of("accepted", "key", "mid", "agent", "boot", "s", "e")
        Q = of("quarantine", "key", "mid", "sha", "agent", "boot", "s", "e")
        QB = of("quarantine_by_blob", "key", "mid", "sha", "agent", "boot", "s", "e")
        TS = F.broadcast(ok.where((F.col("kind") == "tombstone") & F.col("key").endswith("/tombstone.json"))
                         .select(F.col("hour_s").alias("th")).distinct())
        null_s, null_l = F.lit(None).cast("string"), F.lit(None).cast("long")

        def accepted_key(df: Any) -> Any:
            return F.concat(F.lit(ns + "accepted/v1/agent="), df["agent"], F.lit("/boot="), df["boot"], F.lit("/"),
                            df["s"], F.lit("-"), df["e"], F.lit(".json"))

        def blob_key(sha: Any) -> Any:
            return F.concat(F.lit(ns + "raw-blobs/v1/sha256/"), F.substring(sha, 1, 2), F.lit("/"),
                            F.substring(sha, 3, 2), F.lit("/"), sha, F.lit(".lmbatch"))

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
            F.first("agent").alias("agent"), F.first("boot").alias("boot"), F.first("s").alias("s"),
            F.first("e").alias("e"),
        ).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(by_mid)
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
        has_a = F.col("a_key").isNotNull()
        sha_repair = by_sha.where(has_a & (F.col("r") == 1) & (F.size("rts") == 0)) \
            .select(F.col("a_key").alias("key"), "acc_hour", F.lit("repair").alias("cand"))
        sha_integrity = by_sha.where(has_a & (F.col("r") == 0)) \
            .select(F.col("a_key").alias("key"), "acc_hour", F.lit("integrity").alias("cand"))

        # -- repair + integrity candidates: one row per acceptance record, tombstoned hours left out ----
        manifest_cands = mid_repair.unionByName(sha_repair).unionByName(sha_integrity) \
            .join(TS, F.col("acc_hour") == F.col("th"), "left_anti") \
            .groupBy("key").agg(F.concat_ws(",", F.array_sort(F.collect_set("cand"))).alias("cand"))
        checked = manifest_cands.mapInPandas(
            row_mapper(_check_manifest(access, gc_marked), MANIFEST_CHECK_COLUMNS, acc, workers=workers, tag="cand"),
            _schema(MANIFEST_CHECK_COLUMNS))
        q_missing = Q.join(QB.select("mid", "sha"), ["mid", "sha"], "left_anti")
        q_checked = q_missing.select("key", "sha", "agent", "boot", "s", "e", F.lit("repair").alias("cand")).mapInPandas(
            row_mapper(_check_quarantine(access), MANIFEST_CHECK_COLUMNS, acc, workers=workers, tag="cand"),
            _schema(MANIFEST_CHECK_COLUMNS))
        manifest_findings = checked.union(q_checked)

        # -- derived entries without their source ----------------------------------------------------
        no_a = by_mid.where(F.col("a") == 0)
        rt_gone = by_sha.where(F.col("r") == 0).select("sha", F.explode("rts").alias("rt")) \
            .join(TS, F.col("rt.hour_s") == F.col("th"), "left_anti")
        derived = (
            no_a.select(F.explode("t_keys").alias("entry_key"), F.lit("accepted-by-time").alias("entry_kind"),
                        accepted_key(no_a).alias("source_key"))
            .union(no_a.select(F.explode("b_keys"), F.lit("accepted-by-blob"), accepted_key(no_a)))
            .union(rt_gone.select(F.col("rt.key"), F.lit("raw-blobs-by-time"), blob_key(F.col("sha"))))
            .union(QB.join(Q.select("mid", "sha"), ["mid", "sha"], "left_anti")
                   .select("key", F.lit("quarantine-by-blob"),
                           F.concat(F.lit(ns + "quarantine/v1/identity-conflict/agent="), F.col("agent"),
                                    F.lit("/boot="), F.col("boot"), F.lit("/"), F.col("s"), F.lit("-"), F.col("e"),
                                    F.lit("/"), F.col("sha"), F.lit(".json"))))
            .withColumn("cand", F.lit("derived-without-source"))
        )
        derived_findings = derived.mapInPandas(
            row_mapper(_check_derived(access, gc_marked), DERIVED_COLUMNS, acc, workers=workers, tag="cand"),
            _schema(DERIVED_COLUMNS))

        # -- orphan blobs past the retry horizon -------------------------------------------------------
        horizon_before = now_s - retry_horizon_s
        # Conflict evidence (named by quarantine-by-blob) too: a resolved one is collected (G3).
        orphans = by_sha.where((F.col("r") == 1) & (F.col("ref") == 0) & (F.col("lm") < horizon_before))
        orphan_findings = orphans.select(F.col("r_key").alias("key"), "sha",
                                         F.lit("orphan-blob-candidates").alias("cand")).mapInPandas(
            row_mapper(_check_orphan(access, horizon_before), ORPHAN_COLUMNS, acc, workers=workers, tag="cand"),
            _schema(ORPHAN_COLUMNS, ints=("size", "last_modified_unix_s")))

        # -- overlapping sequence ranges within one boot ------------------------------------------------
        w = Window.partitionBy("agent", "boot").orderBy("sn", "en", "key").rowsBetween(Window.unboundedPreceding, -1)
        ranges = A.select("key", "agent", "boot", F.col("s").cast("decimal(20,0)").alias("sn"),
                          F.col("e").cast("decimal(20,0)").alias("en"), "s", "e")
        prev = ranges.withColumn("prev", F.max(F.struct("en", "key", "sn")).over(w))
        overlaps = prev.where(F.col("prev").isNotNull() & (F.col("sn") <= F.col("prev.en"))).select(
            "key", "s", "e", F.col("prev.key").alias("prev_key"),
            F.concat(F.col("prev.sn").cast("string"), F.lit("-"), F.col("prev.en").cast("string")).alias("prev_range"),
            F.lit("overlapping-ranges").alias("cand"))
        overlap_findings = overlaps.mapInPandas(
            row_mapper(_check_overlap(access), OVERLAP_COLUMNS, acc, workers=workers, tag="cand"),
            _schema(OVERLAP_COLUMNS))

        # -- one DataFrame of confirmed findings: (category, document) ----------------------------------
        def docs(df: Any, category: Any, cols: list[str]) -> Any:
            return df.select(category.alias("category"), F.to_json(F.struct(*cols), {"ignoreNullFields": "false"}).alias("doc"))

        findings = (
            docs(manifest_findings, F.col("category"), [c for c in MANIFEST_CHECK_COLUMNS if c != "category"])
            .union(docs(derived_findings, F.lit("derived-without-source"), DERIVED_COLUMNS))
            .union(docs(orphan_findings, F.lit("orphan-blob-candidates"), ORPHAN_COLUMNS))
            .union(docs(overlap_findings, F.lit("overlapping-ranges"), OVERLAP_COLUMNS))
        ).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counts = {r["category"]: int(r["count"]) for r in findings.groupBy("category").count().collect()}
            mark("join+confirm")
            # -- write the confirmed findings, then the summary (the commit point) -------------------
            report.confirmed = {c: counts.get(c, 0) for c in CATEGORIES}
            report.files = {c: [] for c in CATEGORIES}
            total = sum(counts.values())
            if total:
                parts = max(1, min(64, math.ceil(total / 200_000)))
                written = findings.repartition(parts, "category").mapInPandas(
                    _writer(access, out_prefix, acc), "category string, key string, rows long, outcome string").collect()
                for r in written:
                    report.files[r["category"]].append(r["key"])
                for files in report.files.values():
                    files.sort()
            mark("write")
        finally:
            findings.unpersist()
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
    from pipeline import s3io

    st = s3io.store(access)
    prefix = access.codec.audit_run(run_id)
    if st.head(f"{prefix}summary.json") is None:
        raise FileNotFoundError(f"audit run {run_id} has no summary (not committed)")
    rows = []
    for key, _ in s3io.list_all(access, f"{prefix}{category}/")[0]:
        body = st.get(key) or b""
        rows.extend(json.loads(line) for line in body.splitlines() if line.strip())
    return rows


__all__ = ["CATEGORIES", "AuditReport", "classify", "read_findings", "run_audit"]
