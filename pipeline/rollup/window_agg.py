"""The aggregates of one series in one sample-time window, and their reference definition.

:func:`aggregate_window` is the reference the Spark aggregation (:mod:`lightmetrics_pipeline.rollup.aggregate`)
is compared against bit for bit; :func:`exact_parts` and :func:`sum_from_parts` are the exact sum's
integer decomposition both share. Pure functions, no Spark, no I/O.

Example:
    >>> agg = aggregate_window([1.0, 2.0, 3.0], [10, 20, 30], ["m", "m", "m"], [0, 1, 2], 0)
    >>> (agg.count, agg.sum, agg.last)
    (3, 6.0, 3.0)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lightmetrics.protocol.keys import ROLLUP_WINDOWS
from lightmetrics_pipeline.rollup.sketch import (
    deserialize_sketch,
    merge_sketches,
    quantile,
    serialize_sketch,
    sketch_of,
)

WINDOW_NS: dict[str, int] = {"1m": 60 * 10**9, "5m": 300 * 10**9, "1h": 3600 * 10**9}
assert tuple(WINDOW_NS) == ROLLUP_WINDOWS

#: Exact sums: a finite non-zero value is ``mant × 2^(32·exp_b + shift)`` with ``|mant| < 2^53`` and
#: ``0 <= shift < 32``, so ``mant × 2^shift`` (< 2^85) sums exactly as DECIMAL(38, 0) per ``exp_b``.
SUM_BUCKET_BITS = 32


def exact_parts(values: Any) -> tuple[Any, Any, Any]:
    """``(exp_b, mant, shift)`` arrays for float64 ``values``, with ``exp_b = -2^31`` where a value
    is zero or not finite (it adds nothing to an exact sum: zeros add 0, infinities are counted).

    >>> [a.tolist() for a in exact_parts(__import__("numpy").array([1.0, -0.75, 0.0]))]
    [[-2, -2, -2147483648], [4503599627370496, -6755399441055744, 0], [12, 11, 0]]
    """
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    used = np.isfinite(v) & (v != 0)
    m, e = np.frexp(np.where(used, v, 1.0))
    mant = (m * 2.0 ** 53).astype(np.int64)  # exact: |m| in [0.5, 1)
    q = e.astype(np.int64) - 53  # v = mant × 2^q
    exp_b = q >> 5  # floor(q / 32)
    shift = q - exp_b * SUM_BUCKET_BITS
    none = np.int64(-2**31)
    return (np.where(used, exp_b, none).astype(np.int32), np.where(used, mant, 0),
            np.where(used, shift, 0).astype(np.int32))


def sum_from_parts(parts: Iterable[tuple[int, int]], positive_inf: bool, negative_inf: bool) -> float:
    """:func:`exact_sum` from ``(exp_b, Σ mant × 2^shift)`` partial sums (any grouping, any order)
    and whether +inf / -inf were among the values: the exact total, correctly rounded.

    >>> import numpy as np; b, m, s = exact_parts(np.array([0.1] * 10))
    >>> sum_from_parts([(int(x), int(y) << int(z)) for x, y, z in zip(b, m, s)], False, False)
    1.0
    """
    if positive_inf or negative_inf:
        return math.nan if positive_inf and negative_inf else (math.inf if positive_inf else -math.inf)
    by_bucket: dict[int, int] = {}
    for b, total in parts:
        by_bucket[int(b)] = by_bucket.get(int(b), 0) + int(total)
    if not by_bucket:
        return 0.0
    low = min(by_bucket)
    total = sum(t << (SUM_BUCKET_BITS * (b - low)) for b, t in by_bucket.items())
    scale = SUM_BUCKET_BITS * low
    try:  # int -> float and int / int are correctly rounded in CPython (subnormals included)
        return float(total << scale) if scale >= 0 else total / (1 << -scale)
    except OverflowError:
        return math.inf if total > 0 else -math.inf


@dataclass(frozen=True)
class WindowAgg:
    """The aggregates of one series in one sample-time window.

    ``count`` counts every sample; ``nan_count`` those whose value is NaN. ``sum``/``min``/``max``
    are over the non-NaN values (``min``/``max`` are NaN when there are none; ±inf take part;
    :func:`exact_sum`, :func:`signed_extreme`).
    ``last`` is the value of the latest sample by ``(ts_unix_ns, manifest-id, sample index)``, so
    it is deterministic when timestamps tie. ``sketch`` covers the finite values.
    """

    window_start_ns: int
    count: int
    nan_count: int
    sum: float
    min: float
    max: float
    last: float
    last_ts_ns: int
    sketch: bytes

    def to_json(self) -> dict[str, Any]:
        sk = deserialize_sketch(self.sketch)
        return {"window_start_ns": self.window_start_ns, "count": self.count, "nan_count": self.nan_count,
                "sum": self.sum, "min": self.min, "max": self.max, "last": self.last, "last_ts_ns": self.last_ts_ns,
                "p50": quantile(sk, 0.5), "p90": quantile(sk, 0.9), "p99": quantile(sk, 0.99)}


def exact_sum(values: Sequence[float]) -> float:
    """The rollup's ``sum`` of non-NaN values, independent of their order: correctly rounded
    (``math.fsum``; an exact sum beyond the double range is ±inf); with infinities present, inf
    or -inf, or NaN when both signs are there.

    >>> exact_sum([0.1] * 10), exact_sum([1e308, 1e308, -1e308]), exact_sum([1e308, 1e308]), exact_sum([1.0, -math.inf])
    (1.0, 1e+308, inf, -inf)
    """
    infinite = {v for v in values if math.isinf(v)}
    if infinite:
        return infinite.pop() if len(infinite) == 1 else math.nan
    try:
        return float(math.fsum(values))
    except OverflowError:
        from fractions import Fraction

        exact = sum(Fraction(v) for v in values)  # fsum gives up on intermediate overflow
        try:
            return float(exact)  # correctly rounded
        except OverflowError:
            return math.inf if exact > 0 else -math.inf


def signed_extreme(extreme: float, values: Iterable[float], lowest: bool) -> float:
    """``min``/``max`` as the rollup stores them: -0.0 and 0.0 compare equal, so a zero extreme is
    -0.0 for ``min`` when a -0.0 is among the values, 0.0 for ``max`` when a 0.0 is (else the other
    zero) — the same bits whatever the order of the samples."""
    if extreme != 0:
        return extreme
    signs = {math.copysign(1.0, v) for v in values if v == 0}
    if lowest:
        return -0.0 if -1.0 in signs else 0.0
    return 0.0 if 1.0 in signs else -0.0


def _last_key(ts: int, manifest_id: str, ordinal: int) -> tuple[int, str, int]:
    return (ts, manifest_id, ordinal)


def aggregate_window(values: Sequence[float], ts: Sequence[int], manifest_ids: Sequence[str],
                     ordinals: Sequence[int], window_start_ns: int, sketch: Any = None) -> WindowAgg:
    """Aggregate one window's samples (the reference definition; ``sketch`` may be prebuilt)."""
    finite_or_inf = [v for v in values if not math.isnan(v)]
    best = max(range(len(values)), key=lambda i: _last_key(ts[i], manifest_ids[i], ordinals[i]))
    sk = sketch if sketch is not None else sketch_of(values)
    return WindowAgg(
        window_start_ns=window_start_ns,
        count=len(values),
        nan_count=len(values) - len(finite_or_inf),
        sum=exact_sum(finite_or_inf),
        min=signed_extreme(min(finite_or_inf), finite_or_inf, True) if finite_or_inf else math.nan,
        max=signed_extreme(max(finite_or_inf), finite_or_inf, False) if finite_or_inf else math.nan,
        last=float(values[best]),
        last_ts_ns=int(ts[best]),
        sketch=serialize_sketch(sk),
    )


