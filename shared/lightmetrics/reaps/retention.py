"""Retention of one acceptance hour: the crash-safe order of docs/protocol.md §16.

For an expired hour H (``LM_RETENTION_S``, by acceptance hour), the reap (``lightmetrics.reaps``)
runs these steps in this order; each is idempotent, so a crash anywhere resumes by repeating it:

1. :meth:`HourRetention.commit` — requires the completeness watermark W of ``accepted-by-time``
   to cover H (else H is enumerated incompletely and is skipped); then the permanent tombstone
   ``retention/v1/raw/<H>/tombstone.json`` by conditional create, plus the control-table record
   ``retention#raw``/``<H>``. From here on no writer creates a derived entry in H
   (:class:`~lightmetrics.derived.indexing.TombstoneCache`) and GC's proof "hour tombstoned" holds.
2. The blobs of H's accepted manifests, through the one deleter (:mod:`lightmetrics.reaps.gc`):
   :meth:`records` reads the record behind each entry of a page of ``accepted-by-time`` H.
3. and 4. :meth:`delete_page`, page by page — for each entry of one listing of H's
   ``accepted-by-time``: its record's ``accepted-by-blob`` entry (the blob's ``raw-blobs-by-time``
   entry went with the purge), then the entry itself, last (it is the enumeration). Only entries
   that listing returned are deleted (docs/protocol.md §16 R-I8): a late writer's entry (D5:
   ``accepted-by-blob`` first) listed there has its ``accepted-by-blob`` entry already, so both
   go; one written after the listing stays for step 5.
5. :meth:`leftovers` — H's ``accepted-by-time`` lists empty; a late write (a writer whose
   cached tombstone answer was stale) sends the reap back to step 2, a bounded number of passes.
6. :meth:`mark_reaped` — the write-once ``reaped.json`` beside the tombstone, plus the record.

An entry whose record is unreadable or vanished stops only itself: it becomes a blocker of kind
``reap-retention`` (:func:`lightmetrics.work.units.run_unit`), keeps its entry, and H stays tombstoned
but not reaped until an operator resumes (the next reap reads the record again) or skips it (its
derived entries go). :func:`expired_hours` finds such an unfinished H again from its control-table
record, however empty its prefixes list.

An hour whose range plan (:mod:`lightmetrics.derived.hour_ranges`) has R > 1 key ranges runs steps 2-4 on
each range apart, R at once (:mod:`lightmetrics.reaps.retention_ranges`): :meth:`page` takes the range's upper
bound, and the range's cursor starts at its lower one. Steps 1, 5 and 6 stay the hour's.

Every delete request is preceded by the reap's fence (``fence``; docs/protocol.md §13 L2). A page's
records' GETs run on ``concurrency`` threads; its deletes go in ``DeleteObjects`` requests of up to
1,000 keys (:meth:`lightmetrics.protocol.object_store.ObjectStore.delete_objects`): the page's ``accepted-by-blob`` entries, then,
once that answered, the ``accepted-by-time`` entries whose ``accepted-by-blob`` delete succeeded or
was not needed.

Rollup retention (scope ``rollup``, ``LM_ROLLUP_RETENTION_S``) uses the same discipline on the
rollup prefixes: tombstone ``retention/v1/rollup/<H>/`` (the rollup job never writes under it),
the hour's chunks and chunk index (:meth:`delete_rollup_page`), then its ``manifests/v1/``
generation manifests, verify empty (:meth:`rollup_empty`), reaped marker.

The accepted manifests stay (acceptance records are permanent): a late retry of a reaped batch
answers ``duplicate=true`` and its re-created blob is collected again by GC (proof "hour
tombstoned"). Tombstones and ``reaped`` markers are never deleted (the bucket policy denies it).

Example:
    >>> hr = HourRetention(ctx, UtcHour.parse("2026-08-01T13"))           # doctest: +SKIP
    >>> hr.commit(epoch=3, retention_s=7776000, now_ns=clock.now_ns())    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import Field

from lightmetrics.derived.hour_ranges import RangePlan, RangePlans
from lightmetrics.protocol.cas import create_object
from lightmetrics.protocol.control_store import ControlStore
from lightmetrics.protocol.derived_entries import AcceptedByTimeEntry
from lightmetrics.protocol.errors import KeyLayoutError, ManifestError, UnsupportedVersionError
from lightmetrics.protocol.keys import ROLLUP_WINDOWS, KeyKind, UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest, CanonicalModel
from lightmetrics.protocol.object_store import DeleteOutcome
from lightmetrics.work import crashpoints
from lightmetrics.work.blockers import BlockerStatus
from lightmetrics.work.outcome import Outcome, PermanentWorkError, TransientWorkError
from lightmetrics.work.pool import map_in_context
from lightmetrics.work.units import WorkContext, run_unit

TOMBSTONE_SCHEMA: Final = "lightmetrics.retention_tombstone.v1"
REAPED_SCHEMA: Final = "lightmetrics.retention_reaped.v1"
RECORD_PK = "retention#raw"  # the rollup scope: retention#rollup
#: The blocker kind of an ``accepted-by-time`` entry whose record retention cannot read.
KIND_RETENTION = "reap-retention"
#: At most this many leftover entries are listed when verifying an hour (blocked ones stay listed).
LEFTOVERS_LIMIT = 10_000
#: Requests of one page in flight at once, unless the reap's ``concurrency`` says otherwise.
DEFAULT_CONCURRENCY = 8

CP_TOMBSTONED = crashpoints.register("retention.tombstoned", "tombstone object written, control record not yet")
CP_COMMITTED = crashpoints.register("retention.committed", "tombstone and control record written")
# A "batch" is one DeleteObjects request (up to 1,000 keys); each point follows its answer.
CP_DERIVED_ONE = crashpoints.register(
    "retention.derived-one", "a batch of a page's accepted-by-blob entries deleted, its accepted-by-time entries not yet")
CP_BY_TIME_ONE = crashpoints.register("retention.by-time-one", "a batch of a page's accepted-by-time entries deleted")
CP_REAPED_MARKER = crashpoints.register("retention.reaped-marker", "reaped marker written, control record not yet")
CP_ROLLUP_ONE = crashpoints.register("retention.rollup-object-one", "one rollup chunk, index or manifest deleted")
CP_ENTRY_BLOCKED = crashpoints.register("retention.entry-blocked",
                                        "an entry's reap-retention blocker written, its page not yet recorded")


class RetentionTombstone(CanonicalModel):
    """``retention/v1/<scope>/date=.../hour=.../tombstone.json``: H is being (or was) reaped."""

    schema_: Literal["lightmetrics.retention_tombstone.v1"] = Field(TOMBSTONE_SCHEMA, alias="schema")
    version: int = Field(1, ge=1)
    scope: Literal["raw", "rollup"]
    hour: str
    created_at_unix_ns: int = Field(ge=0)
    retention_s: int = Field(ge=0)
    reap_epoch: int = Field(ge=0)


class ReapedMarker(CanonicalModel):
    """``.../reaped.json``: every derived entry of H is gone and the blobs were purged."""

    schema_: Literal["lightmetrics.retention_reaped.v1"] = Field(REAPED_SCHEMA, alias="schema")
    version: int = Field(1, ge=1)
    scope: Literal["raw", "rollup"]
    hour: str
    reaped_at_unix_ns: int = Field(ge=0)
    verify_passes: int = Field(ge=1)
    reap_epoch: int = Field(ge=0)


class WatermarkBehind(Exception):
    """W does not cover the hour: ``accepted-by-time`` may still miss entries of it."""


def unfinished_hours(table: ControlStore, scope: str = "raw") -> list[UtcHour]:
    """Hours whose retention was committed (tombstoned) but not finished, from their control-table
    records: a retention that failed part-way, or an hour left with an open blocker."""
    out = []
    for item in table.query(f"retention#{scope}"):
        if item.get("status") != "reaped":
            try:
                out.append(UtcHour.parse(str(item["sk"])))
            except ValueError:
                continue
    return sorted(out)


def expired_hours(ctx: WorkContext, *, retention_s: int, now_ns: int, limit: int = 24,
                  scope: str = "raw") -> list[UtcHour]:
    """The hours a retention run without ``hour`` takes on, oldest first, at most ``limit``: every
    unfinished one (:func:`unfinished_hours` — never from a listing: real S3 does not list a prefix
    whose keys are all deleted), then hours of ``accepted-by-time`` (scope ``rollup``: of
    ``manifests/v1/``) that ended more than ``retention_s`` ago and are not reaped yet."""
    unfinished = unfinished_hours(ctx.table, scope)
    new: list[UtcHour] = []
    root = ctx.codec.root(KeyKind.ACCEPTED_BY_TIME if scope == "raw" else KeyKind.ROLLUP_MANIFEST)
    cutoff = now_ns - retention_s * 1_000_000_000

    def listed() -> None:
        for date_prefix in ctx.store.list_page(root, delimiter="/").prefixes:
            for hour_prefix in ctx.store.list_page(date_prefix, delimiter="/").prefixes:
                rel = hour_prefix[len(root):].rstrip("/")
                try:
                    date, hour = rel.split("/")
                    h = UtcHour.from_parts(date.removeprefix("date="), hour.removeprefix("hour="))
                except (ValueError, KeyLayoutError):
                    continue
                if h.end_ns > cutoff:
                    return
                if h not in unfinished and ctx.store.head(ctx.codec.retention_reaped(scope, h)) is None:
                    new.append(h)
                    if len(new) >= limit:
                        return

    listed()
    # Unfinished hours first, but never all of the slots while new hours wait: hours held by open
    # blockers must not stop retention of every hour after them.
    take = unfinished[:max(limit - len(new), limit - limit // 2)]
    return sorted(take + new[:limit - len(take)])


@dataclass
class PageRecords:
    """What the records behind a page of H's ``accepted-by-time`` entries say."""

    #: entry key -> its readable acceptance record, accepted in H
    records: dict[str, AcceptedBatchManifest] = field(default_factory=dict)
    #: entry keys whose ``reap-retention`` blocker is open: kept, entry and everything it names
    blocked: list[str] = field(default_factory=list)
    #: entry keys whose blocker an operator skipped: their derived entries go, nothing else
    skipped: list[str] = field(default_factory=list)

    @property
    def blob_keys(self) -> list[str]:
        return [m.raw_blob_key for m in self.records.values()]


