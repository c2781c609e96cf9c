"""Jittered exponential backoff for the agent client.

The same full-jitter shape as :class:`lightmetrics.protocol.retry.RetryPolicy` (a uniform draw below an
exponential cap, so agents that failed together do not retry together), but without a fixed
attempt count per call site: the client decides how many attempts a pass may spend.

Example:
    >>> import random
    >>> policy = BackoffPolicy(base_s=0.5, max_s=8.0)
    >>> rng = random.Random(1)
    >>> [round(policy.delay(n, rng), 3) for n in range(6)]
    [0.067, 0.847, 1.528, 1.02, 3.963, 3.596]
    >>> policy.delay(30, rng) <= 8.0
    True
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from lightmetrics.protocol.retry import full_jitter


@dataclass(frozen=True)
class BackoffPolicy:
    """Delays between attempts: ``uniform(0, min(max_s, base_s * 2**n))`` for the n-th retry.

    ``max_attempts`` bounds the attempts one batch gets in one pass (``AgentClient.run_once``);
    a batch that exhausts them stays spooled and the pass ends (every endpoint is probably down,
    so later batches would fare no better). ``honor_retry_after`` raises a delay to the server's
    ``Retry-After`` hint (capped at ``max_s``).
    """

    base_s: float = 0.5
    max_s: float = 30.0
    max_attempts: int = 6
    honor_retry_after: bool = True

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.max_s < 0 or self.max_attempts < 1:
            raise ValueError("base_s and max_s must be >= 0 and max_attempts >= 1")

    def cap(self, retry: int) -> float:
        """The upper bound of the ``retry``-th delay (0-based)."""
        return min(self.max_s, self.base_s * (2 ** min(retry, 62)))

    def delay(self, retry: int, rng: random.Random, retry_after_s: float | None = None) -> float:
        """The pause before retry number ``retry`` (0-based): the store's full jitter
        (:func:`lightmetrics.protocol.retry.full_jitter`), raised to a ``Retry-After`` hint."""
        value = full_jitter(retry, self.base_s, self.max_s, rng)
        if self.honor_retry_after and retry_after_s is not None and retry_after_s > 0:
            value = max(value, min(float(retry_after_s), self.max_s))
        return value
