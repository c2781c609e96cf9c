"""Derived indexes: what hangs off each authoritative object, written idempotently.

One implementation serves the event path (S3 -> SQS -> Lambda), the steady-state reconciler and
the bootstrap walk. Every write is a conditional create of a deterministic key with
deterministic content, so 412 means "already done" and any number of replays is harmless.

Cost (docs/protocol.md §10, tombstone check cached): indexing one accepted manifest is 1 GET + 2 PUTs in 3
sequential round trips (``accepted-by-blob`` strictly before ``accepted-by-time``, §9 D5); one raw
blob is 1 HEAD (with its checksum) + 1 PUT; one quarantine manifest is 1 GET + 1 PUT + 1
conditional PutItem (the conflict registry).

What an entry's presence certifies (§9 D5, D6) lets the reconciler check an ``accepted-by-time``
entry with one GET and its share of listings (:func:`verify_time_entry`).

Sharded hours (§12 R8): a reconciler shard checks one key range of an hour, and listing the
``raw-blobs-by-time`` hours would cost every one of N shards the same B/1,000 LISTs (B blob keys
in the hour and the hour before). :class:`HeadedBlobs` HEADs each checked entry's blob key
instead: one HEAD per entry, paid once across the shards. A LIST costs 12.5 HEADs ($0.005 vs
$0.0004 per 1,000 requests), so a listing is 12.5 × B/1,000 HEAD-equivalents, and the HEADs are
cheaper whenever a shard checks fewer than ~12.5 × B/1,000 entries in a run. At 1,000 batches/s
a run would list ~7,200 pages (B ≈ 7.2 M): HEADs win below 90,000 entries a run; a 5-minute run
holds 300,000 new entries, ~9,400 per shard at N = 32 (N × 7,200 LISTs = $1.15 a run for 32
listing shards, against $0.12 of HEADs for all of them).

Example:
    >>> index_accepted(ctx, "accepted/v1/agent=61/boot=62/...json")     # doctest: +SKIP
    <Outcome.DONE: 'DONE'>
"""

from __future__ import annotations

import base64

from lightmetrics.acceptance.conflict_records import ConflictEntry, register
from lightmetrics.derived.blob_lookups import HeadedBlobs, IndexedBlobs
from lightmetrics.protocol.cas import ConditionalCreateOutcome, create_object, landed_earlier
from lightmetrics.protocol.derived_entries import (
    AcceptedByBlobEntry,
    AcceptedByTimeEntry,
    QuarantineByBlobEntry,
    RawBlobsByTimeEntry,
)
from lightmetrics.protocol.errors import KeyLayoutError, ManifestError, UnsupportedVersionError
from lightmetrics.protocol.identity import hex_to_id
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest, IdentityConflictManifest, parse_record
from lightmetrics.protocol.object_store import ObjectHead
from lightmetrics.protocol.tombstones import TombstoneCache
from lightmetrics.work import crashpoints
from lightmetrics.work.outcome import Outcome, PermanentWorkError, TransientWorkError
from lightmetrics.work.units import WorkContext

KIND_ACCEPTED = "index-accepted"
KIND_RAW_BLOB = "index-raw-blob"
KIND_QUARANTINE = "index-quarantine"
KIND_REPAIR = "repair-accepted"
#: an ``accepted-by-time`` entry the reconciler cannot map to a record (its key is outside the layout)
KIND_TIME_ENTRY = "accepted-by-time-entry"
#: emitted once per conflict when its registry item is created (the NewConflicts alarm)
CONFLICTS_REGISTERED_METRIC = "ConflictsRegistered"

#: Crash point (lightmetrics.work.crashpoints) between the two accepted-* writes (§9 D5): the
#: ``accepted-by-blob`` entry exists, the ``accepted-by-time`` entry not yet.
CP_BY_BLOB_WRITTEN = crashpoints.register("index.by-blob-written",
                                          "accepted-by-blob entry created, accepted-by-time not yet")


def tombstones(ctx: WorkContext) -> TombstoneCache:
    if ctx.tombstones is None:
        ctx.tombstones = TombstoneCache(ctx.store, ctx.codec)
    return ctx.tombstones


def _create(ctx: WorkContext, key: str, body: bytes) -> bool:
    """Conditionally create a derived entry; True if this call created it (an attempt whose answer was lost too)."""
    result = create_object(ctx.store, key, body, policy=ctx.policy)
    if not result.outcome.is_final:
        raise TransientWorkError(f"derived write {key} did not complete ({result.detail})")
    return result.outcome is ConditionalCreateOutcome.CREATED or landed_earlier(ctx.store, key, body, result)


