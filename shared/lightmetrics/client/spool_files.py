"""What the agent's spool holds: its file names and the records of its batches.

A batch file's name is :attr:`BatchIdentity.spool_name` (:func:`identity_from_spool_name` is its
inverse); :class:`SpooledBatch` is a batch file, :class:`ParkedBatch` a parked one with its
sidecar, :class:`UnreadableFile` a file set aside. The directory operations are
:class:`lightmetrics.client.spool.Spool`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightmetrics.client.errors import SpoolError
from lightmetrics.protocol.errors import InvalidIdentityError
from lightmetrics.protocol.identity import BatchIdentity, hex_to_id

PARKED_DIR = "parked"
UNREADABLE_DIR = "unreadable"
SIDECAR_SUFFIX = ".json"
TEMP_PREFIX = ".tmp-"
PARKED_SCHEMA = "lightmetrics.parked_batch.v1"
UNREADABLE_SCHEMA = "lightmetrics.unreadable_spool_file.v1"
ASIDE_NAME_RE = re.compile(r"^[0-9a-f]{32}$")
BATCH_NAME_RE = re.compile(r"^agent=(?P<a>[0-9a-f]+)\.boot=(?P<b>[0-9a-f]+)\.(?P<s>\d{20})-(?P<e>\d{20})\.lmframe$")


def identity_from_spool_name(name: str) -> BatchIdentity:
    """Inverse of :attr:`BatchIdentity.spool_name`; raise SpoolError for any other name.

    Example:
        >>> str(identity_from_spool_name(BatchIdentity.create("a", "b", 1, 2).spool_name))
        'a/b/1-2'
    """
    m = BATCH_NAME_RE.match(name)
    if not m:
        raise SpoolError(f"{name!r} is not a spool batch name")
    try:
        ident = BatchIdentity.create(hex_to_id(m["a"], "agent"), hex_to_id(m["b"], "boot"), m["s"], m["e"])
    except InvalidIdentityError as exc:
        raise SpoolError(f"{name!r}: {exc}") from None
    if ident.spool_name != name:  # e.g. non-canonical hex: never two names for one identity
        raise SpoolError(f"{name!r} is not the canonical name of {ident}")
    return ident


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class SpooledBatch:
    """A batch file in the spool (pending unless ``parked``)."""

    identity: BatchIdentity
    path: Path
    parked: bool = False

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()


@dataclass(frozen=True)
class ParkedBatch:
    """A parked batch and its sidecar: kept for inspection, outside the normal send order.

    ``kind`` is ``identity_conflict`` (409; retried at a slow cadence until the answer says
    ``resolution: accept_existing``), ``invalid`` (another 4xx: kept until an operator acts) or
    ``unexpected_answer`` (a 200 whose body did not confirm these bytes).
    """

    identity: BatchIdentity
    path: Path
    sidecar_path: Path
    kind: str
    http_status: int | None
    status: str | None
    reason: str | None
    resolution: str | None
    frame_sha256: str
    frame_bytes: int
    attempts: int
    first_attempt_unix_ns: int | None
    last_attempt_unix_ns: int | None
    parked_at_unix_ns: int | None
    endpoint: str | None
    response: dict[str, Any] = field(default_factory=dict)

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()

    def to_json(self) -> dict[str, Any]:
        return {
            "agent_id": self.identity.agent_id,
            "boot_id": self.identity.boot_id,
            "seq_start": self.identity.seq_start,
            "seq_end": self.identity.seq_end,
            "manifest_id": self.identity.manifest_id,
            "path": str(self.path),
            "kind": self.kind,
            "http_status": self.http_status,
            "status": self.status,
            "reason": self.reason,
            "resolution": self.resolution,
            "frame_sha256": self.frame_sha256,
            "frame_bytes": self.frame_bytes,
            "attempts": self.attempts,
            "first_attempt_unix_ns": self.first_attempt_unix_ns,
            "last_attempt_unix_ns": self.last_attempt_unix_ns,
            "parked_at_unix_ns": self.parked_at_unix_ns,
            "endpoint": self.endpoint,
            "response": self.response,
        }


@dataclass(frozen=True)
class UnreadableFile:
    """A spool file set aside because the client could not use it (kept byte for byte)."""

    path: Path
    sidecar_path: Path
    original_name: str
    original_dir: str  # "" (the spool) or "parked"
    reason: str
    set_aside_at_unix_ns: int | None
    frame_sha256: str
    frame_bytes: int

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "original_name": self.original_name, "original_dir": self.original_dir,
                "kind": "unreadable", "reason": self.reason, "set_aside_at_unix_ns": self.set_aside_at_unix_ns,
                "frame_sha256": self.frame_sha256, "frame_bytes": self.frame_bytes}


__all__ = ["ASIDE_NAME_RE", "BATCH_NAME_RE", "PARKED_DIR", "PARKED_SCHEMA", "SIDECAR_SUFFIX", "TEMP_PREFIX",
           "UNREADABLE_DIR", "UNREADABLE_SCHEMA", "ParkedBatch", "SpooledBatch", "UnreadableFile",
           "identity_from_spool_name", "sha256_hex"]
