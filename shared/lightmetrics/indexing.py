"""Derived indexes: what hangs off each authoritative object, written idempotently.

One implementation serves the event path (S3 -> SQS -> Lambda), the steady-state reconciler and
the bootstrap walk. Every write is a conditional create of a deterministic key with
deterministic content, so 412 means "already done" and any number of replays is harmless.

Cost (docs/protocol.md §10, tombstone check cached): indexing one accepted manifest is 1 GET + 2 PUTs in 2
sequential round trips (the two PUTs run concurrently); one raw blob is 1 HEAD + 1 PUT; one
quarantine manifest is 1 GET + 1 PUT + 1 conditional PutItem (the conflict registry).

Example:
    >>> index_accepted(ctx, "accepted/v1/agent=61/boot=62/...json")     # doctest: +SKIP
    <Outcome.DONE: 'DONE'>
"""

from __future__ import annotations

import base64
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from lightmetrics.cas import ConditionalCreateOutcome, create_object
from lightmetrics.config import TOMBSTONE_CACHE_S
from lightmetrics.conflicts import ConflictEntry, register
from lightmetrics.derived import AcceptedByBlobEntry, AcceptedByTimeEntry, QuarantineByBlobEntry, RawBlobsByTimeEntry
from lightmetrics.errors import KeyLayoutError, ManifestError, UnsupportedVersionError
from lightmetrics.identity import hex_to_id
from lightmetrics.keys import KeyCodec, KeyKind, UtcHour
from lightmetrics.manifests import AcceptedBatchManifest, IdentityConflictManifest
from lightmetrics.outcome import Outcome, PermanentWorkError, TransientWorkError
from lightmetrics.store import ObjectHead
from lightmetrics.work import WorkContext

_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="lm-derived")

KIND_ACCEPTED = "index-accepted"
KIND_RAW_BLOB = "index-raw-blob"
KIND_QUARANTINE = "index-quarantine"
KIND_REPAIR = "repair-accepted"
#: an ``accepted-by-time`` entry the reconciler cannot map to a record (its key is outside the layout)
KIND_TIME_ENTRY = "accepted-by-time-entry"
#: emitted once per conflict when its registry item is created (the NewConflicts alarm)
CONFLICTS_REGISTERED_METRIC = "ConflictsRegistered"


