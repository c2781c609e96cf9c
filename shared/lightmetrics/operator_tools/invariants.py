"""The one catalogue of bucket invariants: every rule's name, meaning, severity and predicate.

``lmctl verify`` (:mod:`lightmetrics.operator_tools.verify`), the inventory audit's live confirmation
(``lightmetrics_pipeline.audit.confirm``) and the agents' ledger (:mod:`lightmetrics.harness.ledger`) decide with the
predicates below and report the rule's name, so one fault has one name everywhere (the table in
docs/protocol.md §13.1 lists them). The predicates take plain facts — present or not, sizes, "the
hour is tombstoned" — and read nothing: each caller gathers its facts its own way (listings for
verify, HEADs in Spark executors for the audit, a listing per prefix for the ledger).

A predicate returns ``None`` when the invariant holds, else the :class:`Rule` that describes the
state, which may be an *expected* state (``reaped``: the record is there, its blob is gone and its
hour is tombstoned by retention — protocol R-I3), a *warning*, or a *violation*. The retention
exemption ("the hour is tombstoned, so this is expected") is written once, in these predicates.

Example:
    >>> blob_state(blob_size=None, record_bytes=10, hour_tombstoned=True).name
    'reaped'
    >>> blob_state(blob_size=None, record_bytes=10, hour_tombstoned=False).name
    'blob-missing'
    >>> blob_state(blob_size=10, record_bytes=10, hour_tombstoned=False) is None
    True
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

__all__ = ["RULES", "Rule", "Severity", "acknowledged_state", "blob_state", "by_name", "derived_entry_state",
           "derived_source_state", "evidence_state", "is_violation", "overlaps", "tombstone_exemption"]


class Severity(str, Enum):
    VIOLATION = "violation"  # an invariant is broken: an alarm, `lmctl verify` exits 1
    WARNING = "warning"  # legal for the protocol, but a reader should know (double counting)
    EXPECTED = "expected"  # a state the protocol produces on purpose: counted, never reported


@dataclass(frozen=True)
class Rule:
    name: str
    severity: Severity
    meaning: str
    checked_by: tuple[str, ...]  # "verify", "audit", "ledger" (the docs table is checked against this)


def _rule(name: str, severity: Severity, meaning: str, *checked_by: str) -> Rule:
    return Rule(name, severity, meaning, checked_by)


V, W, E = Severity.VIOLATION, Severity.WARNING, Severity.EXPECTED

INVALID_MANIFEST = _rule("invalid-manifest", V, "an acceptance record does not parse or does not match its key",
                         "verify")
UNSUPPORTED_VERSION = _rule("unsupported-version", V, "an acceptance record written by a newer version (§17)",
                            "verify")
BLOB_MISSING = _rule("blob-missing", V, "an acceptance record's raw blob is absent and its hour is not tombstoned",
                     "verify", "audit", "ledger")
BLOB_SIZE = _rule("blob-size", V, "an acceptance record's raw blob has another size than the record says",
                  "verify", "audit")
REAPED = _rule("reaped", E, "record present, blob (or derived entry) gone, hour tombstoned by retention (R-I3)",
               "verify", "audit", "ledger")
GC_HELD = _rule("gc-held", E, "a blob absent under a delete marker GC recorded and has not settled (§15 G-I3)",
                "audit")
MISSING_DERIVED = _rule("missing-derived", V, "a record (or quarantine manifest) older than the index's watermark W "
                        "lacks a derived entry", "verify", "audit", "ledger")
PENDING = _rule("pending", E, "a record newer than W lacks a derived entry (the event path or the next walk writes it)",
                "verify")
DERIVED_WITHOUT_SOURCE = _rule("derived-without-source", V, "a derived entry whose source (record, blob or "
                               "quarantine manifest) does not exist", "verify", "audit")
DERIVED_MISMATCH = _rule("derived-mismatch", V, "a derived entry names another blob than its record", "verify")
BAD_KEY = _rule("bad-key", V, "a key under a layout prefix that is not of the layout", "verify")
SEGMENT = _rule("segment", V, "a v2 segment or sealed part outside the layout or unreadable (§9.1 V-D4)", "verify")
SEGMENT_CONFLICT = _rule("segment-conflict", V, "two unequal v2 entries for one entry key (§9.1 V-D7)", "verify")
QUARANTINE_INCOMPLETE = _rule("quarantine-incomplete", V, "a quarantine manifest that does not parse, lacks its "
                              "acceptance record, or whose evidence blob is gone before its resolution", "verify")
EVIDENCE_COLLECTED = _rule("evidence-collected", E, "conflict evidence collected by GC after its resolution, or with "
                           "its reaped hour", "verify")
REAPED_WITHOUT_TOMBSTONE = _rule("reaped-without-tombstone", V, "a retention reaped marker without its tombstone",
                                 "verify")
REAPED_NOT_EMPTY = _rule("reaped-not-empty", V, "a reaped hour still has accepted-by-time entries", "verify")
OVERLAPPING_RANGES = _rule("overlapping-ranges", W, "sequence ranges of one boot overlap (samples counted twice)",
                           "verify", "audit")
ORPHAN_BLOB = _rule("orphan-blob", E, "a raw blob past the retry horizon that nothing references: GC's to collect "
                    "(§15)", "audit")
ACKNOWLEDGED_TWICE = _rule("acknowledged-twice", V, "one identity acknowledged with different hashes", "ledger")
ACKNOWLEDGED_NOT_ACCEPTED = _rule("acknowledged-not-accepted", V, "an acknowledged identity has no acceptance record",
                                  "ledger")
ACKNOWLEDGED_OTHER_HASH = _rule("acknowledged-other-hash", V, "the acceptance record's hash differs from the "
                                "acknowledged one", "ledger")

#: Every rule, by name (docs/protocol.md §13.1 lists the same, in this order).
RULES: dict[str, Rule] = {r.name: r for r in (
    INVALID_MANIFEST, UNSUPPORTED_VERSION, BLOB_MISSING, BLOB_SIZE, REAPED, GC_HELD, MISSING_DERIVED, PENDING,
    DERIVED_WITHOUT_SOURCE, DERIVED_MISMATCH, BAD_KEY, SEGMENT, SEGMENT_CONFLICT, QUARANTINE_INCOMPLETE, EVIDENCE_COLLECTED,
    REAPED_WITHOUT_TOMBSTONE, REAPED_NOT_EMPTY, OVERLAPPING_RANGES, ORPHAN_BLOB, ACKNOWLEDGED_TWICE,
    ACKNOWLEDGED_NOT_ACCEPTED, ACKNOWLEDGED_OTHER_HASH)}


def by_name(name: str) -> Rule:
    return RULES[name]


def is_violation(rule: Rule | None) -> bool:
    return rule is not None and rule.severity is Severity.VIOLATION


# ------------------------------------------------------------------------------ predicates


def tombstone_exemption(hour_tombstoned: bool) -> Rule | None:
    """The retention exemption, written once: in an hour tombstoned by retention, a record's blob
    may be gone and its derived entries are not (re-)created (R-I2, R-I3) — the expected ``reaped``
    state, whatever else is absent. A caller that knows the hour is exempt need not look further."""
    return REAPED if hour_tombstoned else None


def blob_state(*, blob_size: int | None, record_bytes: int | None, hour_tombstoned: bool,
               gc_marked: bool = False) -> Rule | None:
    """An acceptance record's raw blob: ``blob_size`` None when it is absent; ``record_bytes`` the
    record's ``frame_bytes``, or None when the caller checks presence only.

    Absent in a tombstoned hour is ``reaped``; absent under GC's recorded mark is ``gc-held`` (the
    settle restores a referenced blob); otherwise ``blob-missing``. Present with another size than
    the record's is ``blob-size``."""
    if blob_size is None:
        return tombstone_exemption(hour_tombstoned) or (GC_HELD if gc_marked else BLOB_MISSING)
    return BLOB_SIZE if record_bytes is not None and blob_size != record_bytes else None


