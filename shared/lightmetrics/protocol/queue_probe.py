"""The queue ports: how the reconciler sees the index queues (:class:`QueueProbe`: whether they may
still deliver entries for an hour), and how status reads their depths (:class:`QueueDepths`). The
adapters are in :mod:`lightmetrics.aws.queue_probes` and :mod:`lightmetrics.aws.sqs_queues`, built
by the composition root (:func:`lightmetrics.composition.services.queue_probe`,
:func:`~lightmetrics.composition.services.queue_depths`).
"""

from __future__ import annotations

from typing import Protocol


class QueueProbe(Protocol):
    """Tells whether the index pipeline may still deliver entries for an hour."""

    def quiet_since(self, hour_end_ns: int, now_ns: int) -> bool:
        """True if no index queue holds a message sent before ``hour_end_ns``."""
        ...

    def dlqs_empty(self) -> bool: ...


class QueueDepths(Protocol):
    """The depth of a queue: what ``lmctl status`` and the admin API's status report per queue."""

    def depth(self, url: str) -> int:
        """Visible plus in-flight messages of the queue at ``url`` (one request)."""
        ...
