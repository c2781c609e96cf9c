"""The reconciler's records (docs/protocol.md §12; docs/control-table.md) and a run's report.

One checkpoint item per shard (``checkpoint#reconcile``/``current`` for shard 0, ``shard#<i>`` for
the others, R8), what a checkpoint holds (:class:`Checkpoint`, read by :func:`checkpoint_of`), the
overall checkpoint of several shards (:class:`ShardCheckpoints`), the bounds of its failed-entry
list and the checkpoint's conditional write (:func:`write_checkpoint`, :func:`failed_after`), and
:class:`ReconcileReport`. The algorithm that writes them is :mod:`lightmetrics.derived.reconcile`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.derived.hour_ranges import RangePlan
from lightmetrics.protocol.clock import utc_text
from lightmetrics.protocol.control_store import ConditionFailed, ControlStore
from lightmetrics.protocol.errors import LightmetricsError
from lightmetrics.protocol.keys import KeyCodec, UtcHour
from lightmetrics.protocol.own_writes import put_own

_NS = 1_000_000_000

CHECKPOINT_PK, CHECKPOINT_SK = "checkpoint#reconcile", "current"

#: A shard none of whose runs finished for this long has stopped (R9): its schedule fires every
#: 5 minutes and a run ends within the function's 900 s timeout, so an hour is several runs lost.
RUN_OVERDUE_S = 3600


def lag_limit_s(settle_s: int) -> int:
    """The checkpoint lag above which the reconciler is stuck (R9): the ``ReconcilerLag`` alarm's
    threshold and ``lmctl status``'s. An hour closes ``settle_s`` after it ends at the earliest, so
    a healthy checkpoint is at most an hour plus ``settle_s`` behind; two hours leave a run's slack.

    >>> lag_limit_s(900)
    8100
    """
    return 2 * 3600 + settle_s


def checkpoint_sk(shard: int) -> str:
    """The sort key of ``shard``'s checkpoint item (R8): shard 0 keeps ``current``, the item of
    every deployment before shards, which is shard 0 of 1.

    >>> checkpoint_sk(0), checkpoint_sk(3)
    ('current', 'shard#3')
    """
    return CHECKPOINT_SK if shard == 0 else f"shard#{shard}"


class ShardError(LightmetricsError, ValueError):
    """A shard that is not one of ``0 .. LM_RECONCILE_SHARDS - 1`` (or not a whole number)."""


def check_shard(shard: object, shards: int) -> int:
    """``shard`` if it names one of ``shards`` shards, else :class:`ShardError` saying which exist.

    >>> check_shard(2, 3)
    2
    """
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < shards:
        raise ShardError(f"shard must be a whole number from 0 to {shards - 1} "
                         f"(LM_RECONCILE_SHARDS = {shards}), got {shard!r}")
    return shard


def unowned_ranges(plan: RangePlan, shards: int) -> str:
    """What a plan with more ranges than ``shards`` leaves unchecked, in words ("" if nothing).

    >>> unowned_ranges(RangePlan(None, ("b", "m")), 2)
    'range 2 of 3 has no shard (LM_RECONCILE_SHARDS = 2)'
    """
    if plan.ranges <= shards:
        return ""
    which = f"range {shards}" if plan.ranges == shards + 1 else f"ranges {shards}-{plan.ranges - 1}"
    return f"{which} of {plan.ranges} {'has' if plan.ranges == shards + 1 else 'have'} no shard " \
           f"(LM_RECONCILE_SHARDS = {shards})"


#: entry keys of failed units the checkpoint remembers, at most, and at most this many bytes of them:
#: the item stays far below DynamoDB's 400 KB (500 keys of the longest identities, 128-byte ids,
#: would take ~330 KB; typical ones ~60 KB)
FAILED_ENTRIES_MAX = 500
FAILED_ENTRIES_MAX_BYTES = 80_000


def failures_that_fit(keys: list[str], *, count: int = 0, size: int = 0) -> int:
    """How many of ``keys``, in order, the checkpoint can list after ``count`` keys of ``size``
    bytes already listed (:data:`FAILED_ENTRIES_MAX`, :data:`FAILED_ENTRIES_MAX_BYTES`).

    >>> failures_that_fit(["a" * 30_000] * 4)
    2
    """
    fit = 0
    for key in keys:
        size += len(key.encode())
        if count + fit >= FAILED_ENTRIES_MAX or size > FAILED_ENTRIES_MAX_BYTES:
            break
        fit += 1
    return fit


@dataclass
class Checkpoint:
    hour: UtcHour  # the first hour not yet closed
    version: int
    last_run_ns: int
    verified_before_ns: int = 0
    #: the last hour ``verified_before_ns`` speaks for; entries of later hours are always checked
    verified_through: UtcHour | None = None
    #: where the next run continues a scan that stopped at its cap (catch-up or rescan)
    scan_from: UtcHour | None = None
    #: ``accepted-by-time`` keys whose unit ended RETRY_LATER or BLOCKED and has not run since:
    #: when one succeeds its retry budget is cleared
    failed_entries: tuple[str, ...] = ()
    #: more failed units than ``FAILED_ENTRIES_MAX``: every unit counts as failed before
    failed_overflow: bool = False
    #: in hour ``scan_from``: entries up to this key (and older than ``scan_after_before_ns``) were
    #: checked by the run that stopped at its entry cap
    scan_after: str | None = None
    scan_after_before_ns: int = 0
    #: ``failed_entries`` holds every RETRY_LATER entry up to ``scan_after`` (R7); a cursor saved
    #: before that rule, under ``failed_overflow``, is not trusted: its hour is listed again from its start
    scan_after_failures_listed: bool = False
    #: a failed entry up to ``scan_after`` (BLOCKED: its blocker remembers it) is not in
    #: ``failed_entries``: the run that finishes this pass over the hour neither closes it nor moves
    #: the R4 watermark, and the hour is listed again from its start (R7)
    scan_after_unlisted: bool = False
    #: when a run of this shard last finished (its final save; progress saves keep it), 0 before R9
    finished_ns: int = 0
    #: why that run failed ("" if it did not): status and ``ReconcilerShardsStuck`` name it (R9)
    failure: str = ""


def checkpoint_of(item: dict[str, Any] | None) -> Checkpoint | None:
    """A checkpoint item (any shard's) as a :class:`Checkpoint`; None for no item."""
    if item is None:
        return None

    def hour_or_none(name: str) -> UtcHour | None:
        return UtcHour(int(item[name])) if item.get(name) is not None else None

    return Checkpoint(UtcHour(int(item["hour_start_s"])), int(item["version"]), int(item.get("last_run_ns", 0)),
                      int(item.get("verified_before_ns", 0)), hour_or_none("verified_through_s"),
                      hour_or_none("scan_from_s"), tuple(item.get("failed_entries") or ()),
                      bool(item.get("failed_overflow", False)), item.get("scan_after") or None,
                      int(item.get("scan_after_before_ns") or 0), bool(item.get("scan_after_failures_listed")),
                      bool(item.get("scan_after_unlisted")), int(item.get("finished_ns") or 0),
                      str(item.get("failure") or ""))


def write_checkpoint(table: ControlStore, sk: str, new_hour: UtcHour, expected: Checkpoint | None, now_ns: int,
                     verified_before_ns: int = 0, *, verified_through: UtcHour | None = None,
                     scan_from: UtcHour | None = None, failed_entries: tuple[str, ...] = (),
                     failed_overflow: bool = False, scan_after: str | None = None, scan_after_before_ns: int = 0,
                     scan_after_unlisted: bool = False, finished_ns: int = 0, failure: str = "") -> bool:
    """Write a checkpoint item over ``expected`` (conditional on its version; None: on no item).
    False if another run wrote first: a checkpoint never moves back. ``finished_ns`` and
    ``failure``: when the shard's last run finished and why it failed (R9)."""
    values = {"pk": CHECKPOINT_PK, "sk": sk, "hour_start_s": new_hour.start_unix_s,
              "hour": str(new_hour), "version": (expected.version + 1) if expected else 1, "last_run_ns": now_ns,
              "verified_before_ns": verified_before_ns,
              "verified_through_s": verified_through.start_unix_s if verified_through else None,
              "scan_from_s": scan_from.start_unix_s if scan_from else None,
              "failed_entries": list(failed_entries) or None, "failed_overflow": failed_overflow or None,
              "scan_after": scan_after, "scan_after_before_ns": scan_after_before_ns if scan_after else None,
              "scan_after_failures_listed": True if scan_after else None,
              "scan_after_unlisted": True if scan_after and scan_after_unlisted else None,
              "finished_ns": finished_ns or None, "failure": failure or None}
    try:
        if expected is None:
            put_own(table, values, condition="attribute_not_exists(pk)")
        else:
            put_own(table, values, condition="#v = :v", names={"#v": "version"},
                    values_for_condition={":v": expected.version})
        return True
    except ConditionFailed:
        return False


def failed_after(codec: KeyCodec, cp: Checkpoint | None, failed_now: set[str], start: UtcHour, end: UtcHour,
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


@dataclass(frozen=True)
class ShardCheckpoints:
    """Every shard's checkpoint (None: the shard never ran). The overall checkpoint — the first
    hour not closed by every shard — is the slowest shard's (R8).

    Example:
        >>> cps = read_shard_checkpoints(table, 32)                      # doctest: +SKIP
        >>> cps.hour, cps.slowest                                         # doctest: +SKIP
        (UtcHour(2026-11-26T13), 7)
    """

    checkpoints: tuple[Checkpoint | None, ...]

    @property
    def slowest(self) -> int:
        """The shard furthest behind: one that never ran, else the earliest checkpoint (the lowest
        shard on a tie)."""
        return min(range(len(self.checkpoints)),
                   key=lambda i: (self.checkpoints[i] is not None,
                                  cp.hour.start_unix_s if (cp := self.checkpoints[i]) else 0, i))

    @property
    def hour(self) -> UtcHour | None:
        """The overall checkpoint; None while a shard has none (hours it has not closed are not closed)."""
        cp = self.checkpoints[self.slowest]
        return cp.hour if cp else None

    def lag_s(self, now_ns: int) -> float | None:
        hour = self.hour
        return None if hour is None else max(0.0, (now_ns - hour.start_ns) / _NS)

    def shard_causes(self, now_ns: int) -> list[str]:
        """Why shards are stuck (R9), one line each: a shard that never ran, whose last run failed,
        or none of whose runs finished for :data:`RUN_OVERDUE_S` ([] if none is)."""
        causes, shards = [], len(self.checkpoints)
        for i, cp in enumerate(self.checkpoints):
            if cp is None:
                causes.append(f"reconciler shard {i} has never run: no checkpoint item (is its schedule deployed? "
                              f"LM_RECONCILE_SHARDS = {shards}; run it: lmctl reconcile --shard {i})")
                continue
            ended = cp.finished_ns or cp.last_run_ns  # a checkpoint older than R9 has no finished_ns
            if cp.failure:
                causes.append(f"reconciler shard {i}: its last run failed (finished {utc_text(ended)}): {cp.failure}")
            if now_ns - ended > RUN_OVERDUE_S * _NS:
                causes.append(f"reconciler shard {i}: no run finished since {utc_text(ended)} (more than "
                              f"{RUN_OVERDUE_S} s; its schedule runs every 5 minutes): see its function's Errors")
        return causes

    def lag_cause(self, now_ns: int, settle_s: int) -> str:
        """The overall lag, if above :func:`lag_limit_s` (R9); "" otherwise (a shard without a
        checkpoint is named by :meth:`shard_causes`)."""
        lag, limit = self.lag_s(now_ns), lag_limit_s(settle_s)
        if lag is None or lag <= limit:
            return ""
        return (f"reconciler lag {lag:.0f} s is above the ReconcilerLag alarm's {limit} s: shard {self.slowest}'s "
                f"checkpoint {self.hour} is the first hour not closed (why: lmctl reconcile --shard {self.slowest})")


def read_shard_checkpoints(table: ControlStore, shards: int) -> ShardCheckpoints:
    """The checkpoints of shards ``0 .. shards - 1``: one GetItem each (the items may be large,
    R6; a Query of the partition would read shards no longer configured too)."""
    return ShardCheckpoints(tuple(checkpoint_of(table.get(CHECKPOINT_PK, checkpoint_sk(i))) for i in range(shards)))


@dataclass
class ReconcileReport:
    checkpoint_before: str
    checkpoint_after: str
    hours_scanned: list[str] = field(default_factory=list)
    entries: int = 0
    verified_earlier: int = 0  # entries listed but not repaired again (see "Verified once")
    outcomes: Counter[str] = field(default_factory=Counter)
    closed: list[str] = field(default_factory=list)
    not_closed_because: str = ""
    continues_from: str = ""  # the hour the next run's scan starts at, when this run stopped at its cap
    continues_after: str = ""  # the entry key after which it continues, when the entry cap stopped it mid-hour
    blob_hours_listed: int = 0  # raw-blobs-by-time hours listed (once each per run)
    list_pages: int = 0  # ListObjectsV2 requests of accepted-by-time and raw-blobs-by-time (R7's page cap)
    lag_s: float = 0.0
    moved_by_other_run: bool = False
    shard: int = 0
    blob_heads: int = 0  # raw-blobs-by-time HEADs of the sharded blob check (R8)
    unowned_ranges: list[str] = field(default_factory=list)  # "<hour>: ranges ... have no shard" (R8)
    #: shard 0 of several: the slowest shard and the overall checkpoint (R8); "" otherwise
    slowest_shard: str = ""
    overall_checkpoint: str = ""
    #: the shard message it ran for was served by a later run of the shard: nothing done (R8)
    stale: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "checkpoint_before": self.checkpoint_before,
            "checkpoint_after": self.checkpoint_after,
            "hours_scanned": self.hours_scanned,
            "entries": self.entries,
            "verified_earlier": self.verified_earlier,
            "outcomes": dict(self.outcomes),
            "closed": self.closed,
            "not_closed_because": self.not_closed_because,
            "continues_from": self.continues_from,
            "continues_after": self.continues_after,
            "blob_hours_listed": self.blob_hours_listed,
            "list_pages": self.list_pages,
            "lag_s": round(self.lag_s, 1),
            "moved_by_other_run": self.moved_by_other_run,
            "blob_heads": self.blob_heads,
            "unowned_ranges": self.unowned_ranges,
            "slowest_shard": self.slowest_shard,
            "overall_checkpoint": self.overall_checkpoint,
            "stale": self.stale,
        }


class UnownedRangesError(LightmetricsError):
    """A run scanned hours whose range plan has more ranges than ``LM_RECONCILE_SHARDS``: no shard
    checks the ranges past the last shard (R8). Raised after the run saved its progress, with those
    hours kept open; ``report`` is the run's report."""

    def __init__(self, message: str, report: "ReconcileReport") -> None:
        super().__init__(message)
        self.report = report


__all__ = ["CHECKPOINT_PK", "CHECKPOINT_SK", "RUN_OVERDUE_S", "Checkpoint", "ReconcileReport", "ShardCheckpoints",
           "ShardError", "UnownedRangesError", "check_shard", "checkpoint_of", "checkpoint_sk", "failed_after",
           "failures_that_fit", "lag_limit_s", "read_shard_checkpoints", "unowned_ranges", "write_checkpoint"]
