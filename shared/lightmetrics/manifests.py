"""Manifest schemas (pydantic v2) and their canonical JSON form.

Manifests are written once by conditional create and read by everyone, so their bytes are
canonical: sorted keys, no whitespace, UTF-8. Readers validate strictly; a stored object that
fails validation raises :class:`ManifestError`.

Example:
    >>> m = AcceptedBatchManifest(agent_id="a", boot_id="b", seq_start=1, seq_end=2,
    ...     frame_sha256="0"*64, frame_bytes=10, raw_blob_key="raw-blobs/v1/x",
    ...     accepted_at_unix_ns=1, collector_id="c1", wire_version=1, frame_version=1)
    >>> AcceptedBatchManifest.from_bytes(m.to_bytes()) == m
    True
"""

from __future__ import annotations

import json
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lightmetrics.errors import ManifestError
from lightmetrics.identity import BatchIdentity

ACCEPTED_BATCH_SCHEMA = "lightmetrics.accepted_batch.v1"
IDENTITY_CONFLICT_SCHEMA = "lightmetrics.identity_conflict.v1"

_Sha = Field(pattern=r"^[0-9a-f]{64}$")
_Seq = Field(ge=0, le=2**64 - 1)

M = TypeVar("M", bound="CanonicalModel")


def canonical_json(value: object) -> bytes:
    """The one JSON encoding used for every object this system writes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class CanonicalModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)

    def to_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json", by_alias=True))

    @classmethod
    def from_bytes(cls: type[M], data: bytes) -> M:
        try:
            return cls.model_validate_json(data, strict=True)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "document"
            raise ManifestError(f"{cls.__name__}: {where}: {first['msg']}") from None


class IdentityFields(CanonicalModel):
    """The batch identity, as every identity-keyed manifest carries it."""

    agent_id: str
    boot_id: str
    seq_start: int = _Seq
    seq_end: int = _Seq

    @property
    def identity(self) -> BatchIdentity:
        return BatchIdentity.create(self.agent_id, self.boot_id, self.seq_start, self.seq_end)


class AcceptedBatchManifest(IdentityFields):
    """The acceptance record of one identity: ``accepted/v1/<identity>.json``."""

    schema_: Literal["lightmetrics.accepted_batch.v1"] = Field(ACCEPTED_BATCH_SCHEMA, alias="schema")
    frame_sha256: str = _Sha
    frame_bytes: int = Field(ge=0)
    raw_blob_key: str
    accepted_at_unix_ns: int = Field(ge=0)
    collector_id: str
    wire_version: int = Field(ge=1)
    frame_version: int = Field(ge=1)


class IdentityConflictManifest(IdentityFields):
    """Evidence of a different frame submitted for an accepted identity (quarantine/v1/)."""

    schema_: Literal["lightmetrics.identity_conflict.v1"] = Field(IDENTITY_CONFLICT_SCHEMA, alias="schema")
    accepted_manifest_key: str
    accepted_raw_blob_key: str
    accepted_frame_sha256: str = _Sha
    submitted_raw_blob_key: str
    submitted_frame_sha256: str = _Sha
    submitted_frame_bytes: int = Field(ge=0)
    observed_at_unix_ns: int = Field(ge=0)
    collector_id: str
    accepted_collector_id: str
