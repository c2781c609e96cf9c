"""The one raw-blob deleter: proof from authoritative reads, then the delete-marker handshake.

Nothing else in the system deletes under ``raw-blobs/v1/`` (the bucket policy allows only the GC
role; docs/protocol.md §15). GC of orphans and retention of expired hours both delete blobs here.

**Proof** (:meth:`BlobCollector.prove`), strongly consistent reads only, never derived indexes:

1. HEAD the blob: its identity (object metadata written by the accept), ``LastModified``, and the
   current version id (captured now, purged later). Younger than ``LM_RETRY_HORIZON_S`` → keep.
2. GET ``accepted/v1/<identity>.json``: a record with this blob's hash references it → keep,
   unless the record's acceptance hour is tombstoned by retention (→ delete, "hour-tombstoned").
   A record this version cannot read (corrupt, or written by a newer version) may name this blob:
   keep it, and open the record's blocker (G2a).
3. HEAD ``quarantine/v1/identity-conflict/<identity>/<sha>.json``: conflict evidence → keep until
   its resolution record exists and is older than the evidence window (``LM_RETRY_HORIZON_S``),
   or until the accepted record's hour is tombstoned.
4. Otherwise the blob is unreferenced → delete.

**Handshake** (closes the race with an accept of the same identity that got 412 on the blob):
:meth:`mark` only places a delete marker (``DeleteObject`` without a version id; reversible) after
recording the captured version id; :meth:`settle`, no earlier than ``LM_GC_GRACE_S`` after the
mark, repeats checks 2-3. Still deletable → purge exactly the captured version and the marker
(a newer version, re-created by an accept meanwhile, survives). Referenced now → delete the marker
(the blob is back; metric ``GcRestored``). The grace must exceed the longest accept (ingest
timeout plus clock skew); with accept step 6 there is then no window (docs/protocol.md §15).

Cost per candidate (docs/protocol.md §15): HEAD blob + GET manifest + HEAD quarantine; before the
purge GET manifest + HEAD quarantine again. The deletes go in ``DeleteObjects`` requests of up to
1,000 keys (:meth:`lightmetrics.protocol.object_store.ObjectStore.delete_objects`), each right after the fence: one a page for
its markers, then three a settle — the captured versions, the markers (and restores), the blobs'
``raw-blobs-by-time`` hints — each request only after the one before it answered, so every key
keeps its order. Tombstone checks are cached per hour (a tombstone is permanent).

Example:
    >>> gc = BlobCollector(ctx, settings)                            # doctest: +SKIP
    >>> proof = gc.prove(ctx.codec.raw_blob(sha))                    # doctest: +SKIP
    >>> marks = gc.mark([proof]); gc.settle(marks)                   # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from lightmetrics.derived.indexing import KIND_REPAIR
from lightmetrics.protocol.errors import KeyLayoutError, ManifestError, UnsupportedVersionError
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest, parse_record
from lightmetrics.protocol.tombstones import TombstoneCache
from lightmetrics.reaps.gc_marks import Mark
from lightmetrics.reaps.gc_proof import (
    DELETE_CONFLICT_RESOLVED,
    DELETE_HOUR_TOMBSTONED,
    DELETE_UNREFERENCED,
    KEEP_BLOCKED,
    KEEP_CONFLICT,
    KEEP_EVIDENCE_WINDOW,
    KEEP_GONE,
    KEEP_MARK_NOT_PLACED,
    KEEP_NO_IDENTITY,
    KEEP_NOT_TOMBSTONED,
    KEEP_RECORD_UNREADABLE,
    KEEP_REFERENCED,
    KEEP_YOUNG,
    KIND_GC_CANDIDATE,
    Proof,
    identity_from_metadata,
    resolution_settles,
)
from lightmetrics.work import crashpoints
from lightmetrics.work.pool import map_in_context
from lightmetrics.work.units import WorkContext, work_key

log = logging.getLogger(__name__)
_NS = 1_000_000_000

# Crash points of the handshake (lightmetrics.work.crashpoints; the reap harness kills at each).
CP_PROVED = crashpoints.register("gc.proved", "candidates proven; nothing written")
# A "batch" is one DeleteObjects request (up to 1,000 keys); each point follows its answer.
CP_MARKED_ONE = crashpoints.register("gc.marked-one",
                                     "a batch of delete markers placed, the page's marks not yet recorded")
CP_RECHECKED = crashpoints.register("gc.rechecked", "grace over, proof repeated; nothing deleted yet")
CP_PURGED_VERSION = crashpoints.register("gc.purged-version",
                                         "a batch of pre-mark versions purged, their markers still there")
CP_PURGED_MARKERS = crashpoints.register("gc.purged-markers", "a batch of markers deleted (purges and restores), "
                                         "the purged blobs' raw-blobs-by-time hints still there")
CP_SETTLED_ONE = crashpoints.register("gc.settled-one", "a batch of purged blobs' hints deleted, not yet counted")
#: error codes of a version delete that mean "already gone" (a settle repeated after a crash)
_GONE = ("NoSuchVersion", "NoSuchKey", "404")


_UNREADABLE = object()  # BlobCollector._record: a record exists but this reader cannot trust it


class BlobCollector:
    """Proof, mark and settle for raw blobs; ``concurrency`` bounds parallel requests."""

    def __init__(self, ctx: WorkContext, settings: Any, *, concurrency: int = 8,
                 tombstones: TombstoneCache | None = None, fence: Callable[[], None] | None = None) -> None:
        self.ctx, self.settings = ctx, settings
        # Called right before every delete; raises if the reap lost its lease (docs/protocol.md
        # §13 L2). None: nothing to fence (a collector driven directly, as in the race tests).
        self.fence = fence or (lambda: None)
        self.codec = ctx.codec
        self.horizon_ns = int(settings.retry_horizon_s) * _NS
        self.evidence_ns = int(settings.retry_horizon_s) * _NS
        self.grace_ns = int(settings.gc_grace_s) * _NS
        # One HEAD per hour per task (a collector lives for one reap task): "tombstoned" is permanent;
        # a stale "not tombstoned" only keeps a blob (G2), and retention's blob tasks start after
        # its tombstone, so they never hold an answer from before it.
        self.tombstones = tombstones or TombstoneCache(ctx.store, ctx.codec)
        #: acceptance records this task already read, by record key (retention reads them to find
        #: the blobs): a record is immutable, so G2 uses them instead of reading them again
        self.records_read: dict[str, AcceptedBatchManifest] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="lm-gc")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        items = list(items)
        if len(items) <= 1:
            return [fn(i) for i in items]
        return map_in_context(self._pool, fn, items)

    # -- proof ---------------------------------------------------------------------------------------
    def prove(self, key: str, *, now_ns: int | None = None) -> Proof:
        """Steps 1-4 of the module docstring for the blob at ``key``."""
        parsed = self.codec.parse(key)
        if parsed.kind is not KeyKind.RAW_BLOB or parsed.sha256 is None:
            raise KeyLayoutError(f"{key} is not a raw blob key")
        sha = parsed.sha256
        now = self.ctx.clock.now_ns() if now_ns is None else now_ns
        head = self.ctx.store.head(key)
        if head is None:
            return Proof(key, sha, False, KEEP_GONE)
        lm = int(head.last_modified_unix_s)
        identity = identity_from_metadata(head.metadata)
        base = dict(key=key, sha=sha, version_id=head.version_id, last_modified_unix_s=lm, identity=identity)
        if now - lm * _NS < self.horizon_ns:
            return Proof(deletable=False, reason=KEEP_YOUNG, **base)  # type: ignore[arg-type]
        if identity is None:
            return Proof(deletable=False, reason=KEEP_NO_IDENTITY, **base)  # type: ignore[arg-type]
        deletable, reason, record_hour = self._references(identity, sha, now)
        return Proof(deletable=deletable, reason=reason, record_hour=record_hour, **base)  # type: ignore[arg-type]

    def references(self, identity: BatchIdentity, sha: str, now_ns: int) -> tuple[bool, str]:
        """Checks 2-3: ``(deletable, reason)`` from the acceptance record and the conflict evidence."""
        deletable, reason, _ = self._references(identity, sha, now_ns)
        return deletable, reason

    def _references(self, identity: BatchIdentity, sha: str, now_ns: int) -> tuple[bool, str, str | None]:
        """:meth:`references`, plus the record's hour when a record naming the blob is in a
        tombstoned hour (what a mark carries instead of its identity, rule G-R1)."""
        record = self._record(identity)
        if record is _UNREADABLE:
            return False, KEEP_RECORD_UNREADABLE, None
        hour = UtcHour.of_unix_ns(record.accepted_at_unix_ns) if record is not None else None
        hour_tombstoned = hour is not None and self.tombstones.is_tombstoned("raw", hour)
        if record is not None and record.frame_sha256 == sha:
            return (True, DELETE_HOUR_TOMBSTONED, str(hour)) if hour_tombstoned else (False, KEEP_REFERENCED, None)
        return (*self._evidence(identity, sha, now_ns, hour_tombstoned), None)

    def _evidence(self, identity: BatchIdentity, sha: str, now_ns: int, hour_tombstoned: bool) -> tuple[bool, str]:
        """Check 3: no record names the blob; the conflict evidence decides."""
        if self.ctx.store.head(self.codec.quarantine(identity, sha)) is None:
            return True, DELETE_UNREFERENCED
        if hour_tombstoned:
            return True, DELETE_HOUR_TOMBSTONED  # evidence of a conflict in a reaped hour
        resolution = self.ctx.store.head(self.codec.conflict_resolution(identity, sha))
        if resolution is None or not resolution_settles(resolution):
            return False, KEEP_CONFLICT
        if now_ns - int(resolution.last_modified_unix_s) * _NS < self.evidence_ns:
            return False, KEEP_EVIDENCE_WINDOW
        return True, DELETE_CONFLICT_RESOLVED

    def _record(self, identity: BatchIdentity) -> Any:
        """The acceptance record, ``None`` if there is none, or ``_UNREADABLE``: a record that does
        not parse or validate (its content must match its key), or that a newer writer wrote (G2a) —
        it may name this blob, so it is never read as "absent"; its blocker is opened here (the
        walk and the reconciler open the same one)."""
        key = self.codec.accepted(identity)
        if key in self.records_read:
            return self.records_read[key]
        raw = self.ctx.store.get(key)
        if raw is None:
            return None
        try:
            return parse_record(self.codec, key, raw)  # the same validation as every reader's
        except ManifestError as exc:
            self._block_record(key, exc)
            return _UNREADABLE

    def _block_record(self, key: str, exc: ManifestError) -> None:
        kind = "unsupported-version" if isinstance(exc, UnsupportedVersionError) else "invalid-manifest"
        if self._block_once(work_key(KIND_REPAIR, key), KIND_REPAIR, key,
                            f"{kind}: {key}: {exc}; GC keeps every blob it may name") and kind == "invalid-manifest":
            self.ctx.metrics.add_metric(name="InvariantViolation", unit="Count", value=1)
        log.error("gc keeps the blobs of %s: %s", key, exc)

    def _block_once(self, wk: str, kind: str, object_key: str, reason: str) -> bool:
        """:meth:`BlockerStore.open_once`; a failure is only logged — what the blocker is about is
        kept either way, and the next run tries again."""
        try:
            opened = self.ctx.blockers.open_once(wk, kind=kind, object_key=object_key, source="gc", reason=reason)
        except Exception as err:  # noqa: BLE001
            log.warning("gc: blocker %s not written (%s); kept", wk, err)
            return False
        if opened:
            self.ctx.metrics.add_metric(name="BlockersOpened", unit="Count", value=1)
        return opened

    def _prove_or_block(self, key: str, now_ns: int | None) -> Proof:
        """One bad candidate never stops a reap: a key that is not a raw blob key (a stray object
        under ``raw-blobs/v1/``, a malformed audit line) is kept as a ``reap-gc`` blocker."""
        try:
            return self.prove(key, now_ns=now_ns)
        except KeyLayoutError as exc:
            self._block_once(work_key(KIND_GC_CANDIDATE, key), KIND_GC_CANDIDATE, key, f"layout: {exc}")
            return Proof(key, "", False, KEEP_BLOCKED)

    def prove_all(self, keys: list[str], *, now_ns: int | None = None) -> list[Proof]:
        proofs = self._map(lambda k: self._prove_or_block(k, now_ns), keys)
        crashpoints.point(CP_PROVED)
        return proofs

    # -- mark ----------------------------------------------------------------------------------------
    @staticmethod
    def intent(proof: Proof, now_ns: int) -> Mark:
        """What is recorded (durably, before the marker) about a blob about to be marked."""
        assert proof.identity is not None and proof.deletable
        i = proof.identity
        mark = Mark(proof.key, proof.sha, proof.version_id, None, now_ns, proof.last_modified_unix_s, proof.reason)
        if proof.record_hour:  # rule G-R1: the re-check needs this hour's tombstone, nothing else
            return replace(mark, record_hour=proof.record_hour)
        return replace(mark, agent_hex=i.agent_hex, boot_hex=i.boot_hex, seq_start=i.seq_start, seq_end=i.seq_end)

    def mark(self, intents: list[Mark]) -> list[Mark]:
        """Place a delete marker on each intended blob (one DeleteObjects per 1,000, no version id);
        returns the intents with the marker ids. A marker S3 refused raises as its DeleteObject
        would have, after the whole page was sent: the intent stays, and is recovered (L3)."""
        if not intents:
            return []
        out = self._delete_objects([(m.key, None) for m in intents], CP_MARKED_ONE)
        for m in intents:
            err = out.error_for(m.key, None)
            if err is not None:
                raise err
        return [m.placed(out.deleted[(m.key, None)]) for m in intents]

    def recover(self, intents: list[Mark]) -> list[Mark]:
        """After a crash between the recorded intent and the recorded marks: find each marker
        that was placed; place the ones that were not (the settle's re-check after the grace
        covers the time since the proof, as for any mark)."""

        def one(m: Mark) -> tuple[Mark | None, bool]:
            """``(mark, whether its marker is still to be placed)``"""
            if m.marker_version_id:
                return m, False
            markers, exists = self.find_markers(m)
            if markers:
                return m.placed(markers[0]), False  # a restore finds the others again
            if not exists:
                return None, False  # the captured version is gone already: nothing to mark
            return m, True

        looked = self._map(one, intents)
        now = self.ctx.clock.now_ns()
        placed = iter(self.mark([m.at(now) for m, unplaced in looked if m is not None and unplaced]))
        return [next(placed) if unplaced else m for m, unplaced in looked if m is not None]

    def find_markers(self, m: Mark) -> tuple[list[str], bool]:
        """Crash recovery: the delete markers newer than the captured version, and whether the
        captured version still exists (one ListObjectVersions of the key)."""
        versions = self.ctx.store.versions_of(m.key)
        captured = [v for v in versions if not v.delete_marker and v.version_id == m.version_id]
        if not captured:
            return [], False
        after = captured[0].last_modified
        return [v.version_id for v in versions if v.delete_marker and v.last_modified >= after], True

    # -- settle --------------------------------------------------------------------------------------
    def due(self, marked_at_ns: int, now_ns: int) -> bool:
        """Whether marks recorded at ``marked_at_ns`` are past the grace at ``now_ns``."""
        return now_ns >= int(marked_at_ns) + self.grace_ns

    def settle(self, marks: list[Mark], *, now_ns: int | None = None) -> list[str]:
        """Purge or restore each due mark; returns ``"purged"``, ``"restored"`` or ``"kept:<reason>"``
        per mark. Idempotent: settling the same marks again does no harm (a crash in the middle)."""
        now = self.ctx.clock.now_ns() if now_ns is None else now_ns
        not_due = [m.key for m in marks if not self.due(m.marked_at_ns, now)]
        if not_due:
            raise ValueError(f"{len(not_due)} marks are inside the grace period, e.g. {not_due[0]}")
        plans = self._map(lambda m: self._plan_settle(m, now), marks)
        return self._carry_out(marks, plans)

    def recheck(self, m: Mark, now_ns: int) -> tuple[bool, str]:
        """Handshake step 4 for a recorded mark. A mark proven by a record naming the blob in a
        tombstoned hour carries that hour (rule G-R1): the record is immutable and the tombstone
        permanent, so the tombstone (cached per task) is all there is to check again."""
        if m.record_hour and m.reason == DELETE_HOUR_TOMBSTONED:
            if self.tombstones.is_tombstoned("raw", UtcHour.parse(m.record_hour)):
                return True, DELETE_HOUR_TOMBSTONED
            return False, KEEP_NOT_TOMBSTONED  # cannot happen (tombstones stay): restore, never guess
        return self.references(m.identity(), m.sha, now_ns)

    def _plan_settle(self, m: Mark, now_ns: int) -> "_Settling":
        """The re-check of one mark and what settling it deletes (nothing is deleted here)."""
        deletable, reason = self.recheck(m, now_ns)
        crashpoints.point(CP_RECHECKED)
        # The blob's discovery hint goes with it (verify flags an entry whose blob is gone).
        hint = self.codec.raw_blobs_by_time(UtcHour((int(m.lm_unix_s) // 3600) * 3600), m.sha)
        markers = [m.marker_version_id] if m.marker_version_id else None
        if markers is None:
            markers, exists = self.find_markers(m)
            if not markers and exists:
                # The marker was never placed (crash before DeleteObjects answered): nothing to undo.
                return _Settling(f"kept:{KEEP_MARK_NOT_PLACED}")
            if not markers:
                # The captured version is gone: an earlier settle of this mark purged it and died
                # before its hint went, so the hint goes now (G-I9).
                return _Settling("purged", hint=hint if deletable else None)
        if not deletable:
            # Every marker above the captured version goes, recorded or not: a retried invocation's
            # twin may have placed one more (rule L3), and any one of them hides the blob.
            found, _ = self.find_markers(m)
            return _Settling("restored", markers=list(dict.fromkeys([*markers, *found])), reason=reason)
        return _Settling("purged", version=m.version_id, markers=markers, hint=hint)

    def _carry_out(self, marks: list[Mark], plans: list["_Settling"]) -> list[str]:
        """The settle's deletes, in three DeleteObjects rounds, each after the one before answered:
        the captured versions, then the markers (purges and restores), then the purged blobs'
        hints. A mark whose delete S3 refused takes no further step (as a failed DeleteObject
        stopped its mark); the others are settled, then the first refusal is raised."""
        failed: dict[int, Exception] = {}

        def send(wanted: list[tuple[int, str, str | None]], point: str, tolerate: tuple[str, ...]) -> None:
            wanted = [w for w in wanted if w[0] not in failed]
            if not wanted:
                return
            out = self._delete_objects([(key, version) for _, key, version in wanted], point)
            for i, key, version in wanted:
                err = out.error_for(key, version, tolerate=tolerate)
                if err is not None and i not in failed:
                    failed[i] = err

        todo = list(enumerate(zip(marks, plans)))
        send([(i, m.key, p.version) for i, (m, p) in todo if p.version], CP_PURGED_VERSION, _GONE)
        send([(i, m.key, v) for i, (m, p) in todo for v in p.markers], CP_PURGED_MARKERS, _GONE)
        send([(i, p.hint, None) for i, (_, p) in todo if p.hint], CP_SETTLED_ONE, ())
        for i, (m, p) in todo:
            if i in failed or not p.markers:
                continue
            if p.result == "restored":
                self.ctx.metrics.add_metric(name="GcRestored", unit="Count", value=1)
                log.warning("gc restored %s: %s after it was marked (a race the handshake caught)", m.key, p.reason)
            else:
                self.ctx.metrics.add_metric(name="GcPurged", unit="Count", value=1)
        if failed:
            raise failed[min(failed)]
        return [p.result for p in plans]

    def _delete_objects(self, objects: list[tuple[str, str | None]], point: str) -> Any:
        """The one place GC deletes: DeleteObjects of up to 1,000 ``(key, version id or None)``
        each, every request right after the fence, the crash point ``point`` after each answer."""
        return self.ctx.store.delete_objects(objects, fence=self.fence,
                                             after_request=lambda: crashpoints.point(point))


@dataclass(frozen=True)
class _Settling:
    """What settling one mark does: its result, and the deletes it takes (``version``: the captured
    version to purge; ``markers``: delete markers to delete; ``hint``: the raw-blobs-by-time key)."""

    result: str
    version: str | None = None
    markers: list[str] = field(default_factory=list)
    hint: str | None = None
    reason: str = ""


__all__ = ["BlobCollector"]
