"""The steady-state reconciler: repairs what hangs off ``accepted-by-time`` since a checkpoint.

Events get lost; the reconciler is what makes derived state converge anyway (docs/protocol.md §12). Each run
lists the ``accepted-by-time`` hours from its checkpoint (the first hour not yet closed) up to
the current hour and checks every entry it has not verified before with
:func:`lightmetrics.derived.indexing.verify_time_entry`: one GET of the record, and its blob's hash looked
up in the ``raw-blobs-by-time`` listings of the entry's hour and the hour before (listed once per
run, only for hours with entries to check). Found there, every derived entry of the batch is known
present (protocol §9 D5, D6) and nothing more is requested; otherwise the full repair, the same code
the walk uses. An entry whose key does not parse is a blocker (kind ``accepted-by-time-entry``),
never skipped.

Bounded runs. A run checks at most ``max_entries`` entries, re-checks included
(:data:`MAX_ENTRIES_PER_RUN`, sized from the function's timeout below), sends at most
``max_list_pages`` listing pages (:data:`MAX_LIST_PAGES_PER_RUN`), and saves its progress after
every hour in which it checked something and every :data:`SAVE_EVERY_ENTRIES` entries it checked
inside an hour, so a run cut off by the Lambda timeout keeps what it did, less at most that many
checks. Inside an hour (stopped by the entry cap, or saving as it goes) it records a key cursor
(``scan_after``): the next run lists that hour again but does not re-read entries up to the cursor
older than the cursor's bound (the hour's newest ``LastModified`` at that listing minus
``LM_RECONCILE_MARGIN_S``, as for "Verified once" below) unless the checkpoint lists them as
failed — it lists every RETRY_LATER failure behind the cursor (the cursor stops before one that
does not fit), so neither the failure history nor ``failed_overflow`` makes a run re-check more —
and it checks at least one entry past the cursor, which never moves back: every run moves it or
finishes the hour. A BLOCKED entry never holds the cursor back; it is listed if there is room, and
if not, its open blocker remembers it and the checkpoint says so (``scan_after_unlisted``): the run
that finishes that pass over the hour does not close it nor move the watermark, and the hour is
listed again from its start, so an entry whose blocker an operator resumed meanwhile is checked again.

Cap and catch-up. One run scans at most ``max_hours`` hours. If it stops short of the current
hour the checkpoint keeps ``scan_from`` and the next run continues there, so a checkpoint far
behind (or a lookback rescan longer than the cap, or an hour a blocker holds open) never keeps
later hours from being repaired; a run that reaches the present starts the next one over at the
checkpoint. Only hours this run scanned are closed.

Verified once. A repair that ends DONE or NOOP_RESOLVED leaves every derived entry of that batch
in place, so checking it again on every run until its hour closes (about a dozen runs) buys
nothing. The checkpoint keeps ``verified_before_ns``: entries whose ``LastModified`` (S3's clock,
read from the listing, so no clock skew between us and S3) is older were verified by an earlier
run. A run that saw entries sets it to the newest ``LastModified`` it listed minus
``LM_RECONCILE_MARGIN_S`` (longer than any PUT in flight: a PUT that began earlier but was not
yet visible to the listing is still checked next time) — but only if no entry ended RETRY_LATER
or BLOCKED, so such entries (and a blocker an operator resumes) are checked again, and only if
the run scanned every hour from the checkpoint to now; it speaks for hours up to
``verified_through`` only, so it never vouches for entries no run has listed. After downtime it
starts over from 0. The listing is the only per-entry cost of a steady-state run for entries
verified before: one LIST per 1,000 entries of the open hours; a new entry adds one GET (plus a
repair if something is missing) and its share of the raw-blobs-by-time listings.

Failed entries. The checkpoint lists the entries whose unit ended RETRY_LATER or BLOCKED; when
one succeeds in a later run (another process), its retry budget is cleared (protocol §11 O1a).

Closing an hour. Keys inside an hour are not time-ordered, so the checkpoint moves past hour H
only when this run scanned H and no more entries can appear in it: H ended more than
``LM_SETTLE_S`` ago, no index queue holds a message older than H's end (in AWS: CloudWatch
ApproximateAgeOfOldestMessage; locally: visible + in-flight messages = 0), every DLQ is empty, no
indexing blocker is open, and this run left nothing in H at RETRY_LATER. The checkpoint is advanced by a conditional
write on its version, so overlapping runs can neither move it back nor skip an hour.

Shards (R8). ``LM_RECONCILE_SHARDS`` = N reconcilers run side by side, shard i over key range i of
every hour's range plan (:mod:`lightmetrics.derived.hour_ranges`), each with its own checkpoint (shard 0
keeps ``checkpoint#reconcile``/``current``: a deployment before shards is shard 0 of 1). Each runs
everything above over its range: its listing is ``list_modified(hour, start_after=, end_at=)``;
a shard whose index is past the hour's ranges has nothing in it and lists nothing. In an hour of
more than one range a shard checks blobs by HEAD (:class:`~lightmetrics.derived.indexing.HeadedBlobs`: a
healthy entry costs 1 GET + 1 HEAD) instead of listing whole ``raw-blobs-by-time`` hours, which
every shard would pay again. One shard (N = 1) reads no plan: it owns every range. An hour whose plan
has more ranges than N has ranges no shard checks: every shard keeps it open and its run ends in
:class:`UnownedRangesError` naming them, after saving its progress. The overall checkpoint is the
slowest shard's (:func:`read_shard_checkpoints`); shard 0 of several emits that lag, the others
their own, all as ``ReconcilerLagSeconds``, so the alarm's Maximum is the slowest shard's.

What it cannot do: find an accepted manifest whose ``accepted-by-time`` entry is missing (that
index is its input). The bootstrap walk and the inventory audit find those.

Example:
    >>> report = Reconciler(ctx, settings, probe).run()                # doctest: +SKIP
    >>> report.lag_s                                                    # doctest: +SKIP
    >>> Reconciler(ctx, settings, probe, shard=2).run().shard           # doctest: +SKIP
    2
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lightmetrics.aws.control_table import ConditionFailed
from lightmetrics.aws.queue_probes import QueueProbe
from lightmetrics.composition.config import Settings
from lightmetrics.derived.hour_ranges import RangePlan, RangePlans
from lightmetrics.derived.indexing import (
    KIND_REPAIR,
    KIND_TIME_ENTRY,
    HeadedBlobs,
    IndexedBlobs,
    manifest_key_of_time_entry,
    verify_time_entry,
)
from lightmetrics.derived.reconcile_state import (
    CHECKPOINT_PK,
    Checkpoint,
    ReconcileReport,
    UnownedRangesError,
    check_shard,
    checkpoint_of,
    checkpoint_sk,
    failures_that_fit,
    read_shard_checkpoints,
    unowned_ranges,
)
from lightmetrics.ops import crashpoints
from lightmetrics.ops.outcome import Outcome, PermanentWorkError
from lightmetrics.ops.pool import map_in_context
from lightmetrics.ops.work import WorkContext, run_unit
from lightmetrics.protocol.keys import UtcHour

_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="lm-reconcile")

#: the plan of an hour when one shard runs (it reads no plan) or no plan governs it: the whole hour
ONE_RANGE = RangePlan(None)

#: blocker kinds that keep hours open: derived state may still be missing behind them
INDEXING_KINDS = ("index-accepted", "index-raw-blob", "index-quarantine", "event-parse", KIND_REPAIR, KIND_TIME_ENTRY,
                  "dlq")
_NS = 1_000_000_000


#: Entries one run checks at most, re-checks included (protocol §12 R7). Sized from the function's
#: 900 s timeout (resources.py) with the pool's 8 workers: a healthy entry is one GET (~15 ms), so
#: 50,000 take ~95 s; if every one needed the full repair (~5 sequential requests, ~75 ms) they take
#: ~470 s. That is 10,000 new batches a minute (166/s) sustained at one run per 5 minutes.
MAX_ENTRIES_PER_RUN = 50_000

#: Listing pages (ListObjectsV2, up to 1,000 keys each) one run sends at most, ``accepted-by-time``
#: and ``raw-blobs-by-time`` together (R7): a page takes ~100 ms and is sent alone, so 2,000 take
#: ~200 s, which with the entries' worst case (~470 s) and the closing probes stays inside the
#: 900 s timeout; they cost $0.01. A run that reaches it stops at the next hour boundary, so it
#: may exceed it by the listings of one hour (its own and two raw-blobs-by-time hours).
MAX_LIST_PAGES_PER_RUN = 2_000

#: Entries checked between two saves of a run's progress inside an hour (R7): a run killed by its
#: timeout loses at most this many checks. 5,000 healthy entries are ~10 s of a run's work (~50 s
#: if every one needed the repair); a save is one PutItem, at most 10 in a run at the entry cap.
SAVE_EVERY_ENTRIES = 5_000

#: Keys per ListObjectsV2 page.
LIST_PAGE_KEYS = 1000


def list_pages(keys: int) -> int:
    """The ListObjectsV2 requests a complete listing of ``keys`` keys takes (an empty one is one).

    >>> list_pages(0), list_pages(1000), list_pages(1001)
    (1, 1, 2)
    """
    return max(1, -(-keys // LIST_PAGE_KEYS))

#: Crash point (lightmetrics.ops.crashpoints): a run's progress saved after one scanned hour.
CP_HOUR_SAVED = crashpoints.register("reconcile.hour-saved", "a scanned hour's progress saved, the run not finished")
#: Crash point: progress inside an hour saved (a cursor, every SAVE_EVERY_ENTRIES checks), the hour not finished.
CP_PROGRESS_SAVED = crashpoints.register("reconcile.progress-saved",
                                         "progress inside an hour saved (its cursor), the hour not finished")


@dataclass
class _HourScan:
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


class Reconciler:
    """One shard of the reconciler (R8; ``shard`` 0 of ``LM_RECONCILE_SHARDS``, by default the only one)."""

    def __init__(self, ctx: WorkContext, settings: Settings, probe: QueueProbe, shard: int = 0) -> None:
        self.ctx, self.settings, self.probe = ctx, settings, probe
        self.table = ctx.table
        # Shard 0 exists in every deployment: a checkpoint reader may come without settings.
        self.shard = check_shard(shard, settings.reconcile_shards if settings is not None else 1)
        self.checkpoint_sk = checkpoint_sk(self.shard)

    # -- checkpoint ------------------------------------------------------------------------
    def checkpoint(self) -> Checkpoint | None:
        return checkpoint_of(self.table.get(CHECKPOINT_PK, self.checkpoint_sk))

    def _save(self, new_hour: UtcHour, expected: Checkpoint | None, now_ns: int, verified_before_ns: int = 0, *,
              verified_through: UtcHour | None = None, scan_from: UtcHour | None = None,
              failed_entries: tuple[str, ...] = (), failed_overflow: bool = False, scan_after: str | None = None,
              scan_after_before_ns: int = 0, scan_after_unlisted: bool = False) -> bool:
        values = {"pk": CHECKPOINT_PK, "sk": self.checkpoint_sk, "hour_start_s": new_hour.start_unix_s,
                  "hour": str(new_hour), "version": (expected.version + 1) if expected else 1, "last_run_ns": now_ns,
                  "verified_before_ns": verified_before_ns,
                  "verified_through_s": verified_through.start_unix_s if verified_through else None,
                  "scan_from_s": scan_from.start_unix_s if scan_from else None,
                  "failed_entries": list(failed_entries) or None, "failed_overflow": failed_overflow or None,
                  "scan_after": scan_after, "scan_after_before_ns": scan_after_before_ns if scan_after else None,
                  "scan_after_failures_listed": True if scan_after else None,
                  "scan_after_unlisted": True if scan_after and scan_after_unlisted else None}
        try:
            if expected is None:
                self.table.put(values, condition="attribute_not_exists(pk)")
            else:
                self.table.put(values, condition="#v = :v", names={"#v": "version"},
                               values_for_condition={":v": expected.version})
            return True
        except ConditionFailed:
            return False

    def lag_s(self, now_ns: int | None = None) -> float | None:
        cp = self.checkpoint()
        now = now_ns if now_ns is not None else self.ctx.clock.now_ns()
        return None if cp is None else max(0.0, (now - cp.hour.start_ns) / _NS)

    # -- one run -----------------------------------------------------------------------------
    def run(self, *, max_hours: int = 72, max_entries: int = MAX_ENTRIES_PER_RUN,
            max_list_pages: int | None = None, save_every: int | None = None) -> ReconcileReport:
        """Scan at most ``max_hours`` hours, check at most ``max_entries`` entries (re-checks
        included) and send at most ``max_list_pages`` listing pages (default
        :data:`MAX_LIST_PAGES_PER_RUN`), saving progress after each hour and every ``save_every``
        entries inside one (default :data:`SAVE_EVERY_ENTRIES`), then close what this run scanned
        (protocol §12 R1, R5, R7)."""
        if max_list_pages is None:
            max_list_pages = MAX_LIST_PAGES_PER_RUN
        if save_every is None:
            save_every = SAVE_EVERY_ENTRIES
        if save_every < 1:
            raise ValueError(f"save_every must be at least 1, got {save_every}")
        if max_hours < 1:
            raise ValueError(f"max_hours must be at least 1, got {max_hours}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        if max_list_pages < 1:
            raise ValueError(f"max_list_pages must be at least 1, got {max_list_pages}")
        now = self.ctx.clock.now_ns()
        current = UtcHour.of_unix_ns(now)
        cp = self.checkpoint()
        lookback_start = UtcHour.of_unix_ns(now - self.settings.reconcile_lookback_s * _NS)
        since, verified_through = 0, None
        cursor: tuple[str, int] | None = None
        unlisted_behind_cursor = False  # an earlier run of this pass over the cursor's hour left a failure unlisted
        if cp is None:
            start = lookback_start
        else:
            start = cp.scan_from or cp.hour  # a scan that stopped at its cap continues (R5)
            downtime = now - cp.last_run_ns > max(2 * self.settings.settle_s, 3600) * _NS
            if downtime:
                start = min(lookback_start, cp.hour)  # events may have been lost while nobody watched
            else:
                since, verified_through = cp.verified_before_ns, cp.verified_through
                if cp.scan_from is not None and cp.scan_after and (cp.scan_after_failures_listed
                                                                   or not cp.failed_overflow):
                    cursor = (cp.scan_after, cp.scan_after_before_ns)  # R7: continue inside that hour
                    unlisted_behind_cursor = cp.scan_after_unlisted
        first_open = cp.hour if cp else start
        end = min(current, start + (max_hours - 1))
        failed_before = frozenset(cp.failed_entries) if cp else frozenset()
        all_failed_before = bool(cp and cp.failed_overflow)
        report = ReconcileReport(checkpoint_before=str(cp.hour) if cp else "-", checkpoint_after="", shard=self.shard)
        retry_hours: set[UtcHour] = set()
        failed_now: set[str] = set()
        retry_now: set[str] = set()  # the failures of failed_now that ended RETRY_LATER
        shards = self.settings.reconcile_shards
        # R8: read once per run (plans are written at least 2 hours before they govern an hour, so
        # a run never meets a plan written after it began); one shard reads none: it owns every range.
        plans = RangePlans(self.table) if shards > 1 else None
        unowned: dict[UtcHour, RangePlan] = {}  # scanned hours whose plan has ranges without a shard
        indexed = IndexedBlobs(self.ctx)  # one range: list the blob hours, as before shards
        headed = HeadedBlobs(self.ctx)  # several: HEAD each entry's blob key (R8)
        budget, pages_left = max_entries, max_list_pages
        newest = 0
        saved = cp  # the checkpoint as this run last wrote (or read) it: every save is conditional on it
        stopped: tuple[UtcHour, str | None, int] | None = None  # (hour, cursor key, cursor bound)
        hour = start

        def save_inside(in_hour: UtcHour, key: str, bound_ns: int, scan: _HourScan) -> bool:
            """R7: this run's progress inside ``in_hour``, up to ``key``; False if another run wrote first."""
            nonlocal saved
            saved = self._save_progress(saved, first_open, now, since, verified_through, in_hour,
                                        failed_now | scan.failed_entries, start, in_hour + -1,
                                        retry_now=retry_now | scan.retry_later_entries, cursor=(key, bound_ns),
                                        unlisted_before=unlisted_behind_cursor and in_hour == start)
            if saved is None:
                return False
            crashpoints.point(CP_PROGRESS_SAVED)
            return True

        while hour <= end:
            if budget <= 0 or pages_left <= 0:
                stopped = (hour, None, 0)  # a cap fell on an hour boundary: continue at this hour
                break
            skip_before = since if verified_through is not None and hour <= verified_through else 0
            plan = plans.plan_for(hour) if plans is not None else ONE_RANGE
            if plan.ranges > shards:
                unowned[hour] = plan
            scan = self._scan_hour(hour, report, skip_before, failed_before, all_failed_before,
                                   headed if plan.ranges > 1 else indexed, cursor if hour == start else None,
                                   budget, save_every, save_inside, plan=plan)
            if scan.moved_by_other_run:
                return self._left_to_other_run(report, first_open)
            budget -= scan.checked
            pages_left -= scan.list_pages
            report.list_pages += scan.list_pages
            if scan.retry_later:
                retry_hours.add(hour)
            failed_now |= scan.failed_entries
            retry_now |= scan.retry_later_entries
            newest = max(newest, scan.newest_ns)
            if scan.stopped:
                stopped = (hour, scan.stopped_after, scan.cursor_bound_ns)
                break
            if hour < end and scan.checked:  # R7: a run cut off later keeps this hour's work
                saved = self._save_progress(saved, first_open, now, since, verified_through, hour.next(),
                                            failed_now, start, hour, retry_now=retry_now)
                if saved is None:
                    return self._left_to_other_run(report, first_open)
                crashpoints.point(CP_HOUR_SAVED)
            hour = hour.next()
        report.blob_hours_listed = indexed.hours_listed
        report.blob_heads = headed.heads_sent
        report.unowned_ranges = [f"{h}: {unowned_ranges(p, shards)} in the plan effective from {p.effective_from}"
                                 for h, p in sorted(unowned.items(), key=lambda hp: hp[0].start_unix_s)]
        # The hours this run listed and ran completely; a run stopped by its entry cap did not finish
        # the hour it stopped in.
        scanned_to = stopped[0] + -1 if stopped else end
        # A pass over the cursor's hour that left a failure unlisted behind a cursor is finished by
        # this run, which has not checked that entry again (its blocker may have been resumed since):
        # the hour is not closed, and is listed again from its start (R7).
        pass_left_unlisted = unlisted_behind_cursor and start <= scanned_to
        # R4 only from a run that scanned every open hour up to now without a failure: a run that
        # stopped at its cap, or began past the checkpoint, would otherwise vouch for entries of
        # hours it never listed.
        covered_all = stopped is None and end == current and start <= first_open and not pass_left_unlisted
        if covered_all and not failed_now:
            verified_through = current
            if newest:
                since = max(since, newest - self.settings.reconcile_margin_s * _NS)

        # Close hours in order while every condition holds, and only hours this run scanned.
        new_open = first_open
        while new_open < current:
            if not start <= new_open <= scanned_to:
                report.not_closed_because = (f"{new_open}: not scanned by this run (it scanned {start} to {scanned_to}, "
                                             f"at most {max_hours} hours, {max_entries} entries and "
                                             f"{max_list_pages} listing pages per run)")
                break
            if new_open in unowned:  # R8: its ranges past the last shard are checked by no one
                report.not_closed_because = (f"{new_open}: {unowned_ranges(unowned[new_open], shards)} in the plan "
                                             f"effective from {unowned[new_open].effective_from}")
                break
            if pass_left_unlisted and new_open == start:
                report.not_closed_because = (f"{new_open}: a failed entry an earlier run checked is not listed in the "
                                             f"checkpoint; the hour is listed again from its start")
                break
            reason = self._why_open(new_open, now, retry_hours)
            if reason:
                report.not_closed_because = f"{new_open}: {reason}"
                break
            report.closed.append(str(new_open))
            new_open = new_open.next()
        if not report.not_closed_because:
            report.not_closed_because = f"{current}: the current hour is never closed"
        if stopped is not None:
            scan_from: UtcHour | None = stopped[0]
            scan_after, scan_after_before = stopped[1], stopped[2]
        else:
            scan_from = None if end == current or end.next() == new_open else end.next()
            scan_after, scan_after_before = None, 0
        report.continues_from = str(scan_from) if scan_from else ""
        report.continues_after = scan_after or ""
        failed, overflow, unlisted = self._failed_after(
            cp, failed_now, start, scanned_to, new_open, covered_all, retry_now=retry_now,
            cursor=(stopped[0], stopped[1]) if stopped and stopped[1] else None)
        unlisted = unlisted or (unlisted_behind_cursor and stopped is not None and stopped[0] == start)
        if not self._save(new_open, saved, now, since, verified_through=verified_through, scan_from=scan_from,
                          failed_entries=failed, failed_overflow=overflow, scan_after=scan_after,
                          scan_after_before_ns=scan_after_before, scan_after_unlisted=unlisted):
            report.moved_by_other_run = True  # another run advanced it; never move it back
            other = self.checkpoint()
            new_open = other.hour if other else new_open
        report.checkpoint_after = str(new_open)
        report.lag_s = max(0.0, (now - new_open.start_ns) / _NS)
        self.ctx.metrics.add_metric(name="ReconcilerLagSeconds", unit="Seconds", value=self._lag_to_emit(report, now))
        if report.unowned_ranges:
            raise UnownedRangesError(
                f"shard {self.shard}: hours whose range plan has more ranges than LM_RECONCILE_SHARDS are kept open, "
                f"their extra ranges checked by no shard: {'; '.join(report.unowned_ranges)}. Raise "
                f"LM_RECONCILE_SHARDS to the plan's ranges (docs/protocol.md §12 R8)", report)
        return report

    def _lag_to_emit(self, report: ReconcileReport, now: int) -> float:
        """``ReconcilerLagSeconds`` (R8): every shard emits its own lag, and shard 0 of several the
        overall one — the slowest shard's, read from every shard's checkpoint (N GetItems), so a
        shard that stopped running is seen too; one that never ran counts as far behind as the
        lookback it would begin at. The alarm takes the Maximum: the slowest shard's lag."""
        if self.shard != 0 or self.settings.reconcile_shards == 1:
            return report.lag_s
        every = read_shard_checkpoints(self.table, self.settings.reconcile_shards)
        report.slowest_shard = str(every.slowest)
        report.overall_checkpoint = str(every.hour) if every.hour else "-"
        lag = every.lag_s(now)
        if lag is None:
            lag = (now - UtcHour.of_unix_ns(now - self.settings.reconcile_lookback_s * _NS).start_ns) / _NS
        return max(lag, report.lag_s)

    def _left_to_other_run(self, report: ReconcileReport, first_open: UtcHour) -> ReconcileReport:
        report.moved_by_other_run = True  # another run is at work: leave the rest to it
        other = self.checkpoint()
        report.checkpoint_after = str(other.hour if other else first_open)
        return report

    def _save_progress(self, saved: Checkpoint | None, first_open: UtcHour, now: int, since: int,
                       verified_through: UtcHour | None, scan_from: UtcHour, failed_now: set[str], start: UtcHour,
                       scanned_to: UtcHour, *, retry_now: set[str], cursor: tuple[str, int] | None = None,
                       unlisted_before: bool = False) -> Checkpoint | None:
        """Record that the next run continues at ``scan_from`` (R7) — with ``cursor`` (key, bound)
        inside that hour, after ``scanned_to``, and ``unlisted_before`` if an earlier run of this
        pass over it left a failure behind its cursor unlisted — with the failed entries so far; the
        closed hours and the R4 watermark stay as they were. None if another run wrote first."""
        failed, overflow, unlisted = self._failed_after(saved, failed_now, start, scanned_to, first_open, False,
                                                        retry_now=retry_now,
                                                        cursor=(scan_from, cursor[0]) if cursor else None)
        scan_after, scan_after_before = cursor if cursor else (None, 0)
        unlisted = scan_after is not None and (unlisted or unlisted_before)
        if not self._save(first_open, saved, now, since if saved else 0,
                          verified_through=verified_through if saved else None, scan_from=scan_from,
                          failed_entries=failed, failed_overflow=overflow, scan_after=scan_after,
                          scan_after_before_ns=scan_after_before, scan_after_unlisted=unlisted):
            return None
        if saved is None:
            return self.checkpoint()
        return dataclasses.replace(saved, version=saved.version + 1, last_run_ns=now, scan_from=scan_from,
                                   failed_entries=failed, failed_overflow=overflow, scan_after=scan_after,
                                   scan_after_before_ns=scan_after_before,
                                   scan_after_failures_listed=scan_after is not None, scan_after_unlisted=unlisted)

    def _failed_after(self, cp: Checkpoint | None, failed_now: set[str], start: UtcHour, end: UtcHour,
                      new_open: UtcHour, covered_all: bool, *,
                      retry_now: set[str] | frozenset[str] = frozenset(), cursor: tuple[UtcHour, str] | None = None
                      ) -> tuple[tuple[str, ...], bool, bool]:
        """The failed entries the next run must know of, whether some were left out, and whether a
        failure behind ``cursor`` was: this run's, plus earlier ones of hours this run did not scan
        that are still open (keys sort by hour, so prefixes bound them). With ``cursor`` (the hour
        this run stopped in and its key), this run's failures up to the cursor come first — the next
        run re-checks only those behind it (R7) — its RETRY_LATER ones before its BLOCKED ones: the
        scan placed the cursor so that the RETRY_LATER ones fit (unless they held it behind where it
        already was); a BLOCKED one left out is remembered by its blocker and by the third value.
        Earlier failures up to the cursor were checked again by this run."""
        codec = self.ctx.codec

        def behind_cursor(key: str) -> bool:
            return cursor is not None and codec.accepted_by_time_hour(cursor[0]) <= key <= cursor[1]

        scanned_from, scanned_to = codec.accepted_by_time_hour(start), codec.accepted_by_time_hour(end.next())
        still_open = codec.accepted_by_time_hour(new_open)
        carried = {k for k in (cp.failed_entries if cp else ())
                   if not scanned_from <= k < scanned_to and k >= still_open and not behind_cursor(k)}
        behind = sorted(k for k in failed_now if behind_cursor(k) and k in retry_now)
        behind += sorted(k for k in failed_now if behind_cursor(k) and k not in retry_now)
        rest = sorted((failed_now | carried) - set(behind))
        kept = (behind + rest)[:failures_that_fit(behind + rest)]
        overflow = len(behind) + len(rest) > len(kept) or bool(cp and cp.failed_overflow and not covered_all)
        return tuple(sorted(kept)), overflow, len(kept) < len(behind)

    def _why_open(self, hour: UtcHour, now: int, retry_hours: set[UtcHour]) -> str:
        if now < hour.end_ns + self.settings.settle_s * _NS:
            return "inside the settle window"
        if hour in retry_hours:
            return "entries left at RETRY_LATER"
        if not self.probe.quiet_since(hour.end_ns, now):
            return "index queues still hold older messages"
        if not self.probe.dlqs_empty():
            return "a DLQ is not empty"
        if self.ctx.blockers.has_open(kinds=INDEXING_KINDS):
            return "an indexing blocker is open"
        return ""

    def _scan_hour(self, hour: UtcHour, report: ReconcileReport, since_ns: int, failed_before: frozenset[str],
                   all_failed_before: bool, indexed: IndexedBlobs | HeadedBlobs, cursor: tuple[str, int] | None,
                   budget: int, save_every: int,
                   save_inside: Callable[[UtcHour, str, int, _HourScan], bool], *,
                   plan: RangePlan = ONE_RANGE) -> _HourScan:
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
            return _HourScan()  # nothing of this hour is this shard's
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
        scan = _HourScan(newest_ns=newest, list_pages=pages,
                         cursor_bound_ns=newest - self.settings.reconcile_margin_s * _NS)
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
            # full repair_accepted; the time-entry kind runs verify_time_entry (RUNNERS).
            return run_unit(self.ctx, kind=kind, object_key=object_key, source="reconcile",
                            fn=lambda: verify_time_entry(self.ctx, entry_key, indexed),
                            previously_failed=all_failed_before or entry_key in failed_before).outcome

        # In slices of ``save_every`` in key order, each finished before the next begins, so that a
        # save covers every entry up to its cursor: a run killed later keeps them (R7).
        saved_after = cursor[0] if cursor else None  # this hour's progress the checkpoint holds
        for first in range(0, len(units), save_every):
            part = units[first:first + save_every]
            for key, outcome in zip(part, self._check(part, run)):
                report.outcomes[outcome.value] += 1
                if outcome is Outcome.RETRY_LATER:
                    scan.retry_later = True
                    scan.retry_later_entries.add(key)
                if outcome in (Outcome.RETRY_LATER, Outcome.BLOCKED):
                    scan.failed_entries.add(key)
            done = first + len(part)
            if done == len(units):
                break  # the hour's save, or the run's, follows
            cursor_key = self._cursor_listing_failures(units[:done], scan.retry_later_entries, floor=saved_after)
            if cursor_key is not None and cursor_key != saved_after:
                if not save_inside(hour, cursor_key, scan.cursor_bound_ns, scan):
                    scan.moved_by_other_run = True
                    return scan
                saved_after = cursor_key
        if scan.stopped:
            scan.stopped_after = self._cursor_listing_failures(units, scan.retry_later_entries, floor=saved_after)
        return scan

    @staticmethod
    def _check(units: list[str], run: Callable[[str], Outcome]) -> list[Outcome]:
        """Run ``units`` on the pool; the outcomes in their order. If one raises, the units not
        started are cancelled and the started ones finish before the error goes up."""
        return map_in_context(_POOL, run, units)

    @staticmethod
    def _cursor_listing_failures(checked: list[str], retry_later: set[str], *, floor: str | None = None
                                 ) -> str | None:
        """The in-hour cursor after ``checked`` (in key order) such that the checkpoint lists every
        RETRY_LATER failure behind it (R7): the last key, or the last before the first one that does
        not fit (the entries after it are checked again by the next run) — but never behind
        ``floor``, the cursor this run already has in the hour. None: not one entry. A BLOCKED
        entry never holds it back: its open blocker remembers it.

        >>> Reconciler._cursor_listing_failures(["a", "b", "c"], {"b"}, floor="a")
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


__all__ = ["Reconciler"]
