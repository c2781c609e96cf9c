"""What GC's proof says about one raw blob: the reasons it is deleted or kept, and :class:`Proof`.

The proof itself (authoritative reads: HEAD blob, GET record, HEAD quarantine) is
:meth:`lightmetrics.reaps.gc.BlobCollector.prove`; the reap reports count these reasons
(:mod:`lightmetrics.reaps.report`). :func:`resolution_settles` is check 3's rule, shared with the
Spark audit's orphan check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightmetrics.acceptance.accept import RESOLUTION_METADATA_KEY
from lightmetrics.protocol.errors import InvalidIdentityError
from lightmetrics.protocol.identity import BatchIdentity, hex_to_id

# Reasons a blob is deleted (proof) or kept; the final reap report counts them.
DELETE_UNREFERENCED = "unreferenced"
DELETE_HOUR_TOMBSTONED = "hour-tombstoned"
DELETE_CONFLICT_RESOLVED = "conflict-resolved"
KEEP_GONE = "gone"
KEEP_YOUNG = "younger-than-horizon"
KEEP_REFERENCED = "referenced"
KEEP_CONFLICT = "conflict-unresolved"
KEEP_EVIDENCE_WINDOW = "conflict-evidence-window"
KEEP_NO_IDENTITY = "identity-unknown"
KEEP_RECORD_UNREADABLE = "record-unreadable"  # the record may name this blob: keep it, block the record
KEEP_BLOCKED = "blocked"  # not a raw blob key: a blocker, and the reap goes on
#: blocker kind of a GC candidate that is not a raw blob key
KIND_GC_CANDIDATE = "reap-gc"
KEEP_NOT_TOMBSTONED = "hour-not-tombstoned"  # retention asked, but the proof is something else
KEEP_MARK_NOT_PLACED = "mark-not-placed"  # a crash between intent and marker: left for the next run


@dataclass(frozen=True)
class Proof:
    """What the authoritative reads said about one blob."""

    key: str
    sha: str
    deletable: bool
    reason: str
    version_id: str | None = None
    last_modified_unix_s: int = 0
    identity: BatchIdentity | None = None
    #: G2 found a record naming this blob in a tombstoned hour: that hour (rule G-R1)
    record_hour: str | None = None


def identity_from_metadata(md: dict[str, str]) -> BatchIdentity | None:
    try:
        return BatchIdentity.create(hex_to_id(md["lm-agent-hex"], "agent"), hex_to_id(md["lm-boot-hex"], "boot"),
                                    int(md["lm-seq-start"]), int(md["lm-seq-end"]))
    except (KeyError, ValueError, InvalidIdentityError):
        return None


def resolution_settles(resolution: Any) -> bool:
    """Check 3 (G3): whether a conflict's resolution record (its HEAD, or None) decides the
    conflict — ``accept_existing`` or ``deny_identity`` — so its evidence blob may go once the
    evidence window has passed. The one rule GC and the Spark audit's orphan check share."""
    return resolution is not None and resolution.metadata.get(RESOLUTION_METADATA_KEY) in (
        "accept_existing", "deny_identity")


__all__ = ["DELETE_CONFLICT_RESOLVED", "DELETE_HOUR_TOMBSTONED", "DELETE_UNREFERENCED", "KEEP_BLOCKED", "KEEP_CONFLICT",
           "KEEP_EVIDENCE_WINDOW", "KEEP_GONE", "KEEP_MARK_NOT_PLACED", "KEEP_NO_IDENTITY", "KEEP_NOT_TOMBSTONED",
           "KEEP_RECORD_UNREADABLE", "KEEP_REFERENCED", "KEEP_YOUNG", "KIND_GC_CANDIDATE", "Proof",
           "identity_from_metadata", "resolution_settles"]
