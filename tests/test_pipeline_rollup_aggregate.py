"""The rollup's aggregation in Spark SQL equals the reference Python, bit for bit (issue 15)."""

from __future__ import annotations

import math
import random
import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_support import SPECIAL, oracle_chunks, sample_frame, tricky_sample_rows

from lightmetrics_pipeline.rollup import chunks as C
from lightmetrics_pipeline.rollup import sketch as SK
from lightmetrics_pipeline.rollup import window_agg as W
from lightmetrics_pipeline.rollup.aggregate import chunk_rows, encode_chunk_row


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(SPECIAL)), max_size=60))
def test_sketch_bins_as_grouped_key_counts_equal_the_library(values: list[float]) -> None:
    store, key = SK.sketch_keys(np.array(values, dtype=np.float64))
    sk = SK.new_sketch()
    for v, s, k in zip(values, store.tolist(), key.tolist()):
        if math.isfinite(v):
            sk.add(v)
            limit = sk._mapping.min_possible
            zero = (0, (-1 if math.copysign(1.0, v) < 0 else 1) if v == 0 else 0)
            want = (1, sk._mapping.key(v)) if v > limit else (-1, sk._mapping.key(-v)) if v < -limit else zero
            assert (s, k) == want, v
        else:
            assert s == -2
    counts: dict[tuple[int, int], float] = {}
    for s, k in zip(store.tolist(), key.tolist()):
        counts[(s, k)] = counts.get((s, k), 0.0) + 1
    grouped = SK.sketch_from_bins(sum(c for (s, _), c in counts.items() if s == 0),
                                 [(k, c) for (s, k), c in counts.items() if s == 1],
                                 [(k, c) for (s, k), c in counts.items() if s == -1])
    assert grouped == SK.serialize_sketch(SK.sketch_of(values)) == SK.serialize_sketch(sk)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=False), st.sampled_from([0.0, -0.0, 1e308, -1e308])), min_size=1,
                max_size=30), st.randoms())
def test_sum_min_max_do_not_depend_on_sample_order(values: list[float], rnd: random.Random) -> None:
    other = list(values)
    rnd.shuffle(other)
    bits = struct.Struct(">d").pack
    ts = list(range(len(values)))
    a = W.aggregate_window(values, ts, ["m"] * len(values), ts, 0)
    b = W.aggregate_window(other, ts, ["m"] * len(values), ts, 0)
    assert (bits(a.sum), bits(a.min), bits(a.max)) == (bits(b.sum), bits(b.min), bits(b.max))
    # The SQL path's exact sum: integer parts, summed per bucket in any grouping, rounded once.
    exp_b, mant, shift = W.exact_parts(np.array(other + [math.nan, 0.0], dtype=np.float64))
    parts = [(int(e), int(m) << int(s)) for e, m, s in zip(exp_b, mant, shift) if e != -2**31]
    split = rnd.randint(0, len(parts))
    grouped = [(e, sum(p for b, p in parts[:split] if b == e)) for e in {b for b, _ in parts[:split]}] + parts[split:]
    infinite = W.sum_from_parts(grouped, math.inf in values, -math.inf in values)
    assert bits(infinite) == bits(a.sum) == bits(W.exact_sum(values))


def test_sql_aggregation_equals_the_per_series_python_bit_for_bit(spark) -> None:  # type: ignore[no-untyped-def]
    rows = tricky_sample_rows(11)
    got = {}
    for r in chunk_rows(sample_frame(spark, rows), partitions=3).collect():
        _, _, data = encode_chunk_row(r.asDict(recursive=True), 4)
        got[(r["hour_s"], r["series"], r["window"])] = data
    want = oracle_chunks(rows, 4, seed=5)
    assert set(got) == set(want)
    differ = [k for k in want if got[k] != want[k]]
    assert not differ, [(k, C.decode_chunk(got[k]).rows, C.decode_chunk(want[k]).rows) for k in differ[:2]]
