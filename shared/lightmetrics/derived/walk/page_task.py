"""The walk's page task (docs/walks.md; docs/protocol.md §13 W4, W5): one page of one partition —
list up to a page of keys after the partition's cursor, check each record and repair what is
missing, then record the cursor and counters in the partition's own item."""

from __future__ import annotations

from collections import Counter
from typing import Any

from lightmetrics.derived.walk.checkpoint import KEY_CHECKS, PART_PREFIX, WalkPartition
from lightmetrics.derived.walk.checks import RecordChecks
from lightmetrics.derived.walk.errors import WalkRetryLater
from lightmetrics.derived.walk.params import LIST_MAX_KEYS
from lightmetrics.derived.walk.state import WalkRun
from lightmetrics.derived.walk.walker_base import POOL, WalkJob, add_counts
from lightmetrics.protocol.control_store import ConditionFailed, plain
from lightmetrics.protocol.object_store import ListPage
from lightmetrics.protocol.own_writes import WrittenByOther, update_own
from lightmetrics.work.leases import OWNED, LeaseLost
from lightmetrics.work.outcome import Outcome
from lightmetrics.work.pool import map_in_context


class PageTask:
    """The ``page`` task of :class:`~lightmetrics.derived.walk.steps.Walker`, over its :class:`WalkJob`."""

    def __init__(self, job: WalkJob) -> None:
        self.job, self.kernel, self.ctx, self.table = job, job.kernel, job.ctx, job.table

    def _list(self, partition: str, page_size: int, after: str) -> ListPage:
        """Up to ``page_size`` keys of ``partition`` after ``after``, in listings of at most 1,000."""
        keys: list[str] = []
        sizes: list[int] = []
        modified: list[int] = []
        while True:
            part = self.ctx.store.list_page(
                partition, max_keys=min(LIST_MAX_KEYS, page_size - len(keys)), start_after=(keys[-1] if keys else after) or None)
            keys += part.keys
            sizes += part.sizes
            modified += part.last_modified_ns if len(part.last_modified_ns) == len(part.keys) else []
            if not part.truncated or len(keys) >= page_size or not part.keys:
                truncated = part.truncated and bool(part.keys)
                break
        if len(modified) != len(keys):
            modified = []  # a listing without LastModified: every key is repaired in full
        return ListPage(keys=keys, sizes=sizes, prefixes=[], truncated=truncated, last_modified_ns=modified)

    def _owned_update(self, walk: WalkRun, partition: str, expression: str, names: dict[str, str],
                      values: dict[str, Any]) -> None:
        """Update ``partition``'s item on condition this walk's epoch still owns it; else LeaseLost."""
        own_names, own_values = self.kernel.owned(walk)
        try:
            self.table.update(walk["checkpoint_pk"], PART_PREFIX + partition, expression,
                              names={**own_names, **names}, values={**own_values, **values}, condition=OWNED)
        except ConditionFailed:
            raise LeaseLost(f"epoch {walk['epoch']} lost partition {partition}") from None

    def _run_keys(self, walk: WalkRun, partition: str, listing: ListPage, skipped: set[str], retried: bool,
                  failed_through: str, blocked: frozenset[str] = frozenset()) -> list[tuple[str, str | None]]:
        """Each key's (outcome, the check that settled it or None), in the listing's order."""
        keys = listing.keys

        def failed_before(key: str) -> bool:  # a key with an open blocker too: its success resolves it (O4)
            return retried or key <= failed_through or key in blocked

        # Rules W4, W5: an acceptance record is probed for its accepted-by-time entry only; a key
        # that may have failed before (a retried page, or up to ``failed_through``) is repaired in
        # full, so its success clears its budget (O1a).
        checks = RecordChecks(self.job, [(k, lm) for k, lm in zip(keys, listing.last_modified_ns)
                                     if k not in skipped and not failed_before(k)], epoch=int(walk["epoch"])) \
            if not retried and not walk.get("full") and self.job.kind(partition) == "accepted" \
            and len(listing.last_modified_ns) == len(keys) else None

        def one(key: str) -> tuple[str, str | None]:
            if key in skipped:
                return "SKIPPED", None  # an operator decided; counted, so no watermark from this walk
            settled = checks.settle(key) if checks is not None and not failed_before(key) else None
            if settled is not None:
                return Outcome.NOOP_RESOLVED.value, settled
            refused = checks.refusal(key) if checks is not None else None
            if refused is not None:  # never a v1 repair over a refused v2 object: the object is the blocker
                return self.job.refuse(refused).value, None
            return self.job.repair(key, previously_failed=failed_before(key)).value, None

        if len(keys) > 1:
            results = map_in_context(POOL, one, keys)
        else:
            results = [one(k) for k in keys]
        return results

    def page(self, event: dict[str, Any]) -> dict[str, Any]:
        walk, item = event["walk"], event["item"]
        partition, after = item["partition"], item.get("after") or ""
        pk, sk = walk["checkpoint_pk"], PART_PREFIX + partition
        retried = int(event.get("retry_count") or 0) > 0
        # O1a: the last key of a page of this partition that ended RETRY_LATER in this epoch (an
        # earlier execution's, before a resume): keys up to it may have a failure on record.
        failed_through = item.get("failed_through") or ""
        skipped = set(item.get("skipped") or ())
        listing = self._list(partition, int(walk["page_size"]), after)
        keys = listing.keys
        if retried and keys and keys[-1] > failed_through:
            # An earlier attempt of this page died (a timeout, a crash) after its units may have
            # recorded failures: say so before the work, so that if this attempt dies too, a resumed
            # walk still repairs these keys in full (O1a). One write, on retries only.
            self._owned_update(walk, partition, "SET #ft = :ft", {"#ft": "failed_through"}, {":ft": keys[-1]})
            failed_through = keys[-1]

        results = self._run_keys(walk, partition, listing, skipped, retried, failed_through,
                                 frozenset(item.get("blocked") or ()))
        outcomes = Counter(outcome for outcome, _ in results)
        settled_by = Counter(check for _, check in results if check is not None)
        now = self.job.now()
        if outcomes["RETRY_LATER"]:
            # ``failed_through`` survives the execution: a resumed page repairs those keys in
            # full, whichever page size it runs with (O1a).
            self._owned_update(walk, partition, "ADD #o.#r :n SET #u = :now, #ft = :ft",
                               {"#o": "outcomes", "#r": "RETRY_LATER", "#u": "updated_at_ns", "#ft": "failed_through"},
                               {":n": outcomes["RETRY_LATER"], ":now": now, ":ft": max(failed_through, keys[-1])})
            raise WalkRetryLater(f"{outcomes['RETRY_LATER']} of {len(keys)} keys in {partition} are RETRY_LATER; "
                                 "the cursor stays before them")
        done = not listing.truncated
        last = keys[-1] if keys else after
        names, values = self.kernel.owned(walk)
        names.update({"#a": "after", "#d": "done", "#pg": "pages", "#u": "updated_at_ns", "#k": "keys"})
        values.update({":last": last, ":done": done, ":prev": after, ":one": 1, ":n": len(keys), ":now": now})
        adds = ["#pg :one", "#k :n"]
        add_counts(names, values, adds, settled_by, outcomes)
        # Rule L2: the page commits only right after a fence (which also renews the lease).
        self.kernel.fence(walk).renew()
        try:
            # Only after every key's repair finished: the cursor (compare-and-set) and the counters.
            update_own(self.table, pk, sk, "SET #a = :last, #d = :done, #u = :now ADD " + ", ".join(adds),
                       names=names, values=values, condition=OWNED + " AND #a = :prev")
        except WrittenByOther as moved:  # not this page's own commit (§11.1)
            current = None if moved.current is None else WalkPartition.of(plain(moved.current))
            if current is None or not current.owned_by(walk["epoch"], walk["owner"]):
                raise LeaseLost(f"epoch {walk['epoch']} lost partition {partition}") from None
            # The cursor moved already: this page was walked twice (a retried task); nothing to count.
            return {"partition": partition, "keys": len(keys), "stale": True}
        return {"partition": partition, "keys": len(keys), "done": done, "outcomes": dict(outcomes),
                **{f"keys_{c}": settled_by[c] for c in KEY_CHECKS if settled_by[c]}}
