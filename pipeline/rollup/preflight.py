"""What a rollup run can do, found before Spark starts: which asked hours hold batches, which are
still open and when they close, and whether anything is left to do at all.

A rollup reads closed hours only (docs/pipeline.md §6): an hour is closed once the reconciler's
checkpoint has passed it, which it does at its first run after the hour has ended and the settle
window (``LM_SETTLE_S``) has passed. An operator who asks for an open hour, or whose default window
of closed hours holds no batch, is told so in a few S3 listings — not after Spark has started.

Example:
    >>> pre = preflight(store, codec, asked, first_open=checkpoint, now_hour=now,  # doctest: +SKIP
    ...                 settle_s=900, explicit=True)
    >>> pre.with_data, pre.notes                                                  # doctest: +SKIP
    ([], ['2026-12-06T21 was asked for but is open (...): it closes at ...'])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from lightmetrics.protocol.keys import UtcHour, hours_between
from lightmetrics.protocol.segment_keys import SegmentIndex, SegmentKeyCodec

#: at most this many open hours (the oldest: they close first) are looked at for data
OPEN_HOURS_SHOWN = 6


@dataclass
class Preflight:
    """``closed``: the asked hours a run may roll up; of them ``with_data`` hold batches or a
    committed rollup. ``asked_open``: asked hours that are open; ``open_with_data``: open hours (up
    to the current one) that hold batches. ``notes`` say it in words."""

    first_open: UtcHour | None
    closed: list[UtcHour] = field(default_factory=list)
    with_data: list[UtcHour] = field(default_factory=list)
    asked_open: list[UtcHour] = field(default_factory=list)
    open_with_data: list[UtcHour] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"first_open": str(self.first_open) if self.first_open else None,
                "closed_with_data": [str(h) for h in self.with_data],
                "asked_open": [str(h) for h in self.asked_open],
                "open_with_data": [str(h) for h in self.open_with_data], "notes": list(self.notes)}


def _holds(store: Any, prefix: str) -> bool:
    return bool(store.list_page(prefix, max_keys=1).keys)


def _holds_batches(store: Any, codec: Any, hour: UtcHour, parts: Sequence[int]) -> bool:
    """Does ``hour`` index a batch, in v1 or in one of the v2 ``parts``? (A v2-only hour taken for
    empty would be left out of the rollup silently: docs/design/derived-state-v2.md §10.)"""
    keys = SegmentKeyCodec(codec.prefix)
    return _holds(store, codec.accepted_by_time_hour(hour)) \
        or any(_holds(store, keys.part_hour(SegmentIndex.ACCEPTED_BY_TIME, p, hour)) for p in parts)


def closes_at(hour: UtcHour, settle_s: int) -> str:
    """The earliest time the reconciler can close ``hour``: its end plus the settle window."""
    at = datetime.fromtimestamp(hour.start_unix_s + 3600 + settle_s, tz=timezone.utc)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def preflight(store: Any, codec: Any, asked: list[UtcHour], *, first_open: UtcHour | None, now_hour: UtcHour,
              settle_s: int, explicit: bool, allow_open: bool = False, parts: Sequence[int] = ()) -> Preflight:
    """Two listings of one key at most per asked hour (its accepted-by-time hour, then its rollup
    manifests) and one per open hour up to ``now_hour``: no Spark, no full listing. ``parts``: the
    v2 parts (``inputs.v2_parts``); an hour empty in v1 is then listed in each (one key)."""
    pre = Preflight(first_open)
    for h in sorted(set(asked)):
        if not allow_open and (first_open is None or h >= first_open):
            pre.asked_open.append(h)
            continue
        pre.closed.append(h)
        if _holds_batches(store, codec, h, parts) or _holds(store, codec.rollup_manifest_hour(h)):
            pre.with_data.append(h)
    if not allow_open:
        # the oldest open hours close first; a reconciler far behind leaves many, the note names a few
        start = first_open if first_open is not None else now_hour
        open_hours = hours_between(start, min(now_hour, start + (OPEN_HOURS_SHOWN - 1)))
        pre.open_with_data = [h for h in open_hours if _holds_batches(store, codec, h, parts)]
    pre.notes = _notes(pre, settle_s, explicit)
    return pre


def _notes(pre: Preflight, settle_s: int, explicit: bool) -> list[str]:
    notes = []
    checkpoint = (f"the reconciler has closed the hours before {pre.first_open}" if pre.first_open is not None
                  else "the reconciler has closed no hour yet")
    for h in sorted(set(pre.asked_open) | set(pre.open_with_data)):
        holds = "holds batches" if h in pre.open_with_data else "was asked for"
        notes.append(f"{h} {holds} but is open ({checkpoint}): it closes at the reconciler's first run after "
                     f"{closes_at(h, settle_s)} (the hour's end + LM_SETTLE_S {settle_s} s); run `lmctl reconcile` "
                     f"then and roll up again (`--allow-open-hour` rolls it up now; the demo's switch: a later run "
                     f"supersedes that generation)")
    empty = [h for h in pre.closed if h not in pre.with_data]
    if empty:
        span = f"{empty[0]}" if len(empty) == 1 else f"{empty[0]} to {empty[-1]}"
        hours, hold = ("closed hours", "hold") if len(empty) > 1 else ("closed hour", "holds")
        notes.append(f"{len(empty)} {hours} looked at ({span}) {hold} no batch and no rollup: nothing to roll up there")
    if not pre.closed and not explicit:
        notes.append(f"no closed hour to roll up ({checkpoint})")
    return notes


__all__ = ["OPEN_HOURS_SHOWN", "Preflight", "closes_at", "preflight"]
