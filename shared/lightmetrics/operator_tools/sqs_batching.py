"""Messages per Lambda invocation of an SQS event source, from the arrival rate and the
event source mapping's batching window and batch size (the cost model's and the keep-up model's
one answer; docs/cost.md "Messages per invocation").

Lambda's SQS event source runs ``pollers`` long-pollers per queue (5 when idle); each returns
to the queue after its previous batch, and gathers messages for up to the batching window (or
until the batch is full). One poller's batch is the message that ends its wait plus what reaches
it while it gathers: arrivals split evenly between the pollers, a Poisson stream of rate
``arrivals_per_s / pollers``, over ``window_s + poll_gap_s`` (the gap: the receive round trip and
the previous invocation, when messages pile up even without a window). So, with
``mu = arrivals_per_s / pollers * (window_s + poll_gap_s)`` and ``N ~ Poisson(mu)``::

    messages per invocation = E[min(1 + N, batch_size)] = 1 + sum_{k=1}^{batch_size-1} P(N >= k)

It rises with the rate and the window and never passes the batch size. At 100 arrivals/s, no
window, 5 pollers and a 0.1 s gap: 1 + 2 = 3 (the review measured 2-3).

Example:
    >>> round(messages_per_invocation(100.0, window_s=0.0, batch_size=10, pollers=5, poll_gap_s=0.1), 2)
    3.0
    >>> messages_per_invocation(1e6, window_s=20.0, batch_size=500, pollers=5, poll_gap_s=0.1)
    500.0
"""

from __future__ import annotations

import math


def _poisson_tail_sum(mu: float, terms: int) -> float:
    """sum_{k=1}^{terms} P(N >= k) for N ~ Poisson(mu)."""
    if terms <= 0 or mu <= 0:
        return 0.0
    if mu - 8 * math.sqrt(mu) > terms:  # every tail term is 1 to double precision
        return float(terms)
    log_pmf = -mu  # log P(N = 0)
    cdf = 0.0
    total = 0.0
    for k in range(1, terms + 1):
        cdf += math.exp(log_pmf)  # P(N <= k - 1)
        total += max(0.0, 1.0 - cdf)
        log_pmf += math.log(mu) - math.log(k)
    return total


def messages_per_invocation(arrivals_per_s: float, *, window_s: float, batch_size: int, pollers: int,
                            poll_gap_s: float) -> float:
    """Expected SQS messages in one invocation (the formula above)."""
    if batch_size < 1 or pollers < 1 or arrivals_per_s < 0 or window_s < 0 or poll_gap_s < 0:
        raise ValueError("batch_size and pollers at least 1; rate, window and gap not negative")
    mu = arrivals_per_s / pollers * (window_s + poll_gap_s)
    return 1.0 + _poisson_tail_sum(mu, batch_size - 1)