def _parse(ctx: WorkContext, key: str, kind: KeyKind):  # type: ignore[no-untyped-def]
    try:
        parsed = ctx.codec.parse(key)
    except KeyLayoutError as exc:
        raise PermanentWorkError(str(exc), kind="layout") from None
    if parsed.kind is not kind:
        raise PermanentWorkError(f"{key} is a {parsed.kind.value} key, expected {kind.value}", kind="layout")
    return parsed


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
    """``accepted-by-blob``, then ``accepted-by-time``, for one record.

    The order is a rule (protocol §9 D5): an ``accepted-by-time`` entry present means its
    ``accepted-by-blob`` entry was created, so the reconciler and the walk need not probe it.
    """
    hour = UtcHour.of_unix_ns(m.accepted_at_unix_ns)
    if tombstones(ctx).is_tombstoned("raw", hour):
        return Outcome.NOOP_RESOLVED  # never re-populate an hour being (or already) reaped
    by_blob_created = _create_by_blob(ctx, manifest_key, m)
    crashpoints.point(CP_BY_BLOB_WRITTEN)
    by_time = AcceptedByTimeEntry(manifest_key=manifest_key, frame_sha256=m.frame_sha256, raw_blob_key=m.raw_blob_key,
                                  frame_bytes=m.frame_bytes, accepted_at_unix_ns=m.accepted_at_unix_ns)
    by_time_created = _create(ctx, ctx.codec.accepted_by_time(hour, m.identity), by_time.to_bytes())
    return Outcome.DONE if by_blob_created or by_time_created else Outcome.NOOP_RESOLVED


def _create_by_blob(ctx: WorkContext, manifest_key: str, m: AcceptedBatchManifest) -> bool:
    by_blob = AcceptedByBlobEntry(manifest_key=manifest_key, frame_sha256=m.frame_sha256,
                                  accepted_at_unix_ns=m.accepted_at_unix_ns)
    return _create(ctx, ctx.codec.accepted_by_blob(m.frame_sha256, m.identity), by_blob.to_bytes())


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


def check_blob_checksum(head: ObjectHead, sha: str, subject: str) -> None:
    """Where S3 holds the blob's full-object SHA-256 (``head`` from a HEAD with
    ``checksum=True``), it MUST be ``sha``; otherwise an integrity ``PermanentWorkError``
    (alarm ``IntegrityViolation``). A blob S3 holds no such checksum for passes (§9 D3)."""
    expected = base64.b64encode(bytes.fromhex(sha)).decode()
    if head.checksum_sha256_b64 is not None and head.checksum_sha256_b64 != expected:
        raise PermanentWorkError(
            f"{subject}: blob {head.key} has checksum SHA-256 {head.checksum_sha256_b64}, expected {expected} "
            f"(sha256 {sha})", kind="integrity", alarm="IntegrityViolation")


def write_raw_blob_entry(ctx: WorkContext, head: ObjectHead, sha: str) -> Outcome:
    """The blob's ``raw-blobs-by-time`` entry, created only if the blob's bytes hash to ``sha``
    as far as S3 can tell (§9 D6): ``head`` must come from a HEAD with ``checksum=True``."""
    hour, entry = raw_blob_entry(ctx, head, sha)
    if tombstones(ctx).is_tombstoned("raw", hour):
        return Outcome.NOOP_RESOLVED
    check_blob_checksum(head, sha, head.key)
    created = _create(ctx, ctx.codec.raw_blobs_by_time(hour, sha), entry.to_bytes())
    return Outcome.DONE if created else Outcome.NOOP_RESOLVED


def index_raw_blob(ctx: WorkContext, blob_key: str) -> Outcome:
    parsed = _parse(ctx, blob_key, KeyKind.RAW_BLOB)
    head = ctx.store.head(blob_key, checksum=True)  # the same one request: D6 needs S3's SHA-256
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
    # The conflict registry (lightmetrics.acceptance.conflicts): a conditional create, so replays and the walk
    # only ever fill a missing item and never overwrite an operator's resolution.
    registered = register(ctx.blockers.table, ConflictEntry.from_evidence(quarantine_key, q))
    if registered:
        ctx.metrics.add_metric(name=CONFLICTS_REGISTERED_METRIC, unit="Count", value=1)
    return Outcome.DONE if created or registered else Outcome.NOOP_RESOLVED


def repair_accepted(ctx: WorkContext, manifest_key: str) -> Outcome:
    """Everything that hangs off one acceptance record (the walk; the reconciler's fallback).

    Record valid; both accepted-* entries (by-blob first, §9 D5); blob present with the recorded
    size and, where S3 returns one, the recorded SHA-256 (a missing or different blob is an
    integrity blocker unless its hour is tombstoned — the expected reaped state); and the blob's
    ``raw-blobs-by-time`` entry. Cost: GET + 2 PUTs + HEAD + PUT.

    Example:
        >>> repair_accepted(ctx, "accepted/v1/agent=61/boot=62/...json")   # doctest: +SKIP
        <Outcome.NOOP_RESOLVED: 'NOOP_RESOLVED'>
    """
    return _repair(ctx, manifest_key, load_manifest(ctx, manifest_key), by_time_present=False, indexed=None)