class HourRetention:
    """The steps of one hour's retention (module docstring); the reap orders and checkpoints them."""

    def __init__(self, ctx: WorkContext, hour: UtcHour, scope: str = "raw", *,
                 fence: Callable[[], None] | None = None, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.ctx, self.hour, self.scope = ctx, hour, scope
        self.record_pk = f"retention#{scope}"
        self.codec = ctx.codec
        self.table: ControlStore = ctx.table
        self.fence = fence or (lambda: None)
        self.concurrency = max(1, concurrency)

    def _each(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        """``[fn(i) for i in items]`` on up to ``concurrency`` threads, each in a copy of the caller's
        context (request counting, host overrides); the first failure is raised once the requests
        already running have ended, and the ones not started yet are dropped."""
        items = list(items)
        if self.concurrency == 1 or len(items) <= 1:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items)),
                                thread_name_prefix="lm-retention") as pool:
            return map_in_context(pool, fn, items)

    def _delete(self, key: str) -> None:
        """A rollup object's ``DeleteObject``: only right after the fence."""
        self.fence()
        self.ctx.store.delete(key)

    def _delete_objects(self, keys: list[str], point: str) -> DeleteOutcome:
        """The one place retention deletes derived entries: the keys (no version id: a delete
        marker each) in DeleteObjects requests of up to 1,000, each right after the fence, crash
        point ``point`` after each answer. Nothing to delete: no request."""
        return self.ctx.store.delete_objects([(k, None) for k in keys], fence=self.fence,
                                             after_request=lambda: crashpoints.point(point))

    @property
    def by_time_prefix(self) -> str:
        return self.codec.accepted_by_time_hour(self.hour)

    def watermark_covers(self) -> bool:
        from lightmetrics.derived.walk import read_watermarks

        w = read_watermarks(self.table).get("accepted-by-time")
        return w is not None and w >= self.hour.end_ns

    def commit(self, *, epoch: int, retention_s: int, now_ns: int) -> None:
        """Step 1 (tombstone + record); raises :class:`WatermarkBehind` if W does not cover H (raw
        scope only: rollup data is enumerated by listing its own prefixes)."""
        if self.scope == "raw" and not self.watermark_covers():
            raise WatermarkBehind(f"the completeness watermark does not cover {self.hour}; run a full walk first")
        body = RetentionTombstone(scope=self.scope, hour=str(self.hour), created_at_unix_ns=now_ns,  # type: ignore[arg-type]
                                  retention_s=retention_s, reap_epoch=epoch).to_bytes()
        result = create_object(self.ctx.store, self.codec.retention_tombstone(self.scope, self.hour), body,
                               policy=self.ctx.policy)
        if not result.outcome.is_final:
            raise TransientWorkError(f"tombstone of {self.hour} not written ({result.detail})")
        crashpoints.point(CP_TOMBSTONED)
        self.table.update(self.record_pk, str(self.hour), "SET #st = if_not_exists(#st, :st), #t = if_not_exists(#t, :now), "
                          "#ep = :ep", names={"#st": "status", "#t": "tombstoned_at_ns", "#ep": "epoch"},
                          values={":st": "tombstoned", ":now": now_ns, ":ep": epoch})
        crashpoints.point(CP_COMMITTED)

    def page(self, after: str, limit: int, *, end_at: str | None = None) -> tuple[list[str], bool]:
        """One page of H's ``accepted-by-time`` keys after ``after`` (and up to ``end_at``, inclusive:
        a key range's upper bound, :meth:`~lightmetrics.derived.hour_ranges.RangePlan.key_bounds`); and
        whether more follow. A range's last page costs no extra listing unless it ends exactly at a
        page's end with keys of the next range after it (then one empty page)."""
        listing = self.ctx.store.list_page(self.by_time_prefix, max_keys=limit,
                                           start_after=after or None)
        if end_at is None:
            return listing.keys, listing.truncated
        keys = [k for k in listing.keys if k <= end_at]
        return keys, listing.truncated and len(keys) == len(listing.keys) and (not keys or keys[-1] < end_at)

    def plan(self) -> RangePlan:
        """How H is split into key ranges for a parallel reap (:mod:`lightmetrics.derived.hour_ranges`; one
        Query). A plan of an expired hour never changes: plans are write-once and take effect at
        least two hours after they are written."""
        return RangePlans(self.table).plan_for(self.hour)

    def entry(self, by_time_key: str) -> AcceptedByTimeEntry | None:
        raw = self.ctx.store.get(by_time_key)
        if raw is None:
            return None
        try:
            return AcceptedByTimeEntry.from_bytes(raw)
        except UnsupportedVersionError:
            raise  # a newer writer's entry is never read as absent (protocol §17 E3): upgrade the reap
        except ManifestError:
            return None  # unreadable: only skipped entries are read here, whose derived entry then stays

    def blocker_statuses(self) -> dict[str, BlockerStatus]:
        """Entry key -> the status of its ``reap-retention`` blocker, for H (one Query)."""
        prefix = self.by_time_prefix
        return {b.object_key: b.status for b in self.ctx.blockers.list(status=None)
                if b.kind == KIND_RETENTION and b.object_key.startswith(prefix)}

    def records(self, by_time_keys: list[str], *, recheck_open: bool = True) -> PageRecords:
        """The record behind each entry (the record is the authority), each read as one unit of
        work (:func:`~lightmetrics.work.units.run_unit`): unreadable or vanished → a blocker, and the
        entry is kept; a transient failure fails the page (the task is retried, the retry budget
        counts it). An entry with an open blocker is read again (a success resolves the blocker,
        docs/protocol.md §11 O4) unless ``recheck_open`` is False: steps 3-4 keep an entry that was
        blocked when step 2 passed it, since its blob was not collected; skipped ones are reported
        as such. The reads run concurrently (``concurrency``); the result keeps the order of
        ``by_time_keys``."""
        from lightmetrics.derived.indexing import load_manifest

        statuses = self.blocker_statuses()

        def read(key: str) -> tuple[BlockerStatus | None, AcceptedBatchManifest | None]:
            # ``(the entry's blocker status, None)`` when it is not read, ``(None, its record)`` when it is
            status = statuses.get(key)
            if status is BlockerStatus.SKIPPED or (status is BlockerStatus.OPEN and not recheck_open):
                return status, None
            found: dict[str, AcceptedBatchManifest] = {}

            def load() -> Outcome:
                try:
                    parsed = self.codec.parse(key)
                except KeyLayoutError as exc:
                    raise PermanentWorkError(str(exc), kind="layout") from None
                if parsed.kind is not KeyKind.ACCEPTED_BY_TIME or parsed.identity is None:
                    raise PermanentWorkError(f"{key} is not an accepted-by-time entry", kind="layout")
                found["record"] = load_manifest(self.ctx, self.codec.accepted(parsed.identity))
                return Outcome.DONE

            # An open blocker is checked again (O4): a success resolves it, and the entry is reaped.
            result = run_unit(self.ctx, kind=KIND_RETENTION, object_key=key, source="reap", fn=load,
                              previously_failed=status is not None and status.pending)
            if result.outcome is Outcome.BLOCKED:
                crashpoints.point(CP_ENTRY_BLOCKED)
                return BlockerStatus.OPEN, None
            if result.outcome is Outcome.RETRY_LATER:
                raise TransientWorkError(f"{result.work_key}: {result.detail}")
            return None, found["record"]

        out = PageRecords()
        for key, (what, record) in zip(by_time_keys, self._each(read, by_time_keys)):
            if what is BlockerStatus.OPEN:
                out.blocked.append(key)
            elif what is BlockerStatus.SKIPPED:
                out.skipped.append(key)
            elif record is not None and UtcHour.of_unix_ns(record.accepted_at_unix_ns) == self.hour:
                out.records[key] = record  # a record of another hour is not H's to reap: its entry only
        return out

    def delete_page(self, by_time_keys: list[str]) -> int:
        """Steps 3 and 4 for one listing of H's ``accepted-by-time`` (rule R-I8): for each entry, the
        ``accepted-by-blob`` entry of its record (of a skipped entry: the one its entry names, if it
        reads), then the entry. An entry with an open blocker keeps both; entries the listing did not
        return are not touched, so a late writer's entry stays for step 5. Returns how many
        ``accepted-by-time`` entries were deleted.

        Example:
            >>> keys, more = hr.page(after, 1000)                            # doctest: +SKIP
            >>> hr.delete_page(keys)                                         # doctest: +SKIP
            998
        """
        page = self.records(by_time_keys, recheck_open=False)
        blocked = set(page.blocked)

        def by_blob_of(key: str) -> str | None:
            if key in page.records:
                m = page.records[key]
                return self.codec.accepted_by_blob(m.frame_sha256, m.identity)
            if key in page.skipped:
                try:
                    identity = self.codec.parse(key).identity
                except KeyLayoutError:
                    return None  # a key outside the layout (R-I5) names no accepted-by-blob entry: it alone goes
                entry = self.entry(key)
                if entry is not None and identity is not None:
                    return self.codec.accepted_by_blob(entry.frame_sha256, identity)
            return None

        # In this order: the entry is the enumeration of its accepted-by-blob entry, so it goes only
        # once that delete answered, and only if it succeeded (or there was none to delete).
        doomed = [k for k in by_time_keys if k not in blocked]
        by_blob = dict(zip(doomed, self._each(by_blob_of, doomed)))
        wanted = [b for b in by_blob.values() if b is not None]
        blobs_out = self._delete_objects(wanted, CP_DERIVED_ONE)
        ready = [k for k in doomed if by_blob[k] is None or (by_blob[k], None) in blobs_out.deleted]
        times_out = self._delete_objects(ready, CP_BY_TIME_ONE)
        # A key S3 refused fails the page as its DeleteObject did (transient: the task is retried;
        # access denied: the same error), once every other entry of the page was handled.
        refused = [e for out, keys in ((blobs_out, wanted), (times_out, ready)) for k in keys
                   if (e := out.error_for(k, None)) is not None]
        if refused:
            raise refused[0]
        return len(ready)

    def leftovers(self) -> tuple[list[str], list[str]]:
        """Step 5: H's ``accepted-by-time`` entries still listed: ``(late, blocked)`` — late
        writes, and entries kept for an open blocker. H is done when both are empty."""
        keys = self.ctx.store.list_keys(self.by_time_prefix, limit=LEFTOVERS_LIMIT)
        statuses = self.blocker_statuses()
        blocked = [k for k in keys if statuses.get(k) is BlockerStatus.OPEN]
        return [k for k in keys if statuses.get(k) is not BlockerStatus.OPEN], blocked

    def mark_reaped(self, *, epoch: int, passes: int, now_ns: int) -> None:
        """Step 6: the write-once ``reaped`` marker, then the record."""
        body = ReapedMarker(scope=self.scope, hour=str(self.hour), reaped_at_unix_ns=now_ns,  # type: ignore[arg-type]
                            verify_passes=passes, reap_epoch=epoch).to_bytes()
        result = create_object(self.ctx.store, self.codec.retention_reaped(self.scope, self.hour), body,
                               policy=self.ctx.policy)
        if not result.outcome.is_final:
            raise TransientWorkError(f"reaped marker of {self.hour} not written ({result.detail})")
        crashpoints.point(CP_REAPED_MARKER)
        self.table.update(self.record_pk, str(self.hour), "SET #st = :st, #r = :now, #ep = :ep",
                          names={"#st": "status", "#r": "reaped_at_ns", "#ep": "epoch"},
                          values={":st": "reaped", ":now": now_ns, ":ep": epoch})

    def record(self) -> dict[str, Any] | None:
        return self.table.get(self.record_pk, str(self.hour))

    # -- rollup scope (LM_ROLLUP_RETENTION_S): tombstone, chunks, then manifests, verify, reaped -----
    def chunk_prefixes(self) -> list[str]:
        """The hour's rollup chunks (every window) and its chunk index."""
        return ([self.codec.rollup_window_hour(w, self.hour) for w in ROLLUP_WINDOWS]
                + [self.codec.rollup_index_hour(self.hour)])

    def delete_rollup_page(self, prefixes: list[str], limit: int) -> tuple[int, bool]:
        """Delete up to ``limit`` objects under the first non-empty prefix; ``(deleted, more)`` —
        ``more`` stays true until a call finds every prefix empty (deleted keys no longer list)."""
        for prefix in prefixes:
            keys = self.ctx.store.list_page(prefix, max_keys=limit).keys
            if keys:
                for key in keys:
                    self._delete(key)
                    crashpoints.point(CP_ROLLUP_ONE)
                return len(keys), True
        return 0, False

    def rollup_empty(self) -> bool:
        prefixes = self.chunk_prefixes() + [self.codec.rollup_manifest_hour(self.hour)]
        return all(not self.ctx.store.list_page(p, max_keys=1).keys for p in prefixes)


__all__ = ["HourRetention", "KIND_RETENTION", "PageRecords", "ReapedMarker", "RetentionTombstone", "WatermarkBehind",
           "expired_hours", "unfinished_hours", "REAPED_SCHEMA", "TOMBSTONE_SCHEMA"]
