"""The audit's candidate selection, in Spark SQL: which keys *may* break a rule of the invariant
catalogue (:mod:`lightmetrics.operator_tools.invariants`), found by joins over the classified inventory.

Inventory lags and has no content, so nothing here decides: every candidate row names the check
(``lightmetrics_pipeline.audit.confirm``) that confirms it with live requests and the catalogue's predicate.
The queries, and the rule each is for:

=====================  ===================================================  ==============================
candidate query        what it selects                                      rule (confirmation)
=====================  ===================================================  ==============================
``manifest``           a record without ``accepted-by-time`` /              ``missing-derived``,
                       ``accepted-by-blob``, or whose blob has no           ``blob-missing``, ``blob-size``
                       ``raw-blobs-by-time`` entry, or whose blob is        (``check_manifest``)
                       absent — hours with a tombstone left out
``quarantine``         a quarantine manifest without ``quarantine-by-blob``  ``missing-derived``
``derived``            a derived entry whose source key is absent (blobs    ``derived-without-source``
                       of tombstoned hours left out)
``orphan``             a raw blob past the retry horizon no                 ``orphan-blob``
                       ``accepted-by-blob`` names
``overlap``            a boot's record whose range starts at or before the  ``overlapping-ranges``
                       end of those before it
=====================  ===================================================  ==============================

Two aggregations carry the joins, each cached once and read by its consumers: by manifest-id
(records vs ``accepted-by-time`` / ``accepted-by-blob``) and by sha256 (referenced blobs vs raw
blobs, ``raw-blobs-by-time``, ``quarantine-by-blob``). Nothing collects a key set on the driver.
"""

from __future__ import annotations

from typing import Any

from lightmetrics.protocol.keys import KeyCodec, KeyKind
from lightmetrics_pipeline.audit.confirm import CANDIDATE_COLUMNS


class _Sql:
    """Column helpers over one namespace ``ns``."""

    def __init__(self, ns: str) -> None:
        from pyspark.sql import functions as F

        self.F, self.ns = F, ns
        codec = KeyCodec(ns)  # the keys' roots; the rest of each key is spelled in SQL below
        self.accepted_agents = codec.accepted_root() + "agent="
        self.blob_shas = codec.root(KeyKind.RAW_BLOB) + "sha256/"
        self.quarantine_agents = codec.quarantine_root() + "agent="
        self.null_s, self.null_l = F.lit(None).cast("string"), F.lit(None).cast("long")

    def with_identity(self, df: Any) -> Any:
        """``df`` with agent, boot, s, e: the parts of its manifest-id ``agent.boot.s-e``."""
        F = self.F
        parts = F.split("mid", r"\.")
        return df.withColumn("agent", F.element_at(parts, 1)).withColumn("boot", F.element_at(parts, 2)) \
            .withColumn("s", F.substring(F.element_at(parts, 3), 1, 20)) \
            .withColumn("e", F.substring(F.element_at(parts, 3), 22, 20))

    def accepted_key(self, df: Any) -> Any:
        F = self.F
        return F.concat(F.lit(self.accepted_agents), df["agent"], F.lit("/boot="), df["boot"], F.lit("/"),
                        df["s"], F.lit("-"), df["e"], F.lit(".json"))

    def blob_key(self, sha: Any) -> Any:
        F = self.F
        return F.concat(F.lit(self.blob_shas), F.substring(sha, 1, 2), F.lit("/"),
                        F.substring(sha, 3, 2), F.lit("/"), sha, F.lit(".lmbatch"))

    def quarantine_key(self) -> Any:
        F = self.F
        return F.concat(F.lit(self.quarantine_agents), F.col("agent"),
                        F.lit("/boot="), F.col("boot"), F.lit("/"), F.col("s"), F.lit("-"), F.col("e"),
                        F.lit("/"), F.col("sha"), F.lit(".json"))

    def candidates(self, df: Any, check: str, **cols: Any) -> Any:
        """``df``'s rows in :data:`CANDIDATE_COLUMNS` (``cols``: name -> column; others null)."""
        F = self.F
        return df.select(F.lit(check).alias("check"), *[
            (cols[c] if c in cols else F.col(c) if c in df.columns else self.null_s).cast("string").alias(c)
            for c in CANDIDATE_COLUMNS[1:]])


