"""GC's candidate sources (docs/reaps.md, "Sources"; docs/protocol.md §15 G-B1, G-B3): where a GC
page's candidate blob keys come from — ``scan`` (a listing of ``raw-blobs/v1/``), ``by-time``
(``raw-blobs-by-time`` hours older than the retry horizon) or ``audit`` (the Spark audit's
confirmed orphan candidates) — one :class:`~lightmetrics.reaps.mark_settle.CandidatePage` a call,
after the source's cursor. Every candidate is proven again from authoritative reads
(:mod:`lightmetrics.reaps.gc`); a source only proposes.

Example::

    >>> GcSources(ctx, settings).page("scan", after="", limit=500).keys[:1]                     # doctest: +SKIP
    ['raw-blobs/v1/ab/ab...']
"""

from __future__ import annotations

import json
from contextlib import closing
from typing import Any

from lightmetrics.protocol.errors import KeyLayoutError
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.reaps.errors import InvalidReapInput
from lightmetrics.reaps.mark_settle import CandidatePage
from lightmetrics.work.units import WorkContext

_NS = 1_000_000_000


class GcSources:
    """The GC role's candidate sources over a :class:`WorkContext`."""

    def __init__(self, ctx: WorkContext, settings: Any) -> None:
        self.ctx, self.settings, self.codec = ctx, settings, ctx.codec

    def page(self, source: str, *, after: str, limit: int, hour: str | None = None,
             audit_run: str | None = None) -> CandidatePage:
        """One page of candidate blob keys of ``source`` after the cursor ``after``."""
        if source == "audit":
            return self._audit(str(audit_run), after, limit)
        if source == "by-time":
            return self._by_time(after, limit, hour)
        listing = self.ctx.store.list_page(self.codec.root(KeyKind.RAW_BLOB), max_keys=limit, start_after=after or None)
        return CandidatePage(listing.keys, listing.keys[-1] if listing.keys else after, listing.truncated)

    def _by_time(self, after: str, limit: int, hour: str | None) -> CandidatePage:
        """``raw-blobs-by-time`` hours older than the retry horizon; ``through``: the first hour not yet
        proven (rule G-B1)."""
        root = self.codec.root(KeyKind.RAW_BLOBS_BY_TIME)
        prefix = self.codec.raw_blobs_by_time_hour(UtcHour.parse(hour)) if hour else root
        listing = self.ctx.store.list_page(prefix, max_keys=limit, start_after=after or None)
        horizon = UtcHour.of_unix_ns(self.ctx.clock.now_ns() - int(self.settings.retry_horizon_s) * _NS)
        out, last = [], after
        for key in listing.keys:
            try:
                parsed = self.codec.parse(key)
            except KeyLayoutError:
                out.append(key)  # not ours: GC opens its blocker and goes on (rule D4)
                last = key
                continue
            if parsed.hour is not None and parsed.hour >= horizon:
                # Keys are in hour order: the rest are too young. Every due hour is proven.
                return CandidatePage(out, last, False, through=str(horizon))
            out.append(self.codec.raw_blob(parsed.sha256 or ""))
            last = key
        if not listing.truncated:
            return CandidatePage(out, last, False, through=str(horizon))
        # Hours before the last key's are proven (rule G-B1: the first hour not yet proven).
        try:
            through = self.codec.parse(last).hour
        except KeyLayoutError:
            through = None
        return CandidatePage(out, last, True, through=str(through) if through else None)

    def _audit(self, audit_run: str, after: str, limit: int) -> CandidatePage:
        """The Spark audit's confirmed orphan candidates, ``limit`` lines a page whatever the size of
        its part files. The cursor is ``<part key>#<byte offset>`` inside a part, or the last finished
        part's key; a page reads its lines with one ranged GET from the offset."""
        run = self.codec.audit_run(audit_run)
        if self.ctx.store.head(f"{run}summary.json") is None:
            raise InvalidReapInput(f"audit run {audit_run} is not committed (no summary.json)")
        parts_prefix = f"{run}orphan-blob-candidates/"
        part, _, offset = after.rpartition("#")
        if not (part.startswith(parts_prefix) and offset.isdigit()):
            listing = self.ctx.store.list_page(parts_prefix, max_keys=1, start_after=after or None)
            if not listing.keys:
                return CandidatePage([], after, False)
            part, offset = listing.keys[0], "0"
        keys, end, finished = self._audit_lines(part, int(offset), limit)
        if not finished:
            return CandidatePage(keys, f"{part}#{end}", True)
        following = self.ctx.store.list_page(parts_prefix, max_keys=1, start_after=part)
        return CandidatePage(keys, part, bool(following.keys))

    def _audit_lines(self, part: str, offset: int, limit: int) -> tuple[list[str], int, bool]:
        """Up to ``limit`` blob keys of the part file from byte ``offset``: ``(keys, offset after
        them, whether the file ended)``; reads only as far as it needs."""
        keys: list[str] = []
        with closing(self.ctx.store.lines_from(part, offset)) as lines:
            for line in lines:
                if len(keys) >= limit:
                    return keys, offset, False
                start, offset = offset, offset + len(line)
                if line.strip():
                    try:
                        keys.append(str(json.loads(line)["blob_key"]))
                    except (ValueError, KeyError, TypeError):
                        keys.append(f"{part}#{start}")  # not a blob key: GC blocks it and goes on
        return keys, offset, True


__all__ = ["GcSources"]
