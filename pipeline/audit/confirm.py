"""The audit's live confirmation: each candidate the Spark SQL joins found is looked at again with
requests inside the executors (inventory lags), and decided by a predicate of the one invariant
catalogue, :mod:`lightmetrics.operator_tools.invariants` — the same predicates ``lmctl verify`` and the ledger
use, so every confirmed finding carries the ``rule`` they would name it by.

A rule's finding is written under its consumer's folder (:data:`CATEGORY_OF_RULE`; the folders are
the audit's normative outputs, docs/pipeline.md §3).
"""

from __future__ import annotations

import json
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from lightmetrics.operator_tools import invariants as inv
from lightmetrics.protocol.errors import ManifestError, UnsupportedVersionError
from lightmetrics.protocol.identity import BatchIdentity, hex_to_id
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest, canonical_json, parse_record
from lightmetrics.reaps.gc_proof import resolution_settles
from lightmetrics_pipeline.s3io import S3Access

#: rule -> the output folder (category) its confirmed findings go to, and who reads it there
CATEGORY_OF_RULE = {
    inv.MISSING_DERIVED.name: "repair",  # the walk
    inv.DERIVED_WITHOUT_SOURCE.name: "derived-without-source",  # operators
    inv.BLOB_MISSING.name: "integrity",  # operators
    inv.BLOB_SIZE.name: "integrity",
    inv.ORPHAN_BLOB.name: "orphan-blob-candidates",  # the daily GC
    inv.OVERLAPPING_RANGES.name: "overlapping-ranges",  # operators (warning)
}
#: Not an output folder: a record this reader cannot read (a newer writer's, §17 E3, or invalid). The
#: walk and the reconciler block it; the audit only counts it, since it cannot say which entries the
#: record lacks, so no watermark may move past it (docs/protocol.md §13 W6).
UNREADABLE = "unreadable"

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


def gc_marked_blobs(table: Any, codec: Any, *, pool: Executor | None = None) -> MarkedBlobs:
    """The blob keys in GC's recorded marks (intents and marks not yet settled, docs/protocol.md
    §15): one Query of each marks partition, whatever the history — the previous version's (§17)
    first, then the shards' all at once (G-I10), on ``pool`` or on a pool of this read's own: two
    round trips of the driver. :meth:`MarkedBlobs.read_again` queries again the same way."""
    from lightmetrics.reaps.gc_marks import MARKS_SHARDS, read_marks_items

    if pool is None:
        with ThreadPoolExecutor(max_workers=MARKS_SHARDS, thread_name_prefix="lm-audit-marks") as own:
            items = read_marks_items(table, codec, pool=own)
    else:
        items = read_marks_items(table, codec, pool=pool)
    marked = MarkedBlobs(m.key for item in items for m in item.marks)
    marked.reader = lambda: gc_marked_blobs(table, codec, pool=pool)
    return marked


def identity_of(agent_hex: str, boot_hex: str, s: Any, e: Any) -> BatchIdentity:
    return BatchIdentity.create(hex_to_id(agent_hex), hex_to_id(boot_hex), int(s), int(e))


class LiveReads:
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
        except ManifestError as exc:  # "<rule>: why", the catalogue's name for it
            rule = inv.UNSUPPORTED_VERSION if isinstance(exc, UnsupportedVersionError) else inv.INVALID_MANIFEST
            return f"{rule.name}: {exc}"


def per_task(access: S3Access) -> Any:
    """A getter of the task's one :class:`LiveReads`, made on first use in the executor (the
    closure is shipped per task), so its rows share the tombstone cache instead of a HEAD each."""
    held: list[LiveReads] = []

    def get() -> LiveReads:
        if not held:  # two threads may both build one: harmless, the first is kept
            held.append(LiveReads(access))
        return held[0]

    return get


MANIFEST_CHECK_COLUMNS = ["rule", "manifest_key", "manifest_id", "frame_sha256", "accepted_hour", "missing",
                          "blob_key", "detail"]