def verify_time_entry(ctx: WorkContext, entry_key: str, indexed: IndexedBlobs | HeadedBlobs | None = None, *,
                      shortcut: bool = True) -> Outcome:
    """The reconciler's check of one ``accepted-by-time`` entry (protocol §12).

    One GET of the record it names (validated like every reader). If the record's blob is in
    ``indexed`` for the entry's hour or the hour before, every derived entry is known present
    (§9 D5, D6): NOOP_RESOLVED, no further request. Otherwise the full repair, writing only what
    is missing (the ``accepted-by-time`` entry is the input, so it exists; ``accepted-by-blob``
    and ``raw-blobs-by-time`` are HEADed before any PUT). Without ``indexed`` (``lmctl blockers
    retry``) or ``shortcut`` (an entry that failed before, §11 O4) it is always the full repair; a
    blob ``indexed`` holds then needs no ``raw-blobs-by-time`` request. An entry whose key is outside the layout is a blocker
    (§9 D4) until it is gone (an operator removed it): then NOOP_RESOLVED.

    Example:
        >>> verify_time_entry(ctx, "accepted-by-time/v1/date=.../x.json", blobs)  # doctest: +SKIP
        <Outcome.NOOP_RESOLVED: 'NOOP_RESOLVED'>
    """
    try:
        manifest_key = manifest_key_of_time_entry(ctx, entry_key)
    except PermanentWorkError:
        if ctx.store.head(entry_key) is None:
            return Outcome.NOOP_RESOLVED
        raise
    m = load_manifest(ctx, manifest_key)
    entry_hour = ctx.codec.parse(entry_key).hour
    held = indexed is not None and entry_hour is not None and indexed.holds(m.frame_sha256, near=entry_hour)
    if held and shortcut:
        return Outcome.NOOP_RESOLVED
    return _repair(ctx, manifest_key, m, by_time_present=True, indexed=indexed, hint_held=held)


def _repair(ctx: WorkContext, manifest_key: str, m: AcceptedBatchManifest, *, by_time_present: bool,
            indexed: IndexedBlobs | HeadedBlobs | None, hint_held: bool = False) -> Outcome:
    """The repair behind :func:`repair_accepted` and :func:`verify_time_entry`. With
    ``by_time_present`` (the caller listed the ``accepted-by-time`` entry) it checks before it
    writes: a HEAD (read class) where the entry is most likely present, instead of a PUT's 412."""
    hour = UtcHour.of_unix_ns(m.accepted_at_unix_ns)
    if not by_time_present:
        outcome = write_accepted_entries(ctx, manifest_key, m)
    elif ctx.store.head(ctx.codec.accepted_by_blob(m.frame_sha256, m.identity)) is not None:
        outcome = Outcome.NOOP_RESOLVED  # D5 says it was created; it was not deleted behind our back
    elif tombstones(ctx).is_tombstoned("raw", hour):
        outcome = Outcome.NOOP_RESOLVED
    else:
        outcome = Outcome.DONE if _create_by_blob(ctx, manifest_key, m) else Outcome.NOOP_RESOLVED
    head = ctx.store.head(m.raw_blob_key, checksum=True)
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
    check_blob_checksum(head, m.frame_sha256, manifest_key)
    blob_hour, _ = raw_blob_entry(ctx, head, m.frame_sha256)
    known = True if hint_held else indexed.known(m.frame_sha256, blob_hour) if indexed is not None else None
    if known:
        blob_outcome = Outcome.NOOP_RESOLVED
    elif known is None and by_time_present and ctx.store.head(
            ctx.codec.raw_blobs_by_time(blob_hour, m.frame_sha256)) is not None:
        blob_outcome = Outcome.NOOP_RESOLVED  # indexed in an hour this run did not list
    else:
        blob_outcome = write_raw_blob_entry(ctx, head, m.frame_sha256)
    return Outcome.DONE if Outcome.DONE in (outcome, blob_outcome) else Outcome.NOOP_RESOLVED


def manifest_key_of_time_entry(ctx: WorkContext, entry_key: str) -> str:
    """The acceptance record an ``accepted-by-time`` entry names; a key outside the layout is a
    ``PermanentWorkError`` (kind ``layout``)."""
    parsed = _parse(ctx, entry_key, KeyKind.ACCEPTED_BY_TIME)
    if parsed.identity is None:
        raise PermanentWorkError(f"{entry_key} names no identity", kind="layout")
    return ctx.codec.accepted(parsed.identity)


#: kind -> function(ctx, object_key): how ``lmctl blockers retry`` re-runs a unit of work.
RUNNERS = {
    KIND_ACCEPTED: index_accepted,
    KIND_RAW_BLOB: index_raw_blob,
    KIND_QUARANTINE: index_quarantine,
    KIND_REPAIR: repair_accepted,
    KIND_TIME_ENTRY: verify_time_entry,
}

#: which index kind each authoritative prefix feeds
KIND_FOR_KEY = {KeyKind.ACCEPTED: KIND_ACCEPTED, KeyKind.RAW_BLOB: KIND_RAW_BLOB, KeyKind.QUARANTINE: KIND_QUARANTINE}
