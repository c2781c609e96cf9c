"""Identity conflicts' records: conflict ids, the registry entry, the resolution record, and their errors.

The objects and the registry item are described in :mod:`lightmetrics.acceptance.conflicts` (docs/protocol.md
§4.2-4.3, §14), whose :class:`~lightmetrics.acceptance.conflicts.ConflictRegistry` lists, shows and resolves
them. Here: the conflict id (:func:`conflict_id`, :func:`parse_conflict_id`), :class:`ConflictEntry`
(a registry item, built from the evidence), :class:`ConflictResolutionRecord` (the write-once
decision), the registry's conditional create (:func:`register`) and its page token.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from pydantic import Field

from lightmetrics.acceptance.denylist import MAX_REASON
from lightmetrics.protocol.clock import utc_text
from lightmetrics.protocol.control_store import ConditionFailed, ControlStore
from lightmetrics.protocol.errors import InvalidIdentityError, KeyLayoutError, LightmetricsError
from lightmetrics.protocol.identity import SEQ_WIDTH, BatchIdentity, hex_to_id
from lightmetrics.protocol.keys import KeyCodec, KeyKind
from lightmetrics.protocol.manifests import IdentityConflictManifest, IdentityFields
from lightmetrics.protocol.own_writes import put_own

CONFLICTS_PK = "conflicts"
RESOLUTION_SCHEMA: Final = "lightmetrics.conflict_resolution.v1"
UNRESOLVED, ACCEPT_EXISTING, DENY_IDENTITY = "unresolved", "accept_existing", "deny_identity"
RESOLUTIONS = (ACCEPT_EXISTING, DENY_IDENTITY)
STATUS_FILTERS = ("all", "unresolved", "resolved")

CONFLICT_ID_RE = re.compile(
    r"^(?P<agent>[0-9a-f]+)\.(?P<boot>[0-9a-f]+)\.(?P<start>\d{%d})-(?P<end>\d{%d})\.(?P<sha>[0-9a-f]{64})$"
    % (SEQ_WIDTH, SEQ_WIDTH)
)


class ConflictError(LightmetricsError):
    """Base of the registry's errors."""


class InvalidConflictId(ConflictError, ValueError):
    """Not a conflict id (nor a quarantine key) — usage error (exit 2, HTTP 400)."""


class ConflictNotFound(ConflictError, KeyError):
    """No evidence exists for this id (exit 2, HTTP 404)."""


class InvalidResolution(ConflictError, ValueError):
    """Bad decision, missing reason, ... (exit 2, HTTP 400)."""


class ConflictAlreadyResolved(ConflictError):
    """The resolution record exists already; nothing was overwritten (exit 2, HTTP 409)."""

    def __init__(self, record: "ConflictResolutionRecord") -> None:
        super().__init__(
            f"conflict {record.conflict_id} was already resolved as {record.resolution} by {record.resolved_by} "
            f"at {utc_text(record.resolved_at_unix_ns)} ({record.reason!r}); resolutions are write-once"
        )
        self.record = record


class ConflictStoreUnavailable(ConflictError):
    """S3 did not confirm the resolution write (exit 4, HTTP 503): retry."""


# ------------------------------------------------------------------------------------- ids
def conflict_id(identity: BatchIdentity, submitted_sha256: str) -> str:
    """``<manifest-id>.<submitted-sha256>`` (module docstring)."""
    return f"{identity.manifest_id}.{submitted_sha256}"


def parse_conflict_id(text: str, codec: KeyCodec) -> tuple[BatchIdentity, str]:
    """(identity, submitted sha256) of a conflict id or of a quarantine manifest key."""
    text = (text or "").strip()
    m = CONFLICT_ID_RE.match(text)
    if m:
        try:
            ident = BatchIdentity.create(hex_to_id(m["agent"], "agent"), hex_to_id(m["boot"], "boot"),
                                         m["start"], m["end"])
        except InvalidIdentityError as exc:
            raise InvalidConflictId(f"bad conflict id {text!r}: {exc}") from None
        return ident, m["sha"]
    try:
        parsed = codec.parse(text)
    except KeyLayoutError:
        parsed = None
    if parsed is None or parsed.kind is not KeyKind.QUARANTINE or parsed.identity is None or parsed.sha256 is None:
        raise InvalidConflictId(
            f"{text!r} is not a conflict id (<agent-hex>.<boot-hex>.<seq-start>-<seq-end>.<sha256>, "
            "see `lmctl conflicts list`) nor a quarantine key"
        )
    return parsed.identity, parsed.sha256


# --------------------------------------------------------------------------------- objects
class ConflictResolutionRecord(IdentityFields):
    """``conflict-resolutions/v1/<identity>/<submitted-sha256>.json``: an operator's decision."""

    schema_: Literal["lightmetrics.conflict_resolution.v1"] = Field(RESOLUTION_SCHEMA, alias="schema")
    conflict_id: str
    quarantine_key: str
    accepted_manifest_key: str
    accepted_frame_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    submitted_frame_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    resolution: Literal["accept_existing", "deny_identity"]
    reason: str = Field(min_length=1, max_length=MAX_REASON)
    resolved_by: str = Field(min_length=1)
    resolved_at_unix_ns: int = Field(ge=0)
    #: denylist entries this decision added (``<agent-hex>#<boot-hex>`` or ``<agent-hex>#*``)
    denylist_entries: list[str] = Field(default_factory=list)


