"""Manifest schemas (pydantic v2) and their canonical JSON form.

Manifests are written once by conditional create and read by everyone, so their bytes are
canonical: sorted keys, no whitespace, UTF-8. Writers are strict (a model refuses an unknown
field). Readers follow the evolution rules of docs/protocol.md §17: within a schema version they
ignore fields they do not know (a newer writer may have added them); a schema or marker version
newer than the reader's raises :class:`UnsupportedVersionError`, never "absent"; anything else
that fails validation raises :class:`ManifestError`. A stored acceptance record is read through
:func:`parse_record`, which also holds its content to its key.

Example:
    >>> m = AcceptedBatchManifest(agent_id="a", boot_id="b", seq_start=1, seq_end=2,
    ...     frame_sha256="0"*64, frame_bytes=10, raw_blob_key="raw-blobs/v1/x",
    ...     accepted_at_unix_ns=1, collector_id="c1", wire_version=1, frame_version=1)
    >>> AcceptedBatchManifest.from_bytes(m.to_bytes()) == m
    True
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lightmetrics.protocol.errors import ManifestError, UnsupportedVersionError
from lightmetrics.protocol.identity import BatchIdentity

if TYPE_CHECKING:
    from lightmetrics.protocol.keys import KeyCodec

ACCEPTED_BATCH_SCHEMA: Final = "lightmetrics.accepted_batch.v1"
IDENTITY_CONFLICT_SCHEMA: Final = "lightmetrics.identity_conflict.v1"

_Sha = Field(pattern=r"^[0-9a-f]{64}$")
_Seq = Field(ge=0, le=2**64 - 1)

M = TypeVar("M", bound="CanonicalModel")


def canonical_json(value: object) -> bytes:
    """The one JSON encoding used for every object this system writes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


#: ``lightmetrics.<object>.v<N>``: every stored object names its schema and that schema's version.
_SCHEMA = re.compile(r"^(lightmetrics\.[a-z_]+)\.v([1-9][0-9]{0,8})$")


def check_schema(stored: object, known: str, what: str) -> None:
    """Refuse a document of another schema; a newer version of ``known`` is
    :class:`UnsupportedVersionError` (docs/protocol.md §17 E2), never "absent" or "invalid"."""
    if stored == known:
        return
    have, want = _SCHEMA.match(stored) if isinstance(stored, str) else None, _SCHEMA.match(known)
    assert want is not None, known
    if have and have.group(1) == want.group(1) and int(have.group(2)) > int(want.group(2)):
        raise UnsupportedVersionError(f"{what}: schema {stored} was written by a newer version of lightmetrics; "
                                      f"this reader knows {known}: upgrade the reader (docs/protocol.md §17)")
    raise ManifestError(f"{what}: schema: expected {known}, found {stored!r}")


def check_version(stored: object, known: int, what: str) -> None:
    """A marker's ``version`` field (Thanos-style): newer than ``known`` is refused the same way."""
    if isinstance(stored, int) and not isinstance(stored, bool) and stored > known:
        raise UnsupportedVersionError(f"{what}: version {stored} was written by a newer version of lightmetrics; "
                                      f"this reader knows version {known}: upgrade the reader (docs/protocol.md §17)")


class CanonicalModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)

    def to_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json", by_alias=True))

    @classmethod
    def from_bytes(cls: type[M], data: bytes) -> M:
        """Read a stored object: version checks first, unknown fields ignored, the rest strict."""
        name = cls.__name__
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{name}: not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ManifestError(f"{name}: document: not a JSON object")
        fields = cls.model_fields
        if "schema_" in fields:
            check_schema(doc.get("schema"), str(fields["schema_"].default), name)
        if "version" in fields:
            check_version(doc.get("version"), int(fields["version"].default), name)
        known = {f.alias or n for n, f in fields.items()}
        try:
            return cls.model_validate({k: v for k, v in doc.items() if k in known}, strict=True)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "document"
            raise ManifestError(f"{name}: {where}: {first['msg']}") from None


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


def parse_record(codec: KeyCodec, manifest_key: str, raw: bytes) -> AcceptedBatchManifest:
    """The one validation of a stored acceptance record, for every reader (the walk, the
    reconciler, retention, verify, GC, the audit): it parses (§17 reader rules) and its content
    matches its key — identity of the key, blob key of its hash. ``ManifestError`` otherwise
    (``UnsupportedVersionError`` for a newer writer's record)."""
    manifest = AcceptedBatchManifest.from_bytes(raw)
    parsed = codec.parse(manifest_key)
    if manifest.identity != parsed.identity or manifest.raw_blob_key != codec.raw_blob(manifest.frame_sha256):
        raise ManifestError(f"{manifest_key}: content does not match its key")
    return manifest