def _by_mid(ok: Any) -> Any:
    """Pass 1, by manifest-id: acceptance records vs accepted-by-time / accepted-by-blob."""
    from pyspark.sql import functions as F

    return ok.where(F.col("kind").isin("accepted", "by_time", "by_blob")).groupBy("mid").agg(
        F.max(F.when(F.col("kind") == "accepted", 1).otherwise(0)).alias("a"),
        F.max(F.when(F.col("kind") == "by_time", 1).otherwise(0)).alias("t"),
        F.max(F.when(F.col("kind") == "by_blob", 1).otherwise(0)).alias("b"),
        F.first(F.when(F.col("kind") == "accepted", F.col("key")), ignorenulls=True).alias("a_key"),
        F.collect_list(F.when(F.col("kind") == "by_time", F.col("key"))).alias("t_keys"),
        F.collect_list(F.when(F.col("kind") == "by_blob", F.col("key"))).alias("b_keys"),
        F.min(F.when(F.col("kind") == "by_time", F.col("hour_s"))).alias("acc_hour"),
        F.first(F.when(F.col("kind") == "by_blob", F.col("sha")), ignorenulls=True).alias("sha"),
    )


def _by_sha(sql: _Sql, by_mid: Any, ok: Any) -> Any:
    """Pass 2, by sha256: referenced blobs vs raw blobs / raw-blobs-by-time / quarantine-by-blob."""
    F, null_s, null_l = sql.F, sql.null_s, sql.null_l
    return (
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
    )


def _manifest_candidates(sql: _Sql, by_mid: Any, by_sha: Any, tombstones: Any) -> Any:
    """For ``missing-derived`` and ``blob-missing`` / ``blob-size``: one row per acceptance record
    (``cand``: which it may be), hours with a tombstone left out (the retention exemption; the
    confirmation applies it again, live)."""
    F = sql.F
    mid_repair = by_mid.where((F.col("a") == 1) & ((F.col("t") == 0) | (F.col("b") == 0))) \
        .select(F.col("a_key").alias("key"), "acc_hour", F.lit("repair").alias("cand"))
    has_a = F.col("a_key").isNotNull()
    sha_repair = by_sha.where(has_a & (F.col("r") == 1) & (F.size("rts") == 0)) \
        .select(F.col("a_key").alias("key"), "acc_hour", F.lit("repair").alias("cand"))
    sha_integrity = by_sha.where(has_a & (F.col("r") == 0)) \
        .select(F.col("a_key").alias("key"), "acc_hour", F.lit("integrity").alias("cand"))
    return mid_repair.unionByName(sha_repair).unionByName(sha_integrity) \
        .join(tombstones, F.col("acc_hour") == F.col("th"), "left_anti") \
        .groupBy("key").agg(F.concat_ws(",", F.array_sort(F.collect_set("cand"))).alias("cand"))


def _derived_candidates(sql: _Sql, by_mid: Any, by_sha: Any, q: Any, qb: Any, tombstones: Any) -> Any:
    """For ``derived-without-source``: derived entries whose source key is absent (a blob of a
    tombstoned hour left out: reaped)."""
    F = sql.F
    no_a = by_mid.where(F.col("a") == 0)
    rt_gone = by_sha.where(F.col("r") == 0).select("sha", F.explode("rts").alias("rt")) \
        .join(tombstones, F.col("rt.hour_s") == F.col("th"), "left_anti")
    return (
        no_a.select(F.explode("t_keys").alias("entry_key"), F.lit("accepted-by-time").alias("entry_kind"),
                    sql.accepted_key(no_a).alias("source_key"))
        .union(no_a.select(F.explode("b_keys"), F.lit("accepted-by-blob"), sql.accepted_key(no_a)))
        .union(rt_gone.select(F.col("rt.key"), F.lit("raw-blobs-by-time"), sql.blob_key(F.col("sha"))))
        .union(qb.join(F.broadcast(q.select("mid", "sha")), ["mid", "sha"], "left_anti")
               .select("key", F.lit("quarantine-by-blob"), sql.quarantine_key()))
    )


