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
more than one range a shard checks blobs by HEAD (:class:`~lightmetrics.derived.blob_lookups.HeadedBlobs`: a
healthy entry costs 1 GET + 1 HEAD) instead of listing whole ``raw-blobs-by-time`` hours, which
every shard would pay again. One shard (N = 1) reads no plan: it owns every range. An hour whose plan
has more ranges than N has ranges no shard checks: every shard keeps it open and its run ends in
:class:`UnownedRangesError` naming them, after saving its progress. The overall checkpoint is the
slowest shard's (:func:`read_shard_checkpoints`); shard 0 of several emits that lag, the others
their own, all as ``ReconcilerLagSeconds``, so the alarm's Maximum is the slowest shard's.

Stuck is loud (R9). A run's final save records when it finished and why it failed (``finished_ns``,
``failure``; progress saves keep the last run's); shard 0 emits ``ReconcilerShardsStuck``, the
shards that never ran, failed their last run or finished none for an hour, and ``lmctl status``
names each of them.

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
from dataclasses import dataclass, field

from lightmetrics.deployment.settings import Settings
from lightmetrics.derived.blob_lookups import HeadedBlobs, IndexedBlobs
from lightmetrics.derived.hour_ranges import RangePlan, RangePlans
from lightmetrics.derived.indexing import KIND_REPAIR, KIND_TIME_ENTRY
from lightmetrics.derived.reconcile_fanout import ShardMessage, served
from lightmetrics.derived.reconcile_scan import (
    LIST_PAGE_KEYS,
    ONE_RANGE,
    HourScan,
    HourScanner,
    cursor_listing_failures,
    list_pages,
)
from lightmetrics.derived.reconcile_state import (
    CHECKPOINT_PK,
    Checkpoint,
    ReconcileReport,
    ShardCheckpoints,
    UnownedRangesError,
    check_shard,
    checkpoint_of,
    checkpoint_sk,
    failed_after,
    read_shard_checkpoints,
    unowned_ranges,
    write_checkpoint,
)
from lightmetrics.derived.rerun import recheck
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.queue_probe import QueueProbe
from lightmetrics.work import crashpoints
from lightmetrics.work.units import WorkContext

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

#: Crash point (lightmetrics.work.crashpoints): a run's progress saved after one scanned hour.
CP_HOUR_SAVED = crashpoints.register("reconcile.hour-saved", "a scanned hour's progress saved, the run not finished")
#: Crash point: progress inside an hour saved (a cursor, every SAVE_EVERY_ENTRIES checks), the hour not finished.
CP_PROGRESS_SAVED = crashpoints.register("reconcile.progress-saved",
                                         "progress inside an hour saved (its cursor), the hour not finished")


@dataclass
class _RunState:
    """One run's view: where it starts and ends, what it carries over and what it found so far."""

    now: int
    current: UtcHour  # the hour of ``now``: never closed
    cp: Checkpoint | None  # the checkpoint as the run read it
    start: UtcHour  # the first hour it scans
    first_open: UtcHour  # the checkpoint's hour (the first not closed), or ``start``
    end: UtcHour  # the last hour it may scan (``max_hours`` from ``start``, at most ``current``)
    since: int = 0  # R4: entries older than this were verified, in hours up to ``verified_through``
    verified_through: UtcHour | None = None
    cursor: tuple[str, int] | None = None  # R7: (key, bound) inside ``start`` left by the run before
    unlisted_behind_cursor: bool = False  # an earlier run of this pass over the cursor's hour left a failure unlisted
    failed_before: frozenset[str] = frozenset()
    all_failed_before: bool = False
    saved: Checkpoint | None = None  # the checkpoint as this run last wrote (or read) it: every save is conditional on it
    retry_hours: set[UtcHour] = field(default_factory=set)
    failed_now: set[str] = field(default_factory=set)
    retry_now: set[str] = field(default_factory=set)  # the failures of failed_now that ended RETRY_LATER
    unowned: dict[UtcHour, RangePlan] = field(default_factory=dict)  # scanned hours whose plan has ranges without a shard
    newest: int = 0
    stopped: tuple[UtcHour, str | None, int] | None = None  # (hour, cursor key, cursor bound)


