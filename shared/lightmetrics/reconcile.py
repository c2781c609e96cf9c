"""The steady-state reconciler: repairs what hangs off ``accepted-by-time`` since a checkpoint.

Events get lost; the reconciler is what makes derived state converge anyway (brief §6). Each run
lists the ``accepted-by-time`` hours from its checkpoint (the first hour not yet closed) up to
the current hour and repairs every entry it has not verified before with
:func:`lightmetrics.indexing.repair_accepted` — the same code the walk uses.

Verified once. A repair that ends DONE or NOOP_RESOLVED leaves every derived entry of that batch
in place, so checking it again on every run until its hour closes (about a dozen runs) buys
nothing. The checkpoint keeps ``verified_before_ns``: entries whose ``LastModified`` (S3's clock,
read from the listing, so no clock skew between us and S3) is older were verified by an earlier
run. A run that saw entries sets it to the newest ``LastModified`` it listed minus
``LM_RECONCILE_MARGIN_S`` (longer than any PUT in flight: a PUT that began earlier but was not
yet visible to the listing is still checked next time) — but only if no entry ended RETRY_LATER
or BLOCKED, so such entries (and a blocker an operator resumes) are checked again. After
downtime it starts over from 0. The listing is the only per-entry cost of a steady-state run:
one LIST per 1,000 entries of the open hours, plus the repairs of new entries.

Closing an hour. Keys inside an hour are not time-ordered, so the checkpoint moves past hour H
only when no more entries can appear in it: H ended more than ``LM_SETTLE_S`` ago, no index
queue holds a message older than H's end (in AWS: CloudWatch ApproximateAgeOfOldestMessage;
locally: visible + in-flight messages = 0), every DLQ is empty, no indexing blocker is open,
and this run left nothing in H at RETRY_LATER. The checkpoint is advanced by a conditional
write on its version, so overlapping runs can neither move it back nor skip an hour.

What it cannot do: find an accepted manifest whose ``accepted-by-time`` entry is missing (that
index is its input). The bootstrap walk and the inventory audit find those.

Example:
    >>> report = Reconciler(ctx, settings, probe).run()                # doctest: +SKIP
    >>> report.lag_s                                                    # doctest: +SKIP
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from lightmetrics.config import Settings
from lightmetrics.control_table import ConditionFailed
from lightmetrics.indexing import KIND_REPAIR, repair_accepted
from lightmetrics.keys import KeyKind, UtcHour
from lightmetrics.outcome import Outcome
from lightmetrics.work import WorkContext, run_unit

log = logging.getLogger(__name__)
_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="lm-reconcile")

CHECKPOINT_PK, CHECKPOINT_SK = "checkpoint#reconcile", "current"
#: blocker kinds that keep hours open: derived state may still be missing behind them
INDEXING_KINDS = ("index-accepted", "index-raw-blob", "index-quarantine", "event-parse", "repair-accepted", "dlq")
_NS = 1_000_000_000


class QueueProbe(Protocol):
    """Tells whether the index pipeline may still deliver entries for an hour."""

    def quiet_since(self, hour_end_ns: int, now_ns: int) -> bool:
        """True if no index queue holds a message sent before ``hour_end_ns``."""
        ...

    def dlqs_empty(self) -> bool: ...


class SqsCountProbe:
    """Local rule: a queue is quiet when visible + in-flight messages = 0 (no age metric in moto)."""

    def __init__(self, sqs: Any, queue_urls: list[str], dlq_urls: list[str]) -> None:
        self.sqs, self.queue_urls, self.dlq_urls = sqs, queue_urls, dlq_urls

    def _depth(self, url: str) -> int:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])

    def quiet_since(self, hour_end_ns: int, now_ns: int) -> bool:
        return all(self._depth(u) == 0 for u in self.queue_urls)

    def dlqs_empty(self) -> bool:
        return all(self._depth(u) == 0 for u in self.dlq_urls)


class CloudWatchAgeProbe(SqsCountProbe):
    """AWS rule: the oldest message of every index queue is younger than the hour's end."""

    def __init__(self, sqs: Any, cloudwatch: Any, queue_names: list[str], queue_urls: list[str],
                 dlq_urls: list[str]) -> None:
        super().__init__(sqs, queue_urls, dlq_urls)
        self.cloudwatch, self.queue_names = cloudwatch, queue_names

    def quiet_since(self, hour_end_ns: int, now_ns: int) -> bool:
        allowed_age_s = (now_ns - hour_end_ns) / _NS
        end = time.time()
        for name in self.queue_names:
            stats = self.cloudwatch.get_metric_statistics(
                Namespace="AWS/SQS", MetricName="ApproximateAgeOfOldestMessage",
                Dimensions=[{"Name": "QueueName", "Value": name}], StartTime=end - 600, EndTime=end,
                Period=60, Statistics=["Maximum"],
            )
            points = stats.get("Datapoints", [])
            if not points:
                return False  # no evidence is not evidence of quiet
            if max(p["Maximum"] for p in points) >= allowed_age_s:
                return False
        return True


@dataclass
class Checkpoint:
    hour: UtcHour
    version: int
    last_run_ns: int
    verified_before_ns: int = 0


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
    lag_s: float = 0.0
    moved_by_other_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint_before": self.checkpoint_before,
            "checkpoint_after": self.checkpoint_after,
            "hours_scanned": self.hours_scanned,
            "entries": self.entries,
            "verified_earlier": self.verified_earlier,
            "outcomes": dict(self.outcomes),
            "closed": self.closed,
            "not_closed_because": self.not_closed_because,
            "lag_s": round(self.lag_s, 1),
            "moved_by_other_run": self.moved_by_other_run,
        }