def merge_aggs(aggs: Sequence[WindowAgg]) -> WindowAgg:
    """Merge aggregates of the same window from several chunks (several acceptance hours)."""
    if len(aggs) == 1:
        return aggs[0]
    non_nan_min = [a.min for a in aggs if not math.isnan(a.min)]
    non_nan_max = [a.max for a in aggs if not math.isnan(a.max)]
    latest = max(aggs, key=lambda a: (a.last_ts_ns, a.last if not math.isnan(a.last) else -math.inf))
    return WindowAgg(
        window_start_ns=aggs[0].window_start_ns,
        count=sum(a.count for a in aggs),
        nan_count=sum(a.nan_count for a in aggs),
        sum=float(sum(a.sum for a in aggs)),
        min=min(non_nan_min) if non_nan_min else math.nan,
        max=max(non_nan_max) if non_nan_max else math.nan,
        last=latest.last,
        last_ts_ns=latest.last_ts_ns,
        sketch=serialize_sketch(merge_sketches(deserialize_sketch(a.sketch) for a in aggs)),
    )


def window_start(ts_ns: int, window: str) -> int:
    w = WINDOW_NS[window]
    return (ts_ns // w) * w


__all__ = ["SUM_BUCKET_BITS", "WINDOW_NS", "WindowAgg", "aggregate_window", "exact_parts", "exact_sum", "merge_aggs",
    "signed_extreme", "sum_from_parts", "window_start"]
