"""The queue-probe port: how the reconciler sees the index queues (whether they may still deliver
entries for an hour). The adapters are in :mod:`lightmetrics.aws.queue_probes`, built by the
composition root (:func:`lightmetrics.composition.services.queue_probe`).
"""

from __future__ import annotations

from typing import Protocol


class QueueProbe(Protocol):
    """Tells whether the index pipeline may still deliver entries for an hour."""

    def quiet_since(self, hour_end_ns: int, now_ns: int) -> bool:
        """True if no index queue holds a message sent before ``hour_end_ns``."""
        ...

    def dlqs_empty(self) -> bool: ...
