"""Identity conflicts: the registry operators list, and their write-once resolutions.

Objects (docs/protocol.md §4.2-4.3, §14):

* the **evidence** ``quarantine/v1/identity-conflict/<identity>/<submitted-sha256>.json``, written
  by ingest before it answers 409. It is authoritative: one conflict per (identity, submitted hash).
* the **registry** item in the control table (``pk=conflicts``,
  ``sk=<first-seen-ns>#<manifest-id>#<sha256>``): a copy of the evidence's fields plus the
  resolution, so listing is one ``Query`` in first-seen order. The quarantine indexer writes it
  (:func:`register`, from :func:`lightmetrics.derived.indexing.index_quarantine`), so the bootstrap walk
  rebuilds it when missing; a resolution updates it.
* the **resolution** ``conflict-resolutions/v1/<identity>/<submitted-sha256>.json``
  (``schema: lightmetrics.conflict_resolution.v1``), created once by conditional create. The
  decision is also its S3 metadata ``lm-resolution``, which ingest HEADs on the 409 path.

**Conflict id**: ``<agent-hex>.<boot-hex>.<seq-start>-<seq-end>.<submitted-sha256>``, i.e. the
identity's manifest-id and the submitted frame's hash — stable, derived from the evidence key, and
safe in URLs and shells. :func:`parse_conflict_id` also accepts the quarantine key itself.

Example:
    >>> registry = ConflictRegistry(store, codec, table)                           # doctest: +SKIP
    >>> page = registry.list(status="unresolved")                                  # doctest: +SKIP
    >>> registry.resolve(page.items[0].conflict_id, ACCEPT_EXISTING,
    ...                  reason="agent replayed a stale spool", who="alice")        # doctest: +SKIP
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, cast

from pydantic import Field

from lightmetrics.acceptance.accept import RESOLUTION_METADATA_KEY
from lightmetrics.acceptance.denylist import MAX_REASON, DenylistStore, entry_sk, operator_reason
from lightmetrics.aws.control_table import ConditionFailed, ControlTable
from lightmetrics.protocol.cas import ConditionalCreateOutcome, create_object
from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.errors import InvalidIdentityError, KeyLayoutError, LightmetricsError, ManifestError
from lightmetrics.protocol.identity import SEQ_WIDTH, BatchIdentity, hex_to_id
from lightmetrics.protocol.keys import KeyCodec, KeyKind
from lightmetrics.protocol.manifests import IdentityConflictManifest, IdentityFields
from lightmetrics.protocol.object_store import ObjectStore
from lightmetrics.protocol.retry import RetryPolicy

CONFLICTS_PK = "conflicts"
RESOLUTION_SCHEMA: Final = "lightmetrics.conflict_resolution.v1"
UNRESOLVED, ACCEPT_EXISTING, DENY_IDENTITY = "unresolved", "accept_existing", "deny_identity"
RESOLUTIONS = (ACCEPT_EXISTING, DENY_IDENTITY)
STATUS_FILTERS = ("all", "unresolved", "resolved")

_ID_RE = re.compile(
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
            f"at {record.resolved_at_unix_ns} ({record.reason!r}); resolutions are write-once"
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
    m = _ID_RE.match(text)
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


def register(table: ControlTable, entry: ConflictEntry) -> bool:
    """Create the registry item if absent (never overwrites a resolution). True if created."""
    try:
        table.put(entry.to_item(), condition="attribute_not_exists(pk)")
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


def _encode_token(sk: str) -> str:
    return base64.urlsafe_b64encode(sk.encode()).decode().rstrip("=")


def _decode_token(token: str) -> str:
    try:
        sk = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidConflictId("bad pagination token") from None
    if not re.match(r"^\d{20}#", sk):
        raise InvalidConflictId("bad pagination token")
    return sk


# -------------------------------------------------------------------------------- registry
class ConflictRegistry:
    """List, show and resolve conflicts: the one core behind ``lmctl conflicts`` and the admin API."""

    def __init__(self, store: ObjectStore, codec: KeyCodec, table: ControlTable, *, clock: Clock = DEFAULT_CLOCK,
                 policy: RetryPolicy | None = None) -> None:
        self.store, self.codec, self.table, self.clock = store, codec, table, clock
        self.policy = policy or RetryPolicy()
        self.denylist = DenylistStore(table, clock)

    # -- list ------------------------------------------------------------------------------------
    def list(self, *, agent: str | None = None, status: str = "all", limit: int = 50,
             next_token: str | None = None, newest_first: bool = True) -> ConflictPage:
        """One page of registry items (newest first), filtered by agent id and resolution state."""
        if status not in STATUS_FILTERS:
            raise InvalidResolution(f"status must be one of {STATUS_FILTERS}")
        if not 1 <= limit <= 1000:
            raise InvalidResolution("limit must be 1-1000")
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        filters = []
        if agent:
            names["#a"], values[":a"] = "agent_id", agent
            filters.append("#a = :a")
        if status != "all":
            names["#r"], values[":u"] = "resolution", UNRESOLVED
            filters.append("#r = :u" if status == "unresolved" else "#r <> :u")
        after = _decode_token(next_token) if next_token else None
        items: list[ConflictEntry] = []
        while True:
            page, after = self.table.query_page(CONFLICTS_PK, limit=limit, newest_first=newest_first,
                                                filter_expression=" AND ".join(filters) or None, names=names or None,
                                                values=values, start_after_sk=after)
            for n, item in enumerate(page):
                items.append(ConflictEntry.from_item(item))
                if len(items) == limit:
                    more = after is not None or n < len(page) - 1
                    return ConflictPage(items, _encode_token(items[-1].sk) if more else None)
            if after is None:
                return ConflictPage(items, None)

    # -- show ------------------------------------------------------------------------------------
    def _evidence(self, ident: BatchIdentity, sha: str) -> ConflictEntry:
        key = self.codec.quarantine(ident, sha)
        raw = self.store.get(key)
        if raw is None:
            raise ConflictNotFound(f"no identity-conflict evidence at {key}")
        try:
            return ConflictEntry.from_evidence(key, IdentityConflictManifest.from_bytes(raw))
        except ManifestError as exc:
            raise ConflictError(f"{key}: unreadable evidence: {exc}") from None

    def _record(self, key: str) -> ConflictResolutionRecord | None:
        raw = self.store.get(key)
        if raw is None:
            return None
        try:
            return ConflictResolutionRecord.from_bytes(raw)
        except ManifestError as exc:
            raise ConflictError(f"{key}: unreadable resolution record: {exc}") from None

    def complete_id(self, text: str) -> str:
        """The conflict id ``text`` is, or the one id it is a unique prefix of (one LIST of the
        quarantine keys under it); a prefix of none or of several raises, naming them.

        >>> registry.complete_id("6167656e742d31.")                        # doctest: +SKIP
        '6167656e742d31.626f6f742d31.00000000000000000000-00000000000000000009.5e3f…'
        """
        text = (text or "").strip()
        if _ID_RE.match(text) or text.startswith(self.codec.prefix + "quarantine/"):
            return text
        if not re.fullmatch(r"[0-9a-f]+(\.[0-9a-f-]*){0,3}", text):
            raise InvalidConflictId(f"{text!r} is neither a conflict id nor the start of one (see `lmctl conflicts list`)")
        page = self.store.list_page(self.codec.quarantine_id_prefix(text), max_keys=3)
        ids = []
        for key in page.keys:
            ident, sha = parse_conflict_id(key, self.codec)
            ids.append(conflict_id(ident, sha))
        if not ids:
            raise ConflictNotFound(f"no conflict id starts with {text!r} (see `lmctl conflicts list`)")
        if len(ids) > 1:
            more = ", ..." if page.truncated or len(ids) > 2 else ""
            raise InvalidConflictId(f"{text!r} is the start of several conflict ids: {', '.join(ids[:2])}{more}; "
                                    f"give more of it")
        return ids[0]

    def show(self, cid: str) -> ConflictDetail:
        """Evidence + resolution from S3 (authoritative); repairs a missing or stale registry item.
        ``cid`` may be a unique prefix of the id (:meth:`complete_id`)."""
        ident, sha = parse_conflict_id(self.complete_id(cid), self.codec)
        entry = self._evidence(ident, sha)
        res_key = self.codec.conflict_resolution(ident, sha)
        record = self._record(res_key)
        entry.with_resolution(record)
        item = self.table.get(CONFLICTS_PK, entry.sk)
        detail = ConflictDetail(entry, record, res_key, indexed=item is not None)
        if item is None or item.get("resolution") != entry.resolution:
            self._upsert(entry)
            detail.repaired_index = True
        return detail

    # -- resolve ---------------------------------------------------------------------------------
    def resolve(self, cid: str, resolution: str, *, reason: str, who: str,
                whole_agent: bool = False) -> ConflictResolutionRecord:
        """Write the resolution once, then apply it (registry; for deny_identity, the denylist).

        A second resolve raises :class:`ConflictAlreadyResolved` and changes nothing, except that
        it re-applies the first decision's side effects (idempotent), should they have been cut
        short by a crash between the S3 write and the table writes.
        """
        if resolution not in RESOLUTIONS:
            raise InvalidResolution(f"resolution must be one of {RESOLUTIONS}")
        reason = operator_reason(reason, InvalidResolution)
        if not isinstance(whole_agent, bool):  # never a truthy string or number: the scope of a denial
            raise InvalidResolution(f"whole_agent must be a boolean, got {whole_agent!r}")
        if whole_agent and resolution != DENY_IDENTITY:
            raise InvalidResolution("--whole-agent only applies to deny_identity")
        if not who.strip():
            raise InvalidResolution("who must not be empty")
        ident, sha = parse_conflict_id(cid, self.codec)
        entry = self._evidence(ident, sha)
        key = self.codec.conflict_resolution(ident, sha)
        denied = [entry_sk(ident.agent_id, None if whole_agent else ident.boot_id)] if resolution == DENY_IDENTITY else []
        record = ConflictResolutionRecord(
            agent_id=ident.agent_id, boot_id=ident.boot_id, seq_start=ident.seq_start, seq_end=ident.seq_end,
            conflict_id=entry.conflict_id, quarantine_key=entry.quarantine_key,
            accepted_manifest_key=entry.accepted_manifest_key, accepted_frame_sha256=entry.accepted_frame_sha256,
            submitted_frame_sha256=sha, resolution=cast(Literal["accept_existing", "deny_identity"], resolution),
            reason=reason, resolved_by=who.strip(),
            resolved_at_unix_ns=self.clock.now_ns(), denylist_entries=denied,
        )
        body = record.to_bytes()
        created = create_object(self.store, key, body, policy=self.policy,
                                metadata={RESOLUTION_METADATA_KEY: resolution})
        if created.outcome is ConditionalCreateOutcome.EXISTS:
            existing = self._record(key)
            if existing is None:
                raise ConflictStoreUnavailable(f"{key} answered 412 but cannot be read yet; retry")
            mine = created.ambiguous_before and self.store.get(key) == body
            self._apply(entry, existing)
            if not mine:
                raise ConflictAlreadyResolved(existing)
            return existing
        if not created.outcome.is_final:
            raise ConflictStoreUnavailable(f"resolution write did not complete ({created.detail}); retry")
        self._apply(entry, record)
        return record

    def _apply(self, entry: ConflictEntry, record: ConflictResolutionRecord) -> None:
        if record.resolution == DENY_IDENTITY:
            for sk in record.denylist_entries:
                if self.denylist.lifted_since(sk, record.resolved_at_unix_ns):
                    continue  # an operator lifted this denial after the decision: re-applying must not undo that
                boot = None if sk.endswith("#*") else record.boot_id
                self.denylist.add(record.agent_id, boot, who=record.resolved_by, reason=record.reason,
                                  conflict_id=record.conflict_id)
        self._upsert(entry.with_resolution(record))

    def _upsert(self, entry: ConflictEntry) -> None:
        """Write the whole registry item (its content is a pure function of evidence + record)."""
        self.table.put(entry.to_item())


def entry_from_quarantine(key: str, raw: bytes) -> ConflictEntry:
    """The registry entry of one quarantine manifest (raises ManifestError if unreadable)."""
    return ConflictEntry.from_evidence(key, IdentityConflictManifest.from_bytes(raw))


__all__ = [
    "ACCEPT_EXISTING", "CONFLICTS_PK", "DENY_IDENTITY", "RESOLUTIONS", "RESOLUTION_SCHEMA", "STATUS_FILTERS",
    "UNRESOLVED", "ConflictAlreadyResolved", "ConflictDetail", "ConflictEntry", "ConflictError",
    "ConflictNotFound", "ConflictPage", "ConflictRegistry", "ConflictResolutionRecord", "ConflictStoreUnavailable",
    "InvalidConflictId", "InvalidResolution", "conflict_id", "entry_from_quarantine", "parse_conflict_id",
    "register", "registry_sk",
]