def _overlap_candidates(by_mid: Any) -> Any:
    """For ``overlapping-ranges``: records of one boot (from pass 1: no new scan) whose range starts
    at or before the highest end of those sorted before it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("agent", "boot").orderBy("sn", "en", "key").rowsBetween(Window.unboundedPreceding, -1)
    ranges = by_mid.where(F.col("a") == 1).select(
        F.col("a_key").alias("key"), "agent", "boot", F.col("s").cast("decimal(20,0)").alias("sn"),
        F.col("e").cast("decimal(20,0)").alias("en"), "s", "e")
    prev = ranges.withColumn("prev", F.max(F.struct("en", "key", "sn")).over(w))
    return prev.where(F.col("prev").isNotNull() & (F.col("sn") <= F.col("prev.en"))).select(
        "key", "s", "e", F.col("prev.key").alias("prev_key"),
        F.concat(F.col("prev.sn").cast("string"), F.lit("-"), F.col("prev.en").cast("string")).alias("prev_range"))


def candidate_rows(ok: Any, ns: str, horizon_before_s: int, cached: list[Any]) -> Any:
    """Every candidate of every rule, in :data:`CANDIDATE_COLUMNS`, from the valid classified rows
    ``ok``. The DataFrames this caches are appended to ``cached`` (the caller unpersists them)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    sql = _Sql(ns)
    # The kinds that are few in a healthy bucket (quarantine, its index, tombstones): one scan
    # of the classified rows, then every join reads this small copy.
    few = ok.where(F.col("kind").isin("quarantine", "quarantine_by_blob", "tombstone")) \
        .select("kind", "key", "mid", "sha", "hour_s").persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(few)
    few.count()  # filled now, once: otherwise each join's stage would run into it at the same time

    def of(kind: str) -> Any:
        return sql.with_identity(few.where(F.col("kind") == kind)).select("key", "mid", "sha", "agent", "boot", "s", "e")

    q, qb = of("quarantine"), of("quarantine_by_blob")
    tombstones = F.broadcast(few.where((F.col("kind") == "tombstone") & F.col("key").endswith("/tombstone.json"))
                             .select(F.col("hour_s").alias("th")).distinct())
    by_mid = _by_mid(ok).persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(by_mid)
    by_mid.count()  # filled once (four consumers below)
    by_mid = sql.with_identity(by_mid)
    by_sha = _by_sha(sql, by_mid, ok).persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(by_sha)
    by_sha.count()  # filled once (four consumers below)
    # Conflict evidence (named by quarantine-by-blob) too: a resolved one is collected (G3).
    orphans = by_sha.where((F.col("r") == 1) & (F.col("ref") == 0) & (F.col("lm") < horizon_before_s))
    return (
        sql.candidates(_manifest_candidates(sql, by_mid, by_sha, tombstones), "manifest")
        .union(sql.candidates(q.join(F.broadcast(qb.select("mid", "sha")), ["mid", "sha"], "left_anti"), "quarantine",
                              cand=F.lit("repair")))
        .union(sql.candidates(_derived_candidates(sql, by_mid, by_sha, q, qb, tombstones), "derived",
                              cand=F.lit("derived-without-source")))
        .union(sql.candidates(orphans, "orphan", key=F.col("r_key"), cand=F.lit("orphan-blob-candidates")))
        .union(sql.candidates(_overlap_candidates(by_mid), "overlap", cand=F.lit("overlapping-ranges")))
    )


__all__ = ["candidate_rows"]
