"""Dry runs (docs/protocol.md §16.1): a dry run deletes nothing (rule DR1).

DR1 is kept twice over: no dry-run path leads to a write (a dry run never enters the settle phase,
never records an intent, never commits a tombstone), and a dry run's fence refuses every request it
is asked to guard (:class:`DryRunFence`). Every S3 write of a reap is sent right after its fence
(§13 L2), so a path that forgot the rule fails loudly instead of deleting. The marks a failed reap
left are counted (:func:`would_settle`), not settled.

Example::

    >>> would_settle([{"marks": [{}, {}]}, {"marks": [{}]}])
    3
"""

from __future__ import annotations

from typing import Any

from lightmetrics.ops.leases import Fence


class DryRunWrite(RuntimeError):
    """A dry run reached a write: a bug (rule DR1); the request was not sent."""


class DryRunFence(Fence):
    """The fence of a dry run's tasks: it refuses every destructive request it would guard."""

    def renew(self) -> None:
        self._refuse()

    def __call__(self) -> None:
        self._refuse()

    def _refuse(self) -> None:
        raise DryRunWrite(f"reap epoch {self.run['epoch']} is a dry run: a dry run sends no write "
                          "(docs/protocol.md §16.1 DR1); the request was not sent")


def would_settle(marks_items: list[dict[str, Any]]) -> int:
    """The blobs a settle of these marks items (:func:`~lightmetrics.reaps.gc_marks.read_marks_items`)
    would purge or restore: what a dry run reports instead of settling them."""
    return sum(len(item.get("marks") or []) for item in marks_items)


__all__ = ["DryRunFence", "DryRunWrite", "would_settle"]
