"""Bounded, jittered retry timing shared by every caller of the object store.

Example:
    >>> policy = RetryPolicy(max_attempts=3, base_delay_s=0.1, max_delay_s=1.0)
    >>> [round(d, 3) for d in policy.delays(random.Random(7))]
    [0.032, 0.03]
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


def full_jitter(retry: int, base_s: float, max_s: float, rng: random.Random | Any = random) -> float:
    """The pause before retry number ``retry`` (0-based): ``uniform(0, min(max_s, base_s * 2**retry))``.
    The one backoff shape of the system (store retries, the agent client).

    >>> full_jitter(3, 0.0, 1.0)
    0.0
    """
    return rng.uniform(0, min(max_s, base_s * (2 ** min(retry, 62))))


@dataclass(frozen=True)
class RetryPolicy:
    """``max_attempts`` tries in all, separated by full-jitter exponential delays.

    Full jitter (a uniform draw below the exponential cap) spreads collectors that collided
    on one key, which is what a 409 from a concurrent conditional write asks for.
    """

    max_attempts: int = 5
    base_delay_s: float = 0.05
    max_delay_s: float = 1.0
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The ``max_attempts - 1`` pauses between attempts."""
        source: Any = rng or random  # the module's shared generator unless one is given
        for n in range(self.max_attempts - 1):
            yield full_jitter(n, self.base_delay_s, self.max_delay_s, source)

    def attempts(self, rng: random.Random | None = None) -> Iterator[int]:
        """Yield attempt numbers 1..max_attempts, sleeping between them."""
        yield 1
        for n, delay in enumerate(self.delays(rng), start=2):
            self.sleep(delay)
            yield n


NO_WAIT = RetryPolicy(max_attempts=5, base_delay_s=0.0, max_delay_s=0.0, sleep=lambda _s: None)