class Reconciler:
    """One shard of the reconciler (R8; ``shard`` 0 of ``LM_RECONCILE_SHARDS``, by default the only one)."""

    def __init__(self, ctx: WorkContext, settings: Settings, probe: QueueProbe, shard: int = 0) -> None:
        self.ctx, self.settings, self.probe = ctx, settings, probe
        self.table = ctx.table
        # Shard 0 exists in every deployment: a checkpoint reader may come without settings.
        self.shard = check_shard(shard, settings.reconcile_shards if settings is not None else 1)
        self.checkpoint_sk = checkpoint_sk(self.shard)
        self.scanner = HourScanner(ctx, settings.reconcile_margin_s if settings is not None else 0, self.shard)
        self._rechecked = False
        self._every: ShardCheckpoints | None = None  # shard 0 of several: every shard's item, read at the run's end

    # -- checkpoint ------------------------------------------------------------------------
    def checkpoint(self) -> Checkpoint | None:
        return checkpoint_of(self.table.get(CHECKPOINT_PK, self.checkpoint_sk))

    def _save(self, new_hour: UtcHour, expected: Checkpoint | None, now_ns: int, verified_before_ns: int = 0, *,
              verified_through: UtcHour | None = None, scan_from: UtcHour | None = None,
              failed_entries: tuple[str, ...] = (), failed_overflow: bool = False, scan_after: str | None = None,
              scan_after_before_ns: int = 0, scan_after_unlisted: bool = False, finished_ns: int = 0,
              failure: str = "") -> bool:
        return write_checkpoint(self.table, self.checkpoint_sk, new_hour, expected, now_ns, verified_before_ns,
                                verified_through=verified_through, scan_from=scan_from, failed_entries=failed_entries,
                                failed_overflow=failed_overflow, scan_after=scan_after,
                                scan_after_before_ns=scan_after_before_ns, scan_after_unlisted=scan_after_unlisted,
                                finished_ns=finished_ns, failure=failure)

    def lag_s(self, now_ns: int | None = None) -> float | None:
        cp = self.checkpoint()
        now = now_ns if now_ns is not None else self.ctx.clock.now_ns()
        return None if cp is None else max(0.0, (now - cp.hour.start_ns) / _NS)

    # -- one run -----------------------------------------------------------------------------
    def run(self, *, max_hours: int = 72, max_entries: int = MAX_ENTRIES_PER_RUN,
            max_list_pages: int | None = None, save_every: int | None = None,
            message: ShardMessage | None = None) -> ReconcileReport:
        """Scan at most ``max_hours`` hours, check at most ``max_entries`` entries (re-checks
        included) and send at most ``max_list_pages`` listing pages (default
        :data:`MAX_LIST_PAGES_PER_RUN`), saving progress after each hour and every ``save_every``
        entries inside one (default :data:`SAVE_EVERY_ENTRIES`), then close what this run scanned
        (protocol §12 R1, R5, R7). A run for a shard ``message`` that a later run already served
        does nothing but read the checkpoint: its report says ``stale`` (R8)."""
        if max_list_pages is None:
            max_list_pages = MAX_LIST_PAGES_PER_RUN
        if save_every is None:
            save_every = SAVE_EVERY_ENTRIES
        for name, value in (("save_every", save_every), ("max_hours", max_hours), ("max_entries", max_entries),
                            ("max_list_pages", max_list_pages)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        state = self._begin(max_hours)
        self._rechecked = False  # R1, §11 O4: the open indexing blockers, once this run
        cp = state.cp
        report = ReconcileReport(checkpoint_before=str(cp.hour) if cp else "-", checkpoint_after="", shard=self.shard)
        if message is not None and served(message, cp):
            report.stale, report.checkpoint_after = True, report.checkpoint_before
            return report
        indexed = IndexedBlobs(self.ctx)  # one range: list the blob hours, as before shards
        headed = HeadedBlobs(self.ctx)  # several: HEAD each entry's blob key (R8)
        if not self._scan_hours(state, report, max_entries, max_list_pages, save_every, indexed, headed):
            return self._left_to_other_run(report, state.first_open)
        shards = self.settings.reconcile_shards
        report.blob_hours_listed = indexed.hours_listed
        report.blob_heads = headed.heads_sent
        report.unowned_ranges = [f"{h}: {unowned_ranges(p, shards)} in the plan effective from {p.effective_from}"
                                 for h, p in sorted(state.unowned.items(), key=lambda hp: hp[0].start_unix_s)]
        # The hours this run listed and ran completely; a run stopped by its entry cap did not finish
        # the hour it stopped in.
        scanned_to = state.stopped[0] + -1 if state.stopped else state.end
        # A pass over the cursor's hour that left a failure unlisted behind a cursor is finished by
        # this run, which has not checked that entry again (its blocker may have been resumed since):
        # the hour is not closed, and is listed again from its start (R7).
        pass_left_unlisted = state.unlisted_behind_cursor and state.start <= scanned_to
        # R4 only from a run that scanned every open hour up to now without a failure: a run that
        # stopped at its cap, or began past the checkpoint, would otherwise vouch for entries of
        # hours it never listed.
        covered_all = (state.stopped is None and state.end == state.current and state.start <= state.first_open
                       and not pass_left_unlisted)
        if covered_all and not state.failed_now:
            state.verified_through = state.current
            if state.newest:
                state.since = max(state.since, state.newest - self.settings.reconcile_margin_s * _NS)
        limits = f"at most {max_hours} hours, {max_entries} entries and {max_list_pages} listing pages per run"
        new_open = self._close_hours(state, report, scanned_to, pass_left_unlisted, limits)
        self._finish(state, report, new_open, scanned_to, covered_all)
        return report

    def _begin(self, max_hours: int) -> _RunState:
        """Where this run starts, from the checkpoint: its scan_from (R5), or after downtime the
        lookback; with the R4 watermark and the R7 cursor only if no downtime came between."""
        now = self.ctx.clock.now_ns()
        current = UtcHour.of_unix_ns(now)
        cp = self.checkpoint()
        lookback_start = UtcHour.of_unix_ns(now - self.settings.reconcile_lookback_s * _NS)
        since, verified_through = 0, None
        cursor: tuple[str, int] | None = None
        unlisted_behind_cursor = False
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
        return _RunState(now=now, current=current, cp=cp, start=start, first_open=cp.hour if cp else start,
                         end=min(current, start + (max_hours - 1)), since=since, verified_through=verified_through,
                         cursor=cursor, unlisted_behind_cursor=unlisted_behind_cursor,
                         failed_before=frozenset(cp.failed_entries) if cp else frozenset(),
                         all_failed_before=bool(cp and cp.failed_overflow), saved=cp)

    def _scan_hours(self, state: _RunState, report: ReconcileReport, max_entries: int, max_list_pages: int,
                    save_every: int, indexed: IndexedBlobs, headed: HeadedBlobs) -> bool:
        """Scan from ``state.start`` until ``state.end`` or a cap, saving after every hour with
        checks (R7); False if another run wrote the checkpoint first."""
        shards = self.settings.reconcile_shards
        # R8: read once per run (plans are written at least 2 hours before they govern an hour, so
        # a run never meets a plan written after it began); one shard reads none: it owns every range.
        plans = RangePlans(self.table) if shards > 1 else None
        budget, pages_left = max_entries, max_list_pages

        def save_inside(in_hour: UtcHour, key: str, bound_ns: int, scan: HourScan) -> bool:
            """R7: this run's progress inside ``in_hour``, up to ``key``; False if another run wrote first."""
            state.saved = self._save_progress(state.saved, state.first_open, state.now, state.since,
                                              state.verified_through, in_hour, state.failed_now | scan.failed_entries,
                                              state.start, in_hour + -1,
                                              retry_now=state.retry_now | scan.retry_later_entries,
                                              cursor=(key, bound_ns),
                                              unlisted_before=state.unlisted_behind_cursor and in_hour == state.start)
            if state.saved is None:
                return False
            crashpoints.point(CP_PROGRESS_SAVED)
            return True

        hour = state.start
        while hour <= state.end:
            if budget <= 0 or pages_left <= 0:
                state.stopped = (hour, None, 0)  # a cap fell on an hour boundary: continue at this hour
                break
            skip_before = state.since if state.verified_through is not None and hour <= state.verified_through else 0
            plan = plans.plan_for(hour) if plans is not None else ONE_RANGE
            if plan.ranges > shards:
                state.unowned[hour] = plan
            scan = self.scanner.scan(hour, report, skip_before, state.failed_before, state.all_failed_before,
                                     headed if plan.ranges > 1 else indexed,
                                     state.cursor if hour == state.start else None, budget, save_every, save_inside,
                                     plan=plan)
            if scan.moved_by_other_run:
                return False
            budget -= scan.checked
            pages_left -= scan.list_pages
            report.list_pages += scan.list_pages
            if scan.retry_later:
                state.retry_hours.add(hour)
            state.failed_now |= scan.failed_entries
            state.retry_now |= scan.retry_later_entries
            state.newest = max(state.newest, scan.newest_ns)
            if scan.stopped:
                state.stopped = (hour, scan.stopped_after, scan.cursor_bound_ns)
                break
            if hour < state.end and scan.checked:  # R7: a run cut off later keeps this hour's work
                state.saved = self._save_progress(state.saved, state.first_open, state.now, state.since,
                                                  state.verified_through, hour.next(), state.failed_now, state.start,
                                                  hour, retry_now=state.retry_now)
                if state.saved is None:
                    return False
                crashpoints.point(CP_HOUR_SAVED)
            hour = hour.next()
        return True

    def _close_hours(self, state: _RunState, report: ReconcileReport, scanned_to: UtcHour, pass_left_unlisted: bool,
                     limits: str) -> UtcHour:
        """Close hours in order while every condition holds, and only hours this run scanned; the
        first hour left open."""
        start, shards = state.start, self.settings.reconcile_shards
        new_open = state.first_open
        while new_open < state.current:
            if not start <= new_open <= scanned_to:
                report.not_closed_because = (f"{new_open}: not scanned by this run (it scanned {start} to {scanned_to}, "
                                             f"{limits})")
                break
            if new_open in state.unowned:  # R8: its ranges past the last shard are checked by no one
                plan = state.unowned[new_open]
                report.not_closed_because = (f"{new_open}: {unowned_ranges(plan, shards)} in the plan "
                                             f"effective from {plan.effective_from}")
                break
            if pass_left_unlisted and new_open == start:
                report.not_closed_because = (f"{new_open}: a failed entry an earlier run checked is not listed in the "
                                             f"checkpoint; the hour is listed again from its start")
                break
            reason = self._why_open(new_open, state.now, state.retry_hours)
            if reason:
                report.not_closed_because = f"{new_open}: {reason}"
                break
            report.closed.append(str(new_open))
            new_open = new_open.next()
        if not report.not_closed_because:
            report.not_closed_because = f"{state.current}: the current hour is never closed"
        return new_open

    def _finish(self, state: _RunState, report: ReconcileReport, new_open: UtcHour, scanned_to: UtcHour,
                covered_all: bool) -> None:
        """Save where the next run continues (a conditional write: never moved back), emit the lag,
        and fail loudly if ranges of a scanned hour belong to no shard (R8)."""
        stopped, end, now = state.stopped, state.end, state.now
        if stopped is not None:
            scan_from: UtcHour | None = stopped[0]
            scan_after, scan_after_before = stopped[1], stopped[2]
        else:
            scan_from = None if end == state.current or end.next() == new_open else end.next()
            scan_after, scan_after_before = None, 0
        report.continues_from = str(scan_from) if scan_from else ""
        report.continues_after = scan_after or ""
        failed, overflow, unlisted = self._failed_after(
            state.cp, state.failed_now, state.start, scanned_to, new_open, covered_all, retry_now=state.retry_now,
            cursor=(stopped[0], stopped[1]) if stopped and stopped[1] else None)
        unlisted = unlisted or (state.unlisted_behind_cursor and stopped is not None and stopped[0] == state.start)
        failure = "" if not report.unowned_ranges else (
            f"shard {self.shard}: hours whose range plan has more ranges than LM_RECONCILE_SHARDS are kept open, "
            f"their extra ranges checked by no shard: {'; '.join(report.unowned_ranges)}. Raise "
            f"LM_RECONCILE_SHARDS to the plan's ranges (docs/protocol.md §12 R8)")
        # R9: the run's end and its failure go into the item, so status and shard 0 see a failing shard
        if not self._save(new_open, state.saved, now, state.since, verified_through=state.verified_through,
                          scan_from=scan_from, failed_entries=failed, failed_overflow=overflow, scan_after=scan_after,
                          scan_after_before_ns=scan_after_before, scan_after_unlisted=unlisted, finished_ns=now,
                          failure=failure):
            report.moved_by_other_run = True  # another run advanced it; never move it back
            other = self.checkpoint()
            new_open = other.hour if other else new_open
        report.checkpoint_after = str(new_open)
        report.lag_s = max(0.0, (now - new_open.start_ns) / _NS)
        self._emit_metrics(report, now)
        if failure:
            raise UnownedRangesError(failure, report)

    def _emit_metrics(self, report: ReconcileReport, now: int) -> None:
        """``ReconcilerLagSeconds`` (:meth:`_lag_to_emit`) and, from shard 0, ``ReconcilerShardsStuck``
        (R9): how many shards never ran, failed their last run or finished none for an hour — with
        one shard, whether this run failed (no other item to read)."""
        self.ctx.metrics.add_metric(name="ReconcilerLagSeconds", unit="Seconds", value=self._lag_to_emit(report, now))
        if self.shard == 0:
            stuck = len(self._every.shard_causes(now)) if self._every is not None else int(bool(report.unowned_ranges))
            self.ctx.metrics.add_metric(name="ReconcilerShardsStuck", unit="Count", value=stuck)

    def _lag_to_emit(self, report: ReconcileReport, now: int) -> float:
        """``ReconcilerLagSeconds`` (R8): every shard emits its own lag, and shard 0 of several the
        overall one — the slowest shard's, read from every shard's checkpoint (N GetItems), so a
        shard that stopped running is seen too; one that never ran counts as far behind as the
        lookback it would begin at. The alarm takes the Maximum: the slowest shard's lag."""
        self._every = None
        if self.shard != 0 or self.settings.reconcile_shards == 1:
            return report.lag_s
        every = self._every = read_shard_checkpoints(self.table, self.settings.reconcile_shards)
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
                          scan_after_before_ns=scan_after_before, scan_after_unlisted=unlisted,
                          finished_ns=saved.finished_ns if saved else 0, failure=saved.failure if saved else ""):
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
        return failed_after(self.ctx.codec, cp, failed_now, start, end, new_open, covered_all, retry_now=retry_now,
                            cursor=cursor)

    def _why_open(self, hour: UtcHour, now: int, retry_hours: set[UtcHour]) -> str:
        if now < hour.end_ns + self.settings.settle_s * _NS:
            return "inside the settle window"
        if hour in retry_hours:
            return "entries left at RETRY_LATER"
        if not self.probe.quiet_since(hour.end_ns, now):
            return "index queues still hold older messages"
        if not self.probe.dlqs_empty():
            return "a DLQ is not empty"
        if self._indexing_blockers_open(now):
            return "an indexing blocker is open"
        return ""

    def _indexing_blockers_open(self, now: int) -> bool:
        """R1 with §11 O4: whether an indexing blocker is open, once the units of those opened before
        this run are checked again (once a run): one that passed resolves and holds no hour."""
        open_ = [b for b in self.ctx.blockers.list() if b.kind in INDEXING_KINDS]
        if open_ and not self._rechecked:
            self._rechecked = True
            if recheck(self.ctx, open_, source="reconcile", seen_before_ns=now):
                open_ = [b for b in self.ctx.blockers.list() if b.kind in INDEXING_KINDS]
        return bool(open_)

    #: the in-hour cursor placement (R7), :func:`lightmetrics.derived.reconcile_scan.cursor_listing_failures`
    _cursor_listing_failures = staticmethod(cursor_listing_failures)


__all__ = ["LIST_PAGE_KEYS", "ONE_RANGE", "Reconciler", "list_pages"]
