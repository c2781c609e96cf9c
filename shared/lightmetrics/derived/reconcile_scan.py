"""One reconciler shard's pass over one ``accepted-by-time`` hour (docs/protocol.md §12 R7, R8).

:class:`HourScanner` lists the shard's range of the hour, leaves out entries verified before
(by the watermark, or by the run that left a cursor inside the hour), checks the rest on a pool
in slices of ``save_every`` and, between slices, has the caller save a cursor that lists every
RETRY_LATER failure behind it (:func:`cursor_listing_failures`). What the pass left behind is an
:class:`HourScan`. The run around it (checkpoint, caps, closing hours) is
:mod:`lightmetrics.derived.reconcile`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lightmetrics.derived.blob_lookups import HeadedBlobs, IndexedBlobs
from lightmetrics.derived.hour_ranges import RangePlan
from lightmetrics.derived.indexing import KIND_REPAIR, KIND_TIME_ENTRY, manifest_key_of_time_entry, verify_time_entry
from lightmetrics.derived.reconcile_state import ReconcileReport, failures_that_fit
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.work.outcome import Outcome, PermanentWorkError
from lightmetrics.work.pool import map_in_context
from lightmetrics.work.units import WorkContext, run_unit

_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="lm-reconcile")
_NS = 1_000_000_000

#: the plan of an hour when one shard runs (it reads no plan) or no plan governs it: the whole hour
ONE_RANGE = RangePlan(None)

#: Keys per ListObjectsV2 page.
LIST_PAGE_KEYS = 1000


def list_pages(keys: int) -> int:
    """The ListObjectsV2 requests a complete listing of ``keys`` keys takes (an empty one is one).

    >>> list_pages(0), list_pages(1000), list_pages(1001)
    (1, 1, 2)
    """
    return max(1, -(-keys // LIST_PAGE_KEYS))


@dataclass
class HourScan:
    """What one scanned hour left behind."""

    retry_later: bool = False
    newest_ns: int = 0
    failed_entries: set[str] = field(default_factory=set)  # RETRY_LATER or BLOCKED
    retry_later_entries: set[str] = field(default_factory=set)  # RETRY_LATER: the cursor never passes one unlisted
    checked: int = 0  # entries run, re-checks included: all count against the cap
    list_pages: int = 0  # listing pages sent for this hour (its own, and raw-blobs-by-time hours)
    stopped: bool = False  # the cap stopped it inside the hour
    stopped_after: str | None = None  # then: the key up to which the next run need not check again (None: none)
    #: a cursor's bound in this hour: its newest LastModified listed minus LM_RECONCILE_MARGIN_S (R7)
    cursor_bound_ns: int = 0
    moved_by_other_run: bool = False  # a save inside the hour found another run's checkpoint


#: ``save_inside(hour, cursor key, cursor bound, the scan so far)``: False if another run wrote first
SaveInside = Callable[[UtcHour, str, int, HourScan], bool]


def cursor_listing_failures(checked: list[str], retry_later: set[str], *, floor: str | None = None) -> str | None:
    """The in-hour cursor after ``checked`` (in key order) such that the checkpoint lists every
    RETRY_LATER failure behind it (R7): the last key, or the last before the first one that does
    not fit (the entries after it are checked again by the next run) — but never behind
    ``floor``, the cursor this run already has in the hour. None: not one entry. A BLOCKED
    entry never holds it back: its open blocker remembers it.

    >>> cursor_listing_failures(["a", "b", "c"], {"b"}, floor="a")
    'c'
    """
    failed_in_order = [k for k in checked if k in retry_later]
    fit = failures_that_fit(failed_in_order)
    if fit == len(failed_in_order):
        key: str | None = checked[-1]
    else:
        first_unlisted = checked.index(failed_in_order[fit])
        key = checked[first_unlisted - 1] if first_unlisted else None
    return floor if floor is not None and (key is None or key < floor) else key


def check_units(units: list[str], run: Callable[[str], Outcome]) -> list[Outcome]:
    """Run ``units`` on the pool; the outcomes in their order. If one raises, the units not
    started are cancelled and the started ones finish before the error goes up."""
    return map_in_context(_POOL, run, units)


class HourScanner:
    """Shard ``shard``'s scans of hours (R7, R8)."""

    def __init__(self, ctx: WorkContext, margin_s: int, shard: int) -> None:
        self.ctx, self.margin_s, self.shard = ctx, margin_s, shard

    def scan(self, hour: UtcHour, report: ReconcileReport, since_ns: int, failed_before: frozenset[str],
             all_failed_before: bool, indexed: IndexedBlobs | HeadedBlobs, cursor: tuple[str, int] | None,
             budget: int, save_every: int, save_inside: SaveInside, *, plan: RangePlan = ONE_RANGE) -> HourScan:
        """Check the hour's entries not verified before ``since_ns`` (nor, with ``cursor``, by the
        run that stopped inside this hour), at most ``budget`` of them, re-checks included, but at
        least one past the cursor (R7). Every ``save_every`` checks, unless the hour is done,
        ``save_inside(hour, cursor key, cursor bound, the scan so far)`` saves the progress; False
        (another run wrote the checkpoint) ends the scan. A cursor it places never moves back. An
        entry whose key is outside the layout is a unit too: it ends BLOCKED (kind
        ``accepted-by-time-entry``), never skipped. Only this shard's range of ``plan`` is listed
        (R8); a shard past the plan's ranges lists nothing."""
        report.hours_scanned.append(str(hour))
        if self.shard >= plan.ranges:
            return HourScan()  # nothing of this hour is this shard's
        scan, rechecks, units = self._list(hour, report, since_ns, failed_before, cursor, plan)
        room = max(budget - len(rechecks), 1)  # at least one past the cursor: every run moves it
        if len(units) > room:
            units = units[:room]
            scan.stopped = True
        units = rechecks + units  # in key order: the listing's
        scan.checked = len(units)
        if not units:
            return scan
        pages_before = indexed.pages_listed
        for h in (hour, hour + -1):  # a blob is written before its record: its hour or the one before
            indexed.load(h)
        scan.list_pages += indexed.pages_listed - pages_before

        def run(entry_key: str) -> Outcome:
            try:
                kind, object_key = KIND_REPAIR, manifest_key_of_time_entry(self.ctx, entry_key)
            except PermanentWorkError:
                kind, object_key = KIND_TIME_ENTRY, entry_key
            # Work key as before (``repair-accepted:<record>``): ``lmctl blockers retry`` runs the
            # full repair_accepted; the time-entry kind runs verify_time_entry (RUNNERS). An entry
            # that failed before gets the full check (no ``indexed`` shortcut past the blob's HEAD):
            # only that may resolve its blocker (§11 O4).
            return run_unit(self.ctx, kind=kind, object_key=object_key, source="reconcile",
                            fn=lambda: verify_time_entry(self.ctx, entry_key, indexed),
                            full_check=lambda: verify_time_entry(self.ctx, entry_key, indexed, shortcut=False),
                            previously_failed=all_failed_before or entry_key in failed_before).outcome

        saved_after = self._check_in_slices(hour, units, run, scan, report, cursor, save_every, save_inside)
        if scan.stopped and not scan.moved_by_other_run:
            scan.stopped_after = cursor_listing_failures(units, scan.retry_later_entries, floor=saved_after)
        return scan

    def _list(self, hour: UtcHour, report: ReconcileReport, since_ns: int, failed_before: frozenset[str],
              cursor: tuple[str, int] | None, plan: RangePlan) -> tuple[HourScan, list[str], list[str]]:
        """List this shard's range of the hour: the scan so far, the re-checks up to the cursor,
        and the entries past it not verified before."""
        prefix = self.ctx.codec.accepted_by_time_hour(hour)
        start_after, end_at = plan.key_bounds(prefix, self.shard)
        entries = self.ctx.store.list_modified(prefix, limit=10**9, start_after=start_after, end_at=end_at)
        rechecks, units = [], []  # rechecks: up to the cursor
        for key, modified_ns in entries:
            if modified_ns < since_ns:
                report.verified_earlier += 1
            elif cursor is not None and key <= cursor[0]:
                # The checkpoint lists every entry behind the cursor that failed (R7), whatever
                # ``failed_overflow`` says: only those, and those possibly in flight, are checked again.
                if modified_ns < cursor[1] and key not in failed_before:
                    report.verified_earlier += 1  # checked by the run that stopped here (R7)
                else:
                    rechecks.append(key)  # in flight at that listing, or failed since
            else:
                units.append(key)
        report.entries += len(entries)
        newest = max((m for _, m in entries), default=0)
        # A range with an upper bound may cost one page more: the one that passes its bound.
        pages = list_pages(len(entries)) + (1 if end_at is not None and entries and len(entries) % LIST_PAGE_KEYS == 0
                                            else 0)
        scan = HourScan(newest_ns=newest, list_pages=pages, cursor_bound_ns=newest - self.margin_s * _NS)
        return scan, rechecks, units

    @staticmethod
    def _check_in_slices(hour: UtcHour, units: list[str], run: Callable[[str], Outcome], scan: HourScan,
                         report: ReconcileReport, cursor: tuple[str, int] | None, save_every: int,
                         save_inside: SaveInside) -> str | None:
        """Check ``units`` in slices of ``save_every`` in key order, each finished before the next
        begins, so that a save covers every entry up to its cursor: a run killed later keeps them
        (R7). The cursor the checkpoint holds for this hour at the end (None: none); a save another
        run beat sets ``scan.moved_by_other_run`` and ends the scan."""
        saved_after = cursor[0] if cursor else None  # this hour's progress the checkpoint holds
        for first in range(0, len(units), save_every):
            part = units[first:first + save_every]
            for key, outcome in zip(part, check_units(part, run)):
                report.outcomes[outcome.value] += 1
                if outcome is Outcome.RETRY_LATER:
                    scan.retry_later = True
                    scan.retry_later_entries.add(key)
                if outcome in (Outcome.RETRY_LATER, Outcome.BLOCKED):
                    scan.failed_entries.add(key)
            done = first + len(part)
            if done == len(units):
                break  # the hour's save, or the run's, follows
            cursor_key = cursor_listing_failures(units[:done], scan.retry_later_entries, floor=saved_after)
            if cursor_key is not None and cursor_key != saved_after:
                if not save_inside(hour, cursor_key, scan.cursor_bound_ns, scan):
                    scan.moved_by_other_run = True
                    return saved_after
                saved_after = cursor_key
        return saved_after


__all__ = ["LIST_PAGE_KEYS", "ONE_RANGE", "HourScan", "HourScanner", "check_units", "cursor_listing_failures",
           "list_pages"]