def derived_entry_state(*, entry_present: bool, hour_tombstoned: bool, required: bool = True) -> Rule | None:
    """One derived entry a record (or quarantine manifest) should have.

    Under a tombstone nothing is (re-)created (R-I2): ``reaped``. Absent and ``required`` (accepted
    before the index's watermark W, or ``strict``) is ``missing-derived``; absent and newer is
    ``pending``."""
    if entry_present:
        return None
    return tombstone_exemption(hour_tombstoned) or (MISSING_DERIVED if required else PENDING)


def derived_source_state(*, source_present: bool, source_is_blob: bool = False, hour_tombstoned: bool = False,
                         gc_marked: bool = False) -> Rule | None:
    """A derived entry's source. A ``raw-blobs-by-time`` entry's blob may be gone on purpose:
    reaped with its tombstoned hour (the entry goes with the hour), or held by GC (its settle
    deletes the entry with the blob)."""
    if source_present:
        return None
    if source_is_blob and hour_tombstoned:
        return tombstone_exemption(hour_tombstoned)
    if source_is_blob and gc_marked:
        return GC_HELD
    return DERIVED_WITHOUT_SOURCE


def evidence_state(*, blob_present: bool, resolved: bool, hour_tombstoned: bool) -> Rule | None:
    """A quarantine manifest's submitted blob (the evidence of the conflict): GC collects it after
    the resolution plus the evidence window, or with the accepted record's reaped hour."""
    if blob_present:
        return None
    if resolved or tombstone_exemption(hour_tombstoned):
        return EVIDENCE_COLLECTED
    return QUARANTINE_INCOMPLETE


def overlaps(prev_end: int, start: int) -> Rule | None:
    """Two sequence ranges of one boot, sorted by start: ``overlapping-ranges`` when the second
    starts at or before the end of those before it."""
    return OVERLAPPING_RANGES if start <= prev_end else None


def acknowledged_state(*, hashes: Collection[str], record_sha: str | None) -> Rule | None:
    """What agents saw acknowledged for one identity (``hashes``) against its acceptance record's
    hash (``record_sha``, None when there is no record): exactly one hash, and the record's."""
    if len(set(hashes)) != 1:
        return ACKNOWLEDGED_TWICE
    if record_sha is None:
        return ACKNOWLEDGED_NOT_ACCEPTED
    return None if record_sha in hashes else ACKNOWLEDGED_OTHER_HASH