class Reconciler:
    def __init__(self, ctx: WorkContext, settings: Settings, probe: QueueProbe) -> None:
        self.ctx, self.settings, self.probe = ctx, settings, probe
        self.table = ctx.extras["table"]

    # -- checkpoint ------------------------------------------------------------------------
    def checkpoint(self) -> Checkpoint | None:
        item = self.table.get(CHECKPOINT_PK, CHECKPOINT_SK)
        if item is None:
            return None
        return Checkpoint(UtcHour(int(item["hour_start_s"])), int(item["version"]), int(item.get("last_run_ns", 0)),
                          int(item.get("verified_before_ns", 0)))

    def _save(self, new_hour: UtcHour, expected: Checkpoint | None, now_ns: int, verified_before_ns: int = 0) -> bool:
        values = {"pk": CHECKPOINT_PK, "sk": CHECKPOINT_SK, "hour_start_s": new_hour.start_unix_s,
                  "hour": str(new_hour), "version": (expected.version + 1) if expected else 1, "last_run_ns": now_ns,
                  "verified_before_ns": verified_before_ns}
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
    def run(self, *, max_hours: int = 72) -> ReconcileReport:
        now = self.ctx.clock.now_ns()
        current = UtcHour.of_unix_ns(now)
        cp = self.checkpoint()
        lookback_start = UtcHour.of_unix_ns(now - self.settings.reconcile_lookback_s * _NS)
        since = 0
        if cp is None:
            start = lookback_start
        else:
            start = cp.hour
            downtime = now - cp.last_run_ns > max(2 * self.settings.settle_s, 3600) * _NS
            if downtime and lookback_start < start:
                start = lookback_start  # events may have been lost while nobody watched
            if not downtime:
                since = cp.verified_before_ns
        first_open = cp.hour if cp else start
        report = ReconcileReport(checkpoint_before=str(cp.hour) if cp else "-", checkpoint_after="")
        hour, retry_hours = start, set()
        scanned, newest = 0, 0
        while hour <= current and scanned < max_hours:
            retry, hour_newest = self._scan_hour(hour, report, since)
            retry_hours |= retry
            newest = max(newest, hour_newest)
            hour, scanned = hour.next(), scanned + 1
        verified_before = since
        if newest and not report.outcomes[Outcome.RETRY_LATER.value] and not report.outcomes[Outcome.BLOCKED.value]:
            verified_before = max(since, newest - self.settings.reconcile_margin_s * _NS)

        # Close hours in order while every condition holds.
        new_open = first_open
        while new_open < current:
            reason = self._why_open(new_open, now, retry_hours)
            if reason:
                report.not_closed_because = f"{new_open}: {reason}"
                break
            report.closed.append(str(new_open))
            new_open = new_open.next()
        if not report.not_closed_because:
            report.not_closed_because = f"{current}: the current hour is never closed"
        if not self._save(new_open, cp, now, verified_before):
            report.moved_by_other_run = True  # another run advanced it; never move it back
            other = self.checkpoint()
            new_open = other.hour if other else new_open
        report.checkpoint_after = str(new_open)
        report.lag_s = max(0.0, (now - new_open.start_ns) / _NS)
        self.ctx.metrics.add_metric(name="ReconcilerLagSeconds", unit="Seconds", value=report.lag_s)
        return report

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

    def _scan_hour(self, hour: UtcHour, report: ReconcileReport, since_ns: int) -> tuple[set[UtcHour], int]:
        """Repair the hour's entries not verified before ``since_ns``; (hours left at RETRY_LATER,
        the newest LastModified listed)."""
        report.hours_scanned.append(str(hour))
        retry: set[UtcHour] = set()
        entries = self.ctx.store.list_modified(self.ctx.codec.accepted_by_time_hour(hour), limit=10**9)
        manifest_keys = []
        for key, modified_ns in entries:
            if modified_ns < since_ns:
                report.verified_earlier += 1
                continue
            manifest_key = self._manifest_key(key)
            if manifest_key is None:
                report.outcomes["skipped-bad-entry"] += 1
            else:
                manifest_keys.append(manifest_key)
        report.entries += len(entries)
        newest = max((m for _, m in entries), default=0)

        def repair(k: str) -> Outcome:
            return run_unit(self.ctx, kind=KIND_REPAIR, object_key=k, source="reconcile",
                            fn=lambda: repair_accepted(self.ctx, k)).outcome

        futures = [_POOL.submit(contextvars.copy_context().run, repair, k) for k in manifest_keys]
        for outcome in (f.result() for f in futures):
            report.outcomes[outcome.value] += 1
            if outcome is Outcome.RETRY_LATER:
                retry.add(hour)
        return retry, newest

    def _manifest_key(self, entry_key: str) -> str | None:
        try:
            parsed = self.ctx.codec.parse(entry_key)
        except Exception:
            log.warning("ignoring %s: not an accepted-by-time key", entry_key)
            return None
        if parsed.kind is not KeyKind.ACCEPTED_BY_TIME or parsed.identity is None:
            return None
        return self.ctx.codec.accepted(parsed.identity)


__all__ = ["Reconciler", "ReconcileReport", "SqsCountProbe", "CloudWatchAgeProbe", "QueueProbe"]
