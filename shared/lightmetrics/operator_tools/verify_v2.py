"""``lmctl verify``'s reading of derived state v2 (docs/protocol.md §4.10, §9.1): the listed v2 keys
grouped by part-hour, each part-hour read as every reader reads it
(:meth:`lightmetrics.derived.hour_entries.HourReader.sources`: the newest seal by ranged GETs,
a GET per segment it does not cover — no second listing), the hour's sources folded (V-D7).

A refused object is a ``segment`` finding naming its key and reason, two unequal entries a
``segment-conflict`` naming both sources; a refused part-hour contributes no entries (its
records then also show as missing their entry: the refusal is the cause).

Example:
    >>> got = read_v2(ctx, {"accepted-by-time/v2/": {}}, pool)     # doctest: +SKIP
    >>> got.refusals, got.entries                                   # doctest: +SKIP
    ([], [])
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lightmetrics.derived.hour_entries import HourReader
from lightmetrics.operator_tools import invariants as inv
from lightmetrics.protocol.errors import (
    KeyLayoutError,
    SegmentConflictError,
    SegmentError,
    SegmentLayoutError,
    UnsupportedVersionError,
)
from lightmetrics.protocol.keys import KeyCodec, UtcHour
from lightmetrics.protocol.object_store import ObjectStore
from lightmetrics.protocol.segment_entries import SegmentEntry, fold_entries
from lightmetrics.protocol.segment_keys import V2_ROOTS, SegmentIndex, SegmentKeyCodec
from lightmetrics.work.pool import map_in_context
from lightmetrics.work.units import WorkContext

#: the v2 roots verify lists, relative to the namespace
V2_LISTED = tuple(V2_ROOTS.values())

Source = tuple[str, list[SegmentEntry], bool]


@dataclass
class V2Read:
    """``refusals``: ``(rule, keys, detail)``; ``entries``: ``(index, hour, source key, entry)`` of
    every part-hour read, each entry key once per hour; ``objects``: the v2 keys listed."""

    refusals: list[tuple[inv.Rule, list[str], str]] = field(default_factory=list)
    entries: list[tuple[SegmentIndex, UtcHour, str, SegmentEntry]] = field(default_factory=list)
    objects: int = 0


def list_sized(store: ObjectStore, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` with its size (a LIST per 1,000 keys)."""
    out: dict[str, int] = {}
    token: str | None = None
    while True:
        page = store.list_page(prefix, continuation_token=token)
        out.update(zip(page.keys, page.sizes))
        if not (page.truncated and page.next_token):
            return out
        token = page.next_token


def read_v2(ctx: WorkContext, listed: dict[str, dict[str, int]], pool: ThreadPoolExecutor) -> V2Read:
    """Read every part-hour of the v2 listings ``{root: {key: size}}`` (roots as in :data:`V2_LISTED`)."""
    return read_v2_objects(ctx.store, ctx.codec, listed, pool)


def read_v2_objects(store: ObjectStore, codec: KeyCodec, listed: dict[str, dict[str, int]],
                    pool: ThreadPoolExecutor) -> V2Read:
    """:func:`read_v2` through a store and codec alone (the harness's ledger reads with no work context)."""
    keys, reader, out = SegmentKeyCodec(codec.prefix), HourReader(store, codec), V2Read()
    groups: dict[tuple[SegmentIndex, UtcHour, int], list[tuple[str, int]]] = defaultdict(list)
    for root in V2_LISTED:
        for key, size in listed.get(root, {}).items():
            out.objects += 1
            try:
                parsed = keys.parse(key)
            except KeyLayoutError as exc:
                out.refusals.append((inv.SEGMENT, [key], f"key outside the layout: {exc}"))
                continue
            groups[(parsed.index, parsed.hour, parsed.part)].append((key, size))

    def read(item: tuple[tuple[SegmentIndex, UtcHour, int], list[tuple[str, int]]]) -> list[Source] | SegmentError:
        (index, hour, part), part_listed = item
        try:
            return reader.sources(part_listed)
        except UnsupportedVersionError as exc:  # a newer writer's object: refused here all the same
            return SegmentLayoutError(keys.part_hour(index, part, hour), f"unsupported version: {exc}")
        except SegmentError as exc:
            return exc

    by_hour: dict[tuple[SegmentIndex, UtcHour], list[Source]] = defaultdict(list)
    for (index, hour, _), got in zip(groups, map_in_context(pool, read, list(groups.items()))):
        if isinstance(got, SegmentError):
            out.refusals.append(_refusal(got))
        else:
            by_hour[(index, hour)].extend(got)
    for (index, hour), sources in by_hour.items():
        try:
            fold_entries(sources)
        except SegmentConflictError as exc:
            out.refusals.append(_refusal(exc))
        seen: set[str] = set()
        for source, entries, _ in sources:
            for entry in entries:
                if entry.entry_key not in seen:
                    seen.add(entry.entry_key)
                    out.entries.append((index, hour, source, entry))
    return out


def _refusal(exc: SegmentError) -> tuple[inv.Rule, list[str], str]:
    if isinstance(exc, SegmentConflictError):
        return inv.SEGMENT_CONFLICT, [exc.key, exc.other], exc.reason
    return inv.SEGMENT, [exc.key], exc.reason


__all__ = ["V2Read", "V2_LISTED", "list_sized", "read_v2", "read_v2_objects"]
