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

import re
from typing import Any, Literal, cast

from lightmetrics.acceptance.accept import RESOLUTION_METADATA_KEY
from lightmetrics.acceptance.conflict_records import (
    CONFLICT_ID_RE,
    CONFLICTS_PK,
    DENY_IDENTITY,
    RESOLUTIONS,
    STATUS_FILTERS,
    UNRESOLVED,
    ConflictAlreadyResolved,
    ConflictDetail,
    ConflictEntry,
    ConflictError,
    ConflictNotFound,
    ConflictPage,
    ConflictResolutionRecord,
    ConflictStoreUnavailable,
    InvalidConflictId,
    InvalidResolution,
    conflict_id,
    decode_page_token,
    encode_page_token,
    parse_conflict_id,
)
from lightmetrics.acceptance.denylist import DenylistStore, entry_sk, operator_reason
from lightmetrics.protocol.cas import ConditionalCreateOutcome, create_object, landed_earlier
from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.control_store import ControlStore
from lightmetrics.protocol.errors import ManifestError
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.protocol.manifests import IdentityConflictManifest
from lightmetrics.protocol.object_store import ObjectStore
from lightmetrics.protocol.retry import RetryPolicy


# -------------------------------------------------------------------------------- registry
class ConflictRegistry:
    """List, show and resolve conflicts: the one core behind ``lmctl conflicts`` and the admin API."""

    def __init__(self, store: ObjectStore, codec: KeyCodec, table: ControlStore, *, clock: Clock = DEFAULT_CLOCK,
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
        after = decode_page_token(next_token) if next_token else None
        items: list[ConflictEntry] = []
        while True:
            page, after = self.table.query_page(CONFLICTS_PK, limit=limit, newest_first=newest_first,
                                                filter_expression=" AND ".join(filters) or None, names=names or None,
                                                values=values, start_after_sk=after)
            for n, item in enumerate(page):
                items.append(ConflictEntry.from_item(item))
                if len(items) == limit:
                    more = after is not None or n < len(page) - 1
                    return ConflictPage(items, encode_page_token(items[-1].sk) if more else None)
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
        if CONFLICT_ID_RE.match(text) or text.startswith(self.codec.prefix + "quarantine/"):
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
            mine = landed_earlier(self.store, key, body, created)
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
                if self.denylist.withdraw(sk, record.resolved_at_unix_ns):
                    # an operator lifted this denial after the decision: re-applying must not undo that, and
                    # an entry an earlier attempt of this decision created after the lift goes
                    continue
                boot = None if sk.endswith("#*") else record.boot_id
                self.denylist.add(record.agent_id, boot, who=record.resolved_by, reason=record.reason,
                                  conflict_id=record.conflict_id, decided_at_unix_ns=record.resolved_at_unix_ns)
        self._upsert(entry.with_resolution(record))

    def _upsert(self, entry: ConflictEntry) -> None:
        """Write the whole registry item (its content is a pure function of evidence + record)."""
        self.table.put(entry.to_item())


__all__ = ["ConflictRegistry"]
