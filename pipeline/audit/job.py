"""The inventory audit: the reconciler's comparison at inventory scale, with Spark.

Input: an S3 Inventory report of the authority bucket (all versions; only current versions that
are not delete markers count as present). Inventory has no user metadata and no content, so
identities come from keys: every layout key is classified and its fields (manifest-id, sha256,
hour) extracted with Spark SQL regular expressions, and every finding is a DataFrame join —
nothing collects a key set on the driver (a test runs it with ``spark.driver.maxResultSize=1m``
on a million keys).

Findings (candidates from the joins, :mod:`lightmetrics_pipeline.audit.candidates`; each is then **confirmed
with live requests** inside the executors, because inventory lags — only confirmed findings are
written). The confirmation (:mod:`lightmetrics_pipeline.audit.confirm`) decides with the predicates of the one
invariant catalogue, :mod:`lightmetrics.operator_tools.invariants`, and every finding line carries its ``rule``
(the name ``lmctl verify`` and the ledger use); the categories below are the output folders, named
for their consumers (a normative format, docs/pipeline.md §3):

``repair`` (rule ``missing-derived``)
    an acceptance record without its ``accepted-by-time`` / ``accepted-by-blob`` entry, or whose
    blob has no ``raw-blobs-by-time`` entry; a quarantine manifest without ``quarantine-by-blob``.
    Confirmed by GET of the record and HEADs of the exact derived keys (hours tombstoned by
    retention are skipped: nothing is re-created under a tombstone). The walk consumes it.
``derived-without-source`` (rule ``derived-without-source``)
    a derived entry whose source does not exist (accepted-by-time/-by-blob without the record,
    raw-blobs-by-time without the blob, quarantine-by-blob without the quarantine manifest).
    Confirmed by a HEAD of the source (and, for a blob, the reaped state is not a violation).
``integrity`` (rules ``blob-missing``, ``blob-size``)
    an acceptance record whose blob is missing (or has another size) outside a tombstoned hour.
    Confirmed by GET of the record, HEAD of the blob and of the hour's tombstone.
A missing blob that GC has marked is **in GC's hands** (docs/protocol.md §15: the intent is
recorded in the reap's ``marks#`` items before the delete marker; the settle purges it or, if it is
referenced, restores it): neither ``integrity`` nor ``derived-without-source``. The marked keys are
read from the control table by the driver (at most the reap's pending pages of marks) at the start,
and again once the candidates are confirmed for the blobs found missing — a GC run may have marked
them meanwhile (:class:`MarkedBlobs`).

``orphan-blob-candidates`` (rule ``orphan-blob``)
    raw blobs older than ``LM_RETRY_HORIZON_S`` that no ``accepted-by-blob`` entry references
    (conflict evidence only once its conflict was resolved longer ago than the evidence window);
    the daily GC proves them (docs/protocol.md §15 G-B3). Confirmed with
    the GC proof (docs/protocol.md §15): HEAD of the blob (identity metadata, age), GET of the
    acceptance record at that identity, HEAD of the quarantine key. GC proves again at delete time.
``overlapping-ranges`` (rule ``overlapping-ranges``)
    acceptance records of one boot whose sequence ranges overlap (legal, but those samples would
    be counted twice). Confirmed by HEADs of both records.

Outputs go to ``audit/v1/run=<id>/<category>/part-NNNNN.jsonl`` (canonical JSON lines, at most
``ROWS_PER_PART`` per file, each file written by its own task) by conditional create, then
``audit/v1/run=<id>/summary.json`` last: the summary is the run's commit point (readers ignore a
run without one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.operator_tools.audit_watermarks import plan_watermarks
from lightmetrics.protocol.manifests import canonical_json
from lightmetrics_pipeline.audit.candidates import candidate_rows
from lightmetrics_pipeline.audit.classify import KINDS, classify
from lightmetrics_pipeline.audit.confirm import (
    FINDING_COLUMNS,
    FINDING_SCHEMA,
    UNREADABLE,
    MarkedBlobs,
    check_orphan,
    confirm,
    gc_marked_blobs,
    recheck_held,
)
from lightmetrics_pipeline.audit.output import ROWS_PER_PART, output_parts, read_findings, write_findings
from lightmetrics_pipeline.audit.watermarks import missing_by_index
from lightmetrics_pipeline.s3io import S3Access, Tally, counter_accumulator, put_if_absent, row_mapper, task_tally

#: The output folders (categories), one per consumer; lightmetrics_pipeline.audit.confirm.CATEGORY_OF_RULE says
#: which rules each holds.
CATEGORIES = ("repair", "derived-without-source", "integrity", "orphan-blob-candidates", "overlapping-ranges")


@dataclass
class AuditReport:
    run_id: str
    inventory: dict[str, Any]
    rows_scanned: int = 0
    keys_by_kind: dict[str, int] = field(default_factory=dict)
    unparsed: dict[str, int] = field(default_factory=dict)
    candidates: dict[str, int] = field(default_factory=dict)
    confirmed: dict[str, int] = field(default_factory=dict)
    confirmed_by_rule: dict[str, int] = field(default_factory=dict)  # the catalogue's names
    files: dict[str, list[str]] = field(default_factory=dict)
    requests: Tally = field(default_factory=Tally)
    seconds: float = 0.0
    summary_key: str = ""
    output_prefix: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    write_tasks: int = 0
    #: the completeness watermarks this run proves (docs/protocol.md §13 W6): inventory time, proved, withheld
    watermarks: dict[str, Any] = field(default_factory=dict)

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
            "confirmed_by_rule": self.confirmed_by_rule,
            "files": self.files,
            "write_tasks": self.write_tasks,
            "s3_requests": self.requests.to_json(),
            "seconds": round(self.seconds, 2),
            "phase_seconds": {k: round(v, 2) for k, v in self.phases.items()},
            "output_prefix": self.output_prefix,
            "watermarks": self.watermarks,
        }


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
    settle_s: int | None = None,
) -> AuditReport:
    """Run the audit over ``inventory`` (a DataFrame with the inventory columns) and write its outputs.

    ``gc_marked``: the blob keys GC has marked and not settled (:func:`gc_marked_blobs`), not
    missing; a blob found missing that is not among them is looked at again after GC's marks are
    read again (:meth:`MarkedBlobs.read_again`), since a GC run may have marked it meanwhile.
    ``rows_per_part``: the most rows of one output file (a category's files are written in
    parallel, one task each). ``settle_s`` (``LM_SETTLE_S``): plan the watermarks this run proves
    into its summary (:func:`plan_watermarks`; the job applies them once the summary is committed)."""
    from pyspark import StorageLevel
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

    # Cached narrow: an identity's fields are the manifest-id's parts, not stored twice.
    cl = classify(inventory, ns).select("kind", "key", "lm", "valid", "sha", "mid", "hour_s") \
        .persist(StorageLevel.MEMORY_AND_DISK)
    cached: list[Any] = [cl]
    try:
        _count_kinds(report, cl.groupBy("kind", "valid").count().collect())  # one row per kind: small
        mark("classify")
        horizon_before = now_s - retry_horizon_s
        candidates = candidate_rows(cl.where("valid"), ns, horizon_before, cached)
        findings = _confirmed(spark, candidates, access, gc_marked, horizon_before, acc, workers, cached)
        by_rule = findings.groupBy("category", "rule").count().collect()
        counts = {c: sum(int(r["count"]) for r in by_rule if r["category"] == c) for c in CATEGORIES}
        report.confirmed_by_rule = {r["rule"]: int(r["count"]) for r in sorted(by_rule, key=lambda r: r["rule"])
                                    if r["category"] in CATEGORIES}
        if settle_s is not None:
            unreadable = {r["rule"]: int(r["count"]) for r in by_rule if r["category"] == UNREADABLE}
            report.watermarks = plan_watermarks(report.inventory, settle_s, missing_by_index(findings), unreadable)
        findings = findings.where(F.col("category") != UNREADABLE)  # counted, never written (no consumer)
        mark("join+confirm")

        # -- write the confirmed findings, then the summary (the commit point) -------------------------
        report.confirmed = counts
        files, rows_written, report.write_tasks = write_findings(spark, findings, counts, access, out_prefix, acc,
                                                                 rows_per_part)
        report.files = {c: files.get(c, []) for c in CATEGORIES}
        if {c: rows_written.get(c, 0) for c in CATEGORIES} != counts:  # the summary commits what the files hold
            raise RuntimeError(f"audit {run_id}: rows written {rows_written} != confirmed {counts}")
        mark("write")
    finally:
        for df in cached:
            df.unpersist()
    counted = dict(acc.value)
    report.candidates = {c: counted.pop(f"candidate {c}", 0) for c in CATEGORIES}
    report.requests.add(counted)
    report.seconds = time.monotonic() - started
    _commit(access, report, out_prefix, run_id, now_s)
    return report


def _confirmed(spark: Any, candidates: Any, access: S3Access, gc_marked: frozenset[str], horizon_before_s: int,
               acc: Any, workers: int, cached: list[Any]) -> Any:
    """Every candidate confirmed in one Python stage: (category, rule, canonical JSON line), then the
    missing blobs looked at again after GC's marks are read again."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    marked_at_start = frozenset(gc_marked)  # shipped to executors: a plain set
    # As many confirmation tasks as the session has cores (each runs `workers` requests at once),
    # not one per partition of every candidate source (dozens of mostly empty Python tasks).
    findings = candidates.coalesce(spark.sparkContext.defaultParallelism).mapInPandas(
        row_mapper(confirm(access, marked_at_start, horizon_before_s), FINDING_COLUMNS, acc, workers=workers,
                   tag="cand"), FINDING_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(findings)
    if findings.where(F.col("held_blob").isNotNull()).count():
        # GC may have marked a blob after the marks were read: read them again, after every HEAD
        # that found a blob missing, and look at those blobs once more (MarkedBlobs).
        again = frozenset(gc_marked.read_again()) if isinstance(gc_marked, MarkedBlobs) else marked_at_start
        rechecked = findings.where(F.col("held_blob").isNotNull()).mapInPandas(
            row_mapper(recheck_held(access, again), FINDING_COLUMNS, acc, workers=workers), FINDING_SCHEMA)
        findings = findings.where(F.col("held_blob").isNull()).union(rechecked).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(findings)
    return findings


def _count_kinds(report: AuditReport, stats: list[Any]) -> None:
    """Rows scanned, keys by kind, and keys under a kind's prefix its pattern does not match."""
    for r in stats:
        kind = r["kind"] or "outside-layout"
        report.rows_scanned += r["count"]
        if r["valid"] or kind in ("other", "outside-layout"):
            report.keys_by_kind[kind] = report.keys_by_kind.get(kind, 0) + r["count"]
        else:
            report.unparsed[kind] = report.unparsed.get(kind, 0) + r["count"]


def _commit(access: S3Access, report: AuditReport, out_prefix: str, run_id: str, now_s: int) -> None:
    """The summary (the run's commit point), then the run's commit marker."""
    report.summary_key = f"{out_prefix}summary.json"
    with task_tally() as tally:
        put_if_absent(access, report.summary_key, canonical_json(report.to_json()))
        # Then the run's commit marker (docs/protocol.md §15 G-B3): the scheduled GC takes the newest.
        put_if_absent(access, access.codec.audit_committed(int(now_s), run_id),
                      canonical_json({"schema": "lightmetrics.audit_committed.v1", "run_id": run_id,
                                      "summary_key": report.summary_key, "committed_at_unix_s": int(now_s)}))
    report.requests.add(tally)


__all__ = ["CATEGORIES", "KINDS", "ROWS_PER_PART", "AuditReport", "MarkedBlobs", "check_orphan", "classify",
           "gc_marked_blobs", "output_parts", "read_findings", "run_audit"]