def check_manifest(access: S3Access, gc_marked: frozenset[str] = frozenset()) -> Any:
    """Live state of one acceptance record: its derived entries (``missing-derived``) and its blob
    (``blob-missing``, ``blob-size``); a record it cannot read, counted (:data:`UNREADABLE`)."""

    live_of = per_task(access)

    def check(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = live_of()
        key = row["key"]
        m = live.manifest(key)
        if isinstance(m, str):  # the reconciler/walk block it; its entries are unknown, so W waits (W6)
            rule, _, why = m.partition(": ")
            return [{"rule": rule, "manifest_key": key, "missing": "", "detail": why, "unreadable": True}]
        if m is None:
            return []  # gone now
        ident, codec = m.identity, live.codec
        hour = UtcHour.of_unix_ns(m.accepted_at_unix_ns)
        if inv.tombstone_exemption(live.tombstoned(hour)):
            return []  # every rule of the record is the expected reaped state: nothing more to look at
        base = {"manifest_key": key, "manifest_id": ident.manifest_id, "frame_sha256": m.frame_sha256,
                "accepted_hour": str(hour), "blob_key": m.raw_blob_key}
        missing = [index for index, entry in (("accepted-by-time", codec.accepted_by_time(hour, ident)),
                                              ("accepted-by-blob", codec.accepted_by_blob(m.frame_sha256, ident)))
                   if inv.derived_entry_state(entry_present=live.store.head(entry) is not None,
                                              hour_tombstoned=False) is inv.MISSING_DERIVED]
        out = []
        head = live.store.head(m.raw_blob_key)
        state = inv.blob_state(blob_size=head.size if head else None, record_bytes=m.frame_bytes,
                               hour_tombstoned=False, gc_marked=m.raw_blob_key in gc_marked)
        if state is inv.BLOB_MISSING:  # held: GC may have marked it since the marks were read (run_audit reads again)
            out.append({**base, "rule": state.name, "missing": "", "detail": "blob missing, hour not tombstoned",
                        "held_blob": m.raw_blob_key})
        elif state is inv.BLOB_SIZE:
            out.append({**base, "rule": state.name, "missing": "",
                        "detail": f"blob is {head.size if head else 0} bytes, the record says {m.frame_bytes}"})
        elif head is not None:  # present: its raw-blobs-by-time entry is in its LastModified hour
            blob_hour = UtcHour((int(head.last_modified_unix_s) // 3600) * 3600)
            entry = live.store.head(codec.raw_blobs_by_time(blob_hour, m.frame_sha256))
            if inv.derived_entry_state(entry_present=entry is not None, hour_tombstoned=False):
                missing.append("raw-blobs-by-time")
        # (gc-held: GC's settle restores a referenced blob it marked, §15 — not missing)
        if missing:
            out.append({**base, "rule": inv.MISSING_DERIVED.name, "missing": ",".join(missing), "detail": "accepted"})
        return out

    return check


def check_quarantine(access: S3Access) -> Any:
    """A quarantine manifest's ``quarantine-by-blob`` entry (``missing-derived``)."""

    live_of = per_task(access)

    def check(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = live_of()
        ident = identity_of(row["agent"], row["boot"], row["s"], row["e"])
        if live.store.head(row["key"]) is None:
            return []
        entry = live.store.head(live.codec.quarantine_by_blob(row["sha"], ident))
        if inv.derived_entry_state(entry_present=entry is not None, hour_tombstoned=False) is None:
            return []
        return [{"rule": inv.MISSING_DERIVED.name, "manifest_key": row["key"], "manifest_id": ident.manifest_id,
                 "frame_sha256": row["sha"], "accepted_hour": "", "missing": "quarantine-by-blob",
                 "blob_key": live.codec.raw_blob(row["sha"]), "detail": "quarantine"}]

    return check


def _blob_hour_tombstoned(live: LiveReads, entry_key: str) -> bool | None:
    """Whether the record named by a ``raw-blobs-by-time`` entry was accepted in a tombstoned hour
    (None: the entry itself is gone)."""
    raw = live.store.get(entry_key)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        if doc.get("agent_hex") and doc.get("boot_hex") and doc.get("seq_start") is not None:
            ident = identity_of(doc["agent_hex"], doc["boot_hex"], doc["seq_start"], doc["seq_end"])
            m = live.manifest(live.codec.accepted(ident))
            return isinstance(m, AcceptedBatchManifest) and live.tombstoned(UtcHour.of_unix_ns(m.accepted_at_unix_ns))
    except (ValueError, KeyError, TypeError):
        pass
    return False


def check_derived(access: S3Access, gc_marked: frozenset[str] = frozenset()) -> Any:
    """A derived entry whose source is absent (``derived-without-source``); a ``raw-blobs-by-time``
    entry's blob reaped with its hour, or held by GC, is expected."""

    live_of = per_task(access)

    def check(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = live_of()
        if live.store.head(row["source_key"]) is not None:
            return []  # the source exists now (inventory lag)
        is_blob = row["entry_kind"] == "raw-blobs-by-time"
        marked, tombstoned = is_blob and row["source_key"] in gc_marked, False
        if is_blob and not marked:
            found = _blob_hour_tombstoned(live, row["entry_key"])
            if found is None:
                return []  # the entry is gone too
            tombstoned = found
        elif not is_blob and live.store.head(row["entry_key"]) is None:
            return []
        rule = inv.derived_source_state(source_present=False, source_is_blob=is_blob, hour_tombstoned=tombstoned,
                                        gc_marked=marked)
        if rule is not inv.DERIVED_WITHOUT_SOURCE:
            return []  # reaped (the entry goes with the hour) or gc-held (its settle deletes the entry, §15)
        held = {"held_blob": row["source_key"], "held_entry": row["entry_key"]} if is_blob else {}
        return [{"rule": rule.name, "entry_key": row["entry_key"], "entry_kind": row["entry_kind"],
                 "source_key": row["source_key"], "detail": "its source does not exist", **held}]

    return check


DERIVED_COLUMNS = ["rule", "entry_key", "entry_kind", "source_key", "detail"]
ORPHAN_COLUMNS = ["rule", "blob_key", "sha256", "size", "last_modified_unix_s", "agent_hex", "boot_hex", "seq_start", "seq_end",
                  "reason"]


def check_orphan(access: S3Access, horizon_before_s: int) -> Any:
    """A blob no ``accepted-by-blob`` entry names, past the horizon: ``orphan-blob`` (GC's, expected)
    when the GC proof's reads agree (docs/protocol.md §15)."""

    live_of = per_task(access)

    def check(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = live_of()
        head = live.store.head(row["key"])
        if head is None or head.last_modified_unix_s >= horizon_before_s:
            return []  # collected since, or re-created (a late retry): not past the horizon
        md = head.metadata
        base = {"rule": inv.ORPHAN_BLOB.name, "blob_key": row["key"], "sha256": row["sha"], "size": head.size,
                "last_modified_unix_s": int(head.last_modified_unix_s), "agent_hex": md.get("lm-agent-hex"),
                "boot_hex": md.get("lm-boot-hex"), "seq_start": md.get("lm-seq-start"), "seq_end": md.get("lm-seq-end")}
        try:
            ident = identity_of(md["lm-agent-hex"], md["lm-boot-hex"], md["lm-seq-start"], md["lm-seq-end"])
        except Exception:
            return [{**base, "reason": "no identity metadata (GC reads the frame header)"}]
        m = live.manifest(live.codec.accepted(ident))
        if isinstance(m, str):
            return []  # a record this reader cannot read may name the blob: never a candidate (G2a)
        if isinstance(m, AcceptedBatchManifest) and m.frame_sha256 == row["sha"]:
            if inv.tombstone_exemption(live.tombstoned(UtcHour.of_unix_ns(m.accepted_at_unix_ns))):
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


OVERLAP_COLUMNS = ["rule", "first_key", "second_key", "first_range", "second_range", "detail"]


def check_overlap(access: S3Access) -> Any:
    """Two records of one boot whose ranges overlap (``overlapping-ranges``, a warning), both still there."""

    live_of = per_task(access)

    def check(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = live_of()
        prev_end = int(row["prev_range"].rsplit("-", 1)[1])
        rule = inv.overlaps(prev_end, int(row["s"]))
        if rule is None or live.store.head(row["prev_key"]) is None or live.store.head(row["key"]) is None:
            return []
        return [{"rule": rule.name, "first_key": row["prev_key"], "second_key": row["key"], "first_range": row["prev_range"],
                 "second_range": f"{int(row['s'])}-{int(row['e'])}",
                 "detail": "sequence ranges of one boot overlap (samples would be counted twice)"}]

    return check



#: One schema for every candidate (the columns a check reads; null where its check has none).
CANDIDATE_COLUMNS = ["check", "cand", "key", "sha", "agent", "boot", "s", "e", "entry_key", "entry_kind", "source_key",
                     "prev_key", "prev_range"]
#: A confirmed finding: its category, its rule, its canonical-JSON line, and for a missing blob the keys
#: GC's marks are read again for (``held_blob``; ``held_entry`` for a ``raw-blobs-by-time`` entry).
FINDING_SCHEMA = "category string, rule string, doc string, held_blob string, held_entry string"
FINDING_COLUMNS = ["category", "rule", "doc", "held_blob", "held_entry"]


def confirm(access: S3Access, gc_marked: frozenset[str], horizon_before_s: int) -> Any:
    """The live confirmation of every candidate, one function for all categories (one Python stage):
    ``row["check"]`` picks the check; each confirmed row becomes ``(category, canonical JSON line)``,
    the line carrying its ``rule`` and the category the folder of that rule's consumer."""
    checks = {
        "manifest": (check_manifest(access, gc_marked), MANIFEST_CHECK_COLUMNS),
        "quarantine": (check_quarantine(access), MANIFEST_CHECK_COLUMNS),
        "derived": (check_derived(access, gc_marked), DERIVED_COLUMNS),
        "orphan": (check_orphan(access, horizon_before_s), ORPHAN_COLUMNS),
        "overlap": (check_overlap(access), OVERLAP_COLUMNS),
    }

    def confirm_row(row: dict[str, Any]) -> list[dict[str, Any]]:
        check, columns = checks[row["check"]]
        return [{"category": UNREADABLE if found.get("unreadable") else CATEGORY_OF_RULE[found["rule"]],
                 "rule": found["rule"],
                 "doc": canonical_json({c: found.get(c) for c in columns}).decode(),
                 "held_blob": found.get("held_blob"), "held_entry": found.get("held_entry")}
                for found in check(row)]

    return confirm_row


def recheck_held(access: S3Access, marked_again: frozenset[str]) -> Any:
    """A missing blob, looked at again after GC's marks were read again: in the marks (``gc-held``:
    GC holds it under its grace), current again (GC restored it), or its ``raw-blobs-by-time``
    entry gone (GC purged both) — not a finding; otherwise the finding stands."""

    live_of = per_task(access)

    def recheck(row: dict[str, Any]) -> list[dict[str, Any]]:
        live = live_of()
        marked = row["held_blob"] in marked_again
        present = not marked and live.store.head(row["held_blob"]) is not None
        if row["held_entry"]:
            if not (marked or present) and live.store.head(row["held_entry"]) is None:
                return []  # GC purged the blob and its entry
            rule = inv.derived_source_state(source_present=present, source_is_blob=True, gc_marked=marked)
        else:
            rule = inv.blob_state(blob_size=0 if present else None, record_bytes=None, hour_tombstoned=False,
                                  gc_marked=marked)
        return [row] if inv.is_violation(rule) else []

    return recheck


__all__ = ["CANDIDATE_COLUMNS", "CATEGORY_OF_RULE", "FINDING_COLUMNS", "FINDING_SCHEMA", "UNREADABLE", "LiveReads",
           "MarkedBlobs", "check_derived", "check_manifest", "check_orphan", "check_overlap", "check_quarantine", "confirm",
           "gc_marked_blobs", "identity_of", "recheck_held"]