@dataclass
class ConflictEntry:
    """One conflict as the registry lists it (all fields come from the evidence, plus the decision)."""

    conflict_id: str
    quarantine_key: str
    agent_id: str
    boot_id: str
    seq_start: int
    seq_end: int
    accepted_manifest_key: str
    accepted_raw_blob_key: str
    accepted_frame_sha256: str
    submitted_raw_blob_key: str
    submitted_frame_sha256: str
    submitted_frame_bytes: int
    first_seen_unix_ns: int
    accepted_collector_id: str
    observed_by_collector_id: str
    resolution: str = UNRESOLVED
    resolved_by: str | None = None
    resolved_at_unix_ns: int | None = None
    resolution_reason: str | None = None

    @property
    def identity(self) -> BatchIdentity:
        return BatchIdentity.create(self.agent_id, self.boot_id, self.seq_start, self.seq_end)

    @property
    def collectors(self) -> list[str]:
        return list(dict.fromkeys([self.accepted_collector_id, self.observed_by_collector_id]))

    @property
    def sk(self) -> str:
        return registry_sk(self.first_seen_unix_ns, self.identity, self.submitted_frame_sha256)

    @classmethod
    def from_evidence(cls, key: str, q: IdentityConflictManifest) -> "ConflictEntry":
        return cls(
            conflict_id=conflict_id(q.identity, q.submitted_frame_sha256), quarantine_key=key,
            agent_id=q.agent_id, boot_id=q.boot_id, seq_start=q.seq_start, seq_end=q.seq_end,
            accepted_manifest_key=q.accepted_manifest_key, accepted_raw_blob_key=q.accepted_raw_blob_key,
            accepted_frame_sha256=q.accepted_frame_sha256, submitted_raw_blob_key=q.submitted_raw_blob_key,
            submitted_frame_sha256=q.submitted_frame_sha256, submitted_frame_bytes=q.submitted_frame_bytes,
            first_seen_unix_ns=q.observed_at_unix_ns, accepted_collector_id=q.accepted_collector_id,
            observed_by_collector_id=q.collector_id,
        )

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> "ConflictEntry":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in item.items() if k in names})

    def with_resolution(self, record: "ConflictResolutionRecord | None") -> "ConflictEntry":
        if record is not None:
            self.resolution, self.resolved_by = record.resolution, record.resolved_by
            self.resolved_at_unix_ns, self.resolution_reason = record.resolved_at_unix_ns, record.reason
        return self

    def to_item(self) -> dict[str, Any]:
        return {"pk": CONFLICTS_PK, "sk": self.sk, **asdict(self)}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "collectors": self.collectors,
                "seq_range": f"{self.seq_start}-{self.seq_end}"}


def registry_sk(first_seen_ns: int, identity: BatchIdentity, submitted_sha256: str) -> str:
    """``<first-seen-ns, 20 digits>#<manifest-id>#<sha256>``: sort order is first-seen order."""
    return f"{first_seen_ns:020d}#{identity.manifest_id}#{submitted_sha256}"


def register(table: ControlStore, entry: ConflictEntry) -> bool:
    """Create the registry item if absent (never overwrites a resolution). True if created."""
    try:
        put_own(table, entry.to_item(), condition="attribute_not_exists(pk)")
    except ConditionFailed:
        return False
    return True


@dataclass
class ConflictPage:
    items: list[ConflictEntry]
    next_token: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"conflicts": [e.to_json() for e in self.items], "count": len(self.items), "next_token": self.next_token}


@dataclass
class ConflictDetail:
    """``show``: the evidence (authoritative), the resolution record if any, and the index state."""

    entry: ConflictEntry
    record: ConflictResolutionRecord | None
    resolution_key: str
    indexed: bool
    repaired_index: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.entry.to_json(), "resolution_key": self.resolution_key,
                "resolution_record": self.record.model_dump(mode="json", by_alias=True) if self.record else None,
                "indexed": self.indexed, "repaired_index": self.repaired_index}


def encode_page_token(sk: str) -> str:
    return base64.urlsafe_b64encode(sk.encode()).decode().rstrip("=")


def decode_page_token(token: str) -> str:
    try:
        sk = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidConflictId("bad pagination token") from None
    if not re.match(r"^\d{20}#", sk):
        raise InvalidConflictId("bad pagination token")
    return sk


def entry_from_quarantine(key: str, raw: bytes) -> ConflictEntry:
    """The registry entry of one quarantine manifest (raises ManifestError if unreadable)."""
    return ConflictEntry.from_evidence(key, IdentityConflictManifest.from_bytes(raw))

__all__ = [
    "ACCEPT_EXISTING", "CONFLICT_ID_RE", "CONFLICTS_PK", "DENY_IDENTITY", "RESOLUTIONS", "RESOLUTION_SCHEMA", "STATUS_FILTERS",
    "UNRESOLVED", "ConflictAlreadyResolved", "ConflictDetail", "ConflictEntry", "ConflictError",
    "ConflictNotFound", "ConflictPage", "ConflictResolutionRecord", "ConflictStoreUnavailable",
    "InvalidConflictId", "InvalidResolution", "conflict_id", "decode_page_token", "encode_page_token",
    "entry_from_quarantine", "parse_conflict_id", "register", "registry_sk",
]
