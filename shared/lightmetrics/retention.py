"""Retention of one acceptance hour: the crash-safe order of brief §7 (docs/protocol.md §16).

For an expired hour H (``LM_RETENTION_S``, by acceptance hour), the reap (``lightmetrics.reap``)
runs these steps in this order; each is idempotent, so a crash anywhere resumes by repeating it:

1. :meth:`HourRetention.commit` — requires the completeness watermark W of ``accepted-by-time``
   to cover H (else H is enumerated incompletely and is skipped); then the permanent tombstone
   ``retention/v1/raw/<H>/tombstone.json`` by conditional create, plus the control-table record
   ``retention#raw``/``<H>``. From here on no writer creates a derived entry in H
   (:class:`~lightmetrics.indexing.TombstoneCache`) and GC's proof "hour tombstoned" holds.
2. The blobs of H's accepted manifests, through the one deleter (:mod:`lightmetrics.gc`):
   :meth:`blob_keys` lists a page of ``accepted-by-time`` H and reads each record.
3. :meth:`delete_derived` — the ``accepted-by-blob`` entries of those records (the blobs'
   ``raw-blobs-by-time`` entries went with the purge).
4. :meth:`delete_by_time_page` — H's ``accepted-by-time`` entries, last: they are the enumeration.
5. :meth:`is_empty` — H's ``accepted-by-time`` lists empty; a late write (a writer whose
   cached tombstone answer was stale) sends the reap back to step 2, a bounded number of passes.
6. :meth:`mark_reaped` — the write-once ``reaped.json`` beside the tombstone, plus the record.

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

from typing import Any, Literal

from pydantic import Field

from lightmetrics import crashpoints
from lightmetrics.cas import create_object
from lightmetrics.control_table import ControlTable
from lightmetrics.derived import AcceptedByTimeEntry
from lightmetrics.errors import KeyLayoutError, ManifestError
from lightmetrics.keys import ROLLUP_WINDOWS, KeyKind, UtcHour
from lightmetrics.manifests import CanonicalModel
from lightmetrics.outcome import TransientWorkError
from lightmetrics.work import WorkContext

TOMBSTONE_SCHEMA = "lightmetrics.retention_tombstone.v1"
REAPED_SCHEMA = "lightmetrics.retention_reaped.v1"
RECORD_PK = "retention#raw"  # the rollup scope: retention#rollup

CP_TOMBSTONED = crashpoints.register("retention.tombstoned", "tombstone object written, control record not yet")
CP_COMMITTED = crashpoints.register("retention.committed", "tombstone and control record written")
CP_DERIVED_ONE = crashpoints.register("retention.derived-one", "one accepted-by-blob entry deleted")
CP_BY_TIME_ONE = crashpoints.register("retention.by-time-one", "one accepted-by-time entry deleted")
CP_REAPED_MARKER = crashpoints.register("retention.reaped-marker", "reaped marker written, control record not yet")
CP_ROLLUP_ONE = crashpoints.register("retention.rollup-object-one", "one rollup chunk, index or manifest deleted")


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


def expired_hours(ctx: WorkContext, *, retention_s: int, now_ns: int, limit: int = 24,
                  scope: str = "raw") -> list[UtcHour]:
    """Hours of ``accepted-by-time`` (scope ``rollup``: of ``manifests/v1/``) that ended more than
    ``retention_s`` ago and are not reaped yet."""
    root = ctx.codec.prefix + ("accepted-by-time/v1/" if scope == "raw" else "manifests/v1/")
    cutoff = now_ns - retention_s * 1_000_000_000
    out: list[UtcHour] = []
    for date_prefix in ctx.store.list_page(root, delimiter="/").prefixes:  # type: ignore[attr-defined]
        for hour_prefix in ctx.store.list_page(date_prefix, delimiter="/").prefixes:  # type: ignore[attr-defined]
            rel = hour_prefix[len(root):].rstrip("/")
            try:
                date, hour = rel.split("/")
                h = UtcHour.from_parts(date.removeprefix("date="), hour.removeprefix("hour="))
            except (ValueError, KeyLayoutError):
                continue
            if h.end_ns > cutoff:
                return out
            if ctx.store.head(ctx.codec.retention_reaped(scope, h)) is None:
                out.append(h)
                if len(out) >= limit:
                    return out
    return out


class HourRetention:
    """The steps of one hour's retention (module docstring); the reap orders and checkpoints them."""

    def __init__(self, ctx: WorkContext, hour: UtcHour, scope: str = "raw") -> None:
        self.ctx, self.hour, self.scope = ctx, hour, scope
        self.record_pk = f"retention#{scope}"
        self.codec = ctx.codec
        self.table: ControlTable = ctx.extras["table"]
        self.s3 = ctx.store.client  # type: ignore[attr-defined]

    @property
    def by_time_prefix(self) -> str:
        return self.codec.accepted_by_time_hour(self.hour)

    def watermark_covers(self) -> bool:
        from lightmetrics.walk import read_watermarks

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

    def page(self, after: str, limit: int) -> tuple[list[str], bool]:
        """One page of H's ``accepted-by-time`` keys after ``after``; and whether more follow."""
        listing = self.ctx.store.list_page(self.by_time_prefix, max_keys=limit,  # type: ignore[attr-defined]
                                           start_after=after or None)
        return listing.keys, listing.truncated

    def entry(self, by_time_key: str) -> AcceptedByTimeEntry | None:
        raw = self.ctx.store.get(by_time_key)
        if raw is None:
            return None
        try:
            return AcceptedByTimeEntry.from_bytes(raw)
        except ManifestError:
            return None

    def blob_keys(self, by_time_keys: list[str]) -> list[str]:
        """The raw blobs the records behind these entries name (the record is the authority)."""
        from lightmetrics.indexing import load_manifest

        out = []
        for key in by_time_keys:
            parsed = self.codec.parse(key)
            if parsed.kind is not KeyKind.ACCEPTED_BY_TIME or parsed.identity is None:
                continue
            manifest = load_manifest(self.ctx, self.codec.accepted(parsed.identity))
            if UtcHour.of_unix_ns(manifest.accepted_at_unix_ns) == self.hour:
                out.append(manifest.raw_blob_key)
        return out

    def delete_derived(self, by_time_keys: list[str]) -> int:
        """Step 3: the ``accepted-by-blob`` entry of each record of these entries."""
        n = 0
        for key in by_time_keys:
            parsed = self.codec.parse(key)
            entry = self.entry(key)
            if parsed.identity is None or entry is None:
                continue
            self.s3.delete_object(Bucket=self.ctx.store.bucket,
                                  Key=self.codec.accepted_by_blob(entry.frame_sha256, parsed.identity))
            crashpoints.point(CP_DERIVED_ONE)
            n += 1
        return n

    def delete_by_time_page(self, limit: int) -> tuple[int, bool]:
        """Step 4: delete one page of H's ``accepted-by-time`` entries; ``(deleted, more)``."""
        keys, more = self.page("", limit)
        for key in keys:
            self.s3.delete_object(Bucket=self.ctx.store.bucket, Key=key)
            crashpoints.point(CP_BY_TIME_ONE)
        return len(keys), more

    def is_empty(self) -> bool:
        """Step 5: H's ``accepted-by-time`` lists empty."""
        keys, _ = self.page("", 1)
        return not keys

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
        return ([f"{self.codec.prefix}rollup/v1/window={w}/{self.hour.partition}/" for w in ROLLUP_WINDOWS]
                + [f"{self.codec.prefix}index/v1/{self.hour.partition}/"])

    def delete_rollup_page(self, prefixes: list[str], limit: int) -> tuple[int, bool]:
        """Delete up to ``limit`` objects under the first non-empty prefix; ``(deleted, more)`` —
        ``more`` stays true until a call finds every prefix empty (deleted keys no longer list)."""
        for prefix in prefixes:
            keys = self.ctx.store.list_page(prefix, max_keys=limit).keys  # type: ignore[attr-defined]
            if keys:
                for key in keys:
                    self.s3.delete_object(Bucket=self.ctx.store.bucket, Key=key)
                    crashpoints.point(CP_ROLLUP_ONE)
                return len(keys), True
        return 0, False

    def rollup_empty(self) -> bool:
        prefixes = self.chunk_prefixes() + [self.codec.rollup_manifest_hour(self.hour)]
        return all(not self.ctx.store.list_page(p, max_keys=1).keys for p in prefixes)  # type: ignore[attr-defined]


__all__ = ["HourRetention", "ReapedMarker", "RetentionTombstone", "WatermarkBehind", "expired_hours",
           "REAPED_SCHEMA", "TOMBSTONE_SCHEMA"]