class TombstoneCache:
    """Is an hour under a retention tombstone? One HEAD per hour per process and ``ttl_s``.

    A tombstone is permanent once written, so a positive answer is cached forever; a negative
    answer is re-checked after ``ttl_s`` (the reaper waits longer than that before deleting).
    """

    def __init__(self, ctx_store, codec, ttl_s: float = TOMBSTONE_CACHE_S, now=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self.store, self.codec, self.ttl_s, self._now = ctx_store, codec, ttl_s, now
        self._known: dict[tuple[str, UtcHour], float | None] = {}
        self._lock = threading.Lock()

    def is_tombstoned(self, scope: str, hour: UtcHour) -> bool:
        # The HEAD happens under the lock: concurrent records of one hour share one lookup.
        with self._lock:
            if (scope, hour) in self._known:
                checked = self._known[(scope, hour)]
                if checked is None or self._now() - checked < self.ttl_s:
                    return checked is None
            present = self.store.head(self.codec.retention_tombstone(scope, hour)) is not None
            self._known[(scope, hour)] = None if present else self._now()
            return present


def tombstones(ctx: WorkContext) -> TombstoneCache:
    cache = ctx.extras.get("tombstones")
    if cache is None:
        cache = ctx.extras["tombstones"] = TombstoneCache(ctx.store, ctx.codec)
    return cache


def _create(ctx: WorkContext, key: str, body: bytes) -> bool:
    """Conditionally create a derived entry; True if this call created it."""
    result = create_object(ctx.store, key, body, policy=ctx.policy)
    if not result.outcome.is_final:
        raise TransientWorkError(f"derived write {key} did not complete ({result.detail})")
    return result.outcome is ConditionalCreateOutcome.CREATED


def _parse(ctx: WorkContext, key: str, kind: KeyKind):  # type: ignore[no-untyped-def]
    try:
        parsed = ctx.codec.parse(key)
    except KeyLayoutError as exc:
        raise PermanentWorkError(str(exc), kind="layout") from None
    if parsed.kind is not kind:
        raise PermanentWorkError(f"{key} is a {parsed.kind.value} key, expected {kind.value}", kind="layout")
    return parsed


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


def load_manifest(ctx: WorkContext, manifest_key: str) -> AcceptedBatchManifest:
    """GET and validate an acceptance record; its absence is an invariant violation."""
    _parse(ctx, manifest_key, KeyKind.ACCEPTED)
    raw = ctx.store.get(manifest_key)
    if raw is None:
        raise PermanentWorkError(
            f"acceptance record {manifest_key} vanished (records are never deleted)",
            kind="invariant", alarm="InvariantViolation",
        )
    try:
        return parse_record(ctx.codec, manifest_key, raw)
    except UnsupportedVersionError as exc:  # a newer writer's record: upgrade this reader (protocol §17)
        raise PermanentWorkError(f"{manifest_key}: {exc}", kind="unsupported-version") from None
    except ManifestError as exc:
        reason = str(exc) if str(exc).startswith(manifest_key) else f"{manifest_key}: {exc}"
        raise PermanentWorkError(reason, kind="invalid-manifest", alarm="InvariantViolation") from None


def write_accepted_entries(ctx: WorkContext, manifest_key: str, m: AcceptedBatchManifest) -> Outcome:
    """``accepted-by-time`` and ``accepted-by-blob`` for one record, concurrently."""
    hour = UtcHour.of_unix_ns(m.accepted_at_unix_ns)
    if tombstones(ctx).is_tombstoned("raw", hour):
        return Outcome.NOOP_RESOLVED  # never re-populate an hour being (or already) reaped
    ident = m.identity
    by_time = AcceptedByTimeEntry(manifest_key=manifest_key, frame_sha256=m.frame_sha256, raw_blob_key=m.raw_blob_key,
                                  frame_bytes=m.frame_bytes, accepted_at_unix_ns=m.accepted_at_unix_ns)
    by_blob = AcceptedByBlobEntry(manifest_key=manifest_key, frame_sha256=m.frame_sha256,
                                  accepted_at_unix_ns=m.accepted_at_unix_ns)
    writes = [
        _POOL.submit(contextvars.copy_context().run, _create, ctx, ctx.codec.accepted_by_time(hour, ident),
                     by_time.to_bytes()),
        _POOL.submit(contextvars.copy_context().run, _create, ctx, ctx.codec.accepted_by_blob(m.frame_sha256, ident),
                     by_blob.to_bytes()),
    ]
    created = [w.result() for w in writes]
    return Outcome.DONE if any(created) else Outcome.NOOP_RESOLVED


def index_accepted(ctx: WorkContext, manifest_key: str) -> Outcome:
    return write_accepted_entries(ctx, manifest_key, load_manifest(ctx, manifest_key))


def raw_blob_entry(ctx: WorkContext, head: ObjectHead, sha: str) -> tuple[UtcHour, RawBlobsByTimeEntry]:
    md = head.metadata
    agent_hex, boot_hex = md.get("lm-agent-hex"), md.get("lm-boot-hex")
    try:  # identity metadata is informative; a blob without it is still indexed
        if agent_hex and boot_hex:
            hex_to_id(agent_hex), hex_to_id(boot_hex)
        seq_start = int(md["lm-seq-start"]) if "lm-seq-start" in md else None
        seq_end = int(md["lm-seq-end"]) if "lm-seq-end" in md else None
    except (ValueError, KeyError):
        agent_hex = boot_hex = None
        seq_start = seq_end = None
    entry = RawBlobsByTimeEntry(raw_blob_key=head.key, sha256=sha, size=head.size,
                                last_modified_unix_s=int(head.last_modified_unix_s), agent_hex=agent_hex,
                                boot_hex=boot_hex, seq_start=seq_start, seq_end=seq_end)
    return UtcHour((int(head.last_modified_unix_s) // 3600) * 3600), entry


def write_raw_blob_entry(ctx: WorkContext, head: ObjectHead, sha: str) -> Outcome:
    hour, entry = raw_blob_entry(ctx, head, sha)
    if tombstones(ctx).is_tombstoned("raw", hour):
        return Outcome.NOOP_RESOLVED
    created = _create(ctx, ctx.codec.raw_blobs_by_time(hour, sha), entry.to_bytes())
    return Outcome.DONE if created else Outcome.NOOP_RESOLVED


def index_raw_blob(ctx: WorkContext, blob_key: str) -> Outcome:
    parsed = _parse(ctx, blob_key, KeyKind.RAW_BLOB)
    head = ctx.store.head(blob_key)
    if head is None:
        return Outcome.NOOP_RESOLVED  # collected since the event was sent: nothing to index
    return write_raw_blob_entry(ctx, head, parsed.sha256)


def index_quarantine(ctx: WorkContext, quarantine_key: str) -> Outcome:
    parsed = _parse(ctx, quarantine_key, KeyKind.QUARANTINE)
    raw = ctx.store.get(quarantine_key)
    if raw is None:
        raise PermanentWorkError(f"quarantine manifest {quarantine_key} vanished", kind="invariant",
                                 alarm="InvariantViolation")
    try:
        q = IdentityConflictManifest.from_bytes(raw)
    except UnsupportedVersionError as exc:
        raise PermanentWorkError(f"{quarantine_key}: {exc}", kind="unsupported-version") from None
    except ManifestError as exc:
        raise PermanentWorkError(f"{quarantine_key}: {exc}", kind="invalid-manifest") from None
    if q.identity != parsed.identity or q.submitted_frame_sha256 != parsed.sha256:
        raise PermanentWorkError(f"{quarantine_key}: content does not match its key", kind="invalid-manifest")
    entry = QuarantineByBlobEntry(quarantine_key=quarantine_key, submitted_frame_sha256=q.submitted_frame_sha256,
                                  accepted_frame_sha256=q.accepted_frame_sha256)
    created = _create(ctx, ctx.codec.quarantine_by_blob(q.submitted_frame_sha256, q.identity), entry.to_bytes())
    # The conflict registry (lightmetrics.conflicts): a conditional create, so replays and the walk
    # only ever fill a missing item and never overwrite an operator's resolution.
    registered = register(ctx.blockers.table, ConflictEntry.from_evidence(quarantine_key, q))
    if registered:
        ctx.metrics.add_metric(name=CONFLICTS_REGISTERED_METRIC, unit="Count", value=1)
    return Outcome.DONE if created or registered else Outcome.NOOP_RESOLVED


def repair_accepted(ctx: WorkContext, manifest_key: str) -> Outcome:
    """Everything that hangs off one acceptance record (reconciler and walk).

    Record valid; both accepted-* entries; blob present with the recorded size and, where S3
    returns one, the recorded SHA-256 (a missing or different blob is an integrity blocker unless
    its hour is tombstoned — the expected reaped state); and the blob's ``raw-blobs-by-time``
    entry. Cost: GET + 2 PUTs + HEAD + PUT.
    """
    m = load_manifest(ctx, manifest_key)
    outcome = write_accepted_entries(ctx, manifest_key, m)
    head = ctx.store.head(m.raw_blob_key, checksum=True)
    hour = UtcHour.of_unix_ns(m.accepted_at_unix_ns)
    if head is None:
        if tombstones(ctx).is_tombstoned("raw", hour):
            return Outcome.NOOP_RESOLVED
        raise PermanentWorkError(f"{manifest_key}: blob {m.raw_blob_key} is missing", kind="integrity",
                                 alarm="IntegrityViolation")
    if head.size != m.frame_bytes:
        raise PermanentWorkError(f"{manifest_key}: blob is {head.size} bytes, record says {m.frame_bytes}",
                                 kind="integrity", alarm="IntegrityViolation")
    # D3: where S3 holds the blob's SHA-256 (the accept uploads it), it must be the record's hash;
    # without one, the size is all a HEAD can tell.
    expected = base64.b64encode(bytes.fromhex(m.frame_sha256)).decode()
    if head.checksum_sha256_b64 is not None and head.checksum_sha256_b64 != expected:
        raise PermanentWorkError(
            f"{manifest_key}: blob {m.raw_blob_key} has checksum SHA-256 {head.checksum_sha256_b64}, "
            f"record says {expected} (frame_sha256 {m.frame_sha256})", kind="integrity", alarm="IntegrityViolation")
    blob_outcome = write_raw_blob_entry(ctx, head, m.frame_sha256)
    return Outcome.DONE if Outcome.DONE in (outcome, blob_outcome) else Outcome.NOOP_RESOLVED


def manifest_key_of_time_entry(ctx: WorkContext, entry_key: str) -> str:
    """The acceptance record an ``accepted-by-time`` entry names; a key outside the layout is a
    ``PermanentWorkError`` (kind ``layout``)."""
    parsed = _parse(ctx, entry_key, KeyKind.ACCEPTED_BY_TIME)
    if parsed.identity is None:
        raise PermanentWorkError(f"{entry_key} names no identity", kind="layout")
    return ctx.codec.accepted(parsed.identity)


def repair_time_entry(ctx: WorkContext, entry_key: str) -> Outcome:
    """One ``accepted-by-time`` entry: the repair of the record it names. An entry whose key is
    outside the layout (no record to repair, so the hour's derived state cannot be vouched for)
    is a blocker — until it is gone (an operator removed it): then NOOP_RESOLVED."""
    try:
        manifest_key = manifest_key_of_time_entry(ctx, entry_key)
    except PermanentWorkError:
        if ctx.store.head(entry_key) is None:
            return Outcome.NOOP_RESOLVED
        raise
    return repair_accepted(ctx, manifest_key)


#: kind -> function(ctx, object_key): how ``lmctl blockers retry`` re-runs a unit of work.
RUNNERS = {
    KIND_ACCEPTED: index_accepted,
    KIND_RAW_BLOB: index_raw_blob,
    KIND_QUARANTINE: index_quarantine,
    KIND_REPAIR: repair_accepted,
    KIND_TIME_ENTRY: repair_time_entry,
}

#: which index kind each authoritative prefix feeds
KIND_FOR_KEY = {KeyKind.ACCEPTED: KIND_ACCEPTED, KeyKind.RAW_BLOB: KIND_RAW_BLOB, KeyKind.QUARANTINE: KIND_QUARANTINE}
