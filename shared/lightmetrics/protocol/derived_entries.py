"""Schemas of the derived index entries (docs/protocol.md §3, "derived"; §4.5).

Each entry is a small canonical-JSON object written once by conditional create. Its content is
a pure function of its source (manifest, blob HEAD, quarantine manifest), so the event path, the
reconciler and the walk write byte-identical entries and a 412 always means "already done".
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lightmetrics.protocol.manifests import CanonicalModel

_Sha = Field(pattern=r"^[0-9a-f]{64}$")


class AcceptedByTimeEntry(CanonicalModel):
    """``accepted-by-time/v1/<hour of accepted_at>/<manifest-id>.json``."""

    schema_: Literal["lightmetrics.accepted_by_time.v1"] = Field("lightmetrics.accepted_by_time.v1", alias="schema")
    manifest_key: str
    frame_sha256: str = _Sha
    raw_blob_key: str
    frame_bytes: int = Field(ge=0)
    accepted_at_unix_ns: int = Field(ge=0)


class AcceptedByBlobEntry(CanonicalModel):
    """``accepted-by-blob/v1/<sha path>/<identity>.json``: the blob is referenced by this record."""

    schema_: Literal["lightmetrics.accepted_by_blob.v1"] = Field("lightmetrics.accepted_by_blob.v1", alias="schema")
    manifest_key: str
    frame_sha256: str = _Sha
    accepted_at_unix_ns: int = Field(ge=0)


class RawBlobsByTimeEntry(CanonicalModel):
    """``raw-blobs-by-time/v1/<hour of LastModified>/sha256=<sha>.json`` (covers orphans too)."""

    schema_: Literal["lightmetrics.raw_blobs_by_time.v1"] = Field("lightmetrics.raw_blobs_by_time.v1", alias="schema")
    raw_blob_key: str
    sha256: str = _Sha
    size: int = Field(ge=0)
    last_modified_unix_s: int = Field(ge=0)
    agent_hex: str | None = None
    boot_hex: str | None = None
    seq_start: int | None = None
    seq_end: int | None = None


class QuarantineByBlobEntry(CanonicalModel):
    """``quarantine-by-blob/v1/<sha path of the submitted blob>/<identity>.json``."""

    schema_: Literal["lightmetrics.quarantine_by_blob.v1"] = Field(
        "lightmetrics.quarantine_by_blob.v1", alias="schema"
    )
    quarantine_key: str
    submitted_frame_sha256: str = _Sha
    accepted_frame_sha256: str = _Sha
