"""Dry runs (docs/protocol.md §16.1): a dry run deletes nothing (rule DR1) and counts everything it
reports (rule DR2).

DR1 is kept twice over: no dry-run path leads to a write (a dry run never enters the settle phase,
never records an intent, never commits a tombstone), and a dry run's fence refuses every request it
is asked to guard (:class:`DryRunFence`). Every S3 write of a reap is sent right after its fence
(§13 L2), so a path that forgot the rule fails loudly instead of deleting. The marks a failed reap
left are counted (:func:`would_settle`), not settled.

DR2: a retention dry run counts an hour's keys by listing them all, :data:`PAGE_KEYS` a request, at
most :data:`LISTS_PER_TASK` requests a task; the next task goes on from the cursor
(:func:`count_keys`).

Example::

    >>> from lightmetrics.reaps.gc_marks import Mark
    >>> from lightmetrics.reaps.state import MarkState
    >>> m = Mark("k", "s", "v", "m", 0, 0, "unreferenced")
    >>> would_settle([MarksItem(MarkState.MARKED, (m, m)), MarksItem(MarkState.MARKED, (m,))])
    3
"""

from __future__ import annotations

from typing import Any

from lightmetrics.reaps.gc_marks import MarksItem
from lightmetrics.work.leases import Fence

#: Keys a listing request returns (S3's most).
PAGE_KEYS = 1000
#: Listing requests of one task: 100,000 keys, a few seconds; a larger hour takes more tasks.
LISTS_PER_TASK = 100


class DryRunWrite(RuntimeError):
    """A dry run reached a write: a bug (rule DR1); the request was not sent."""


class DryRunFence(Fence):
    """The fence of a dry run's tasks: it refuses every destructive request it would guard."""

    def renew(self) -> None:
        self._refuse()

    def __call__(self) -> None:
        self._refuse()

    def _refuse(self) -> None:
        raise DryRunWrite(f"reap epoch {self.holder.epoch} is a dry run: a dry run sends no write "
                          "(docs/protocol.md §16.1 DR1); the request was not sent")


def would_settle(marks_items: list[MarksItem]) -> int:
    """The blobs a settle of these marks items (:func:`~lightmetrics.reaps.gc_marks.read_marks_items`)
    would purge or restore: what a dry run reports instead of settling them."""
    return sum(len(item.marks) for item in marks_items)


def count_keys(store: Any, prefixes: list[str], after: str) -> tuple[int, str, bool]:
    """Count the keys under ``prefixes`` (none a prefix of another) after the cursor ``after``:
    ``(keys counted, the new cursor, whether keys may follow)``, at most :data:`LISTS_PER_TASK`
    listings of :data:`PAGE_KEYS`. The prefixes are taken in key order, so one key cursor orders
    them all; a prefix wholly before the cursor costs no request."""
    counted, lists = 0, 0
    for prefix in sorted(prefixes):
        if after > prefix and not after.startswith(prefix):
            continue  # counted already
        truncated = True
        while truncated:
            if lists >= LISTS_PER_TASK:
                return counted, after, True
            page = store.list_page(prefix, max_keys=PAGE_KEYS, start_after=after if after.startswith(prefix) else None)
            lists += 1
            counted += len(page.keys)
            after = page.keys[-1] if page.keys else after
            truncated = bool(page.truncated and page.keys)
    return counted, after, False


__all__ = ["DryRunFence", "DryRunWrite", "LISTS_PER_TASK", "PAGE_KEYS", "count_keys", "would_settle"]
