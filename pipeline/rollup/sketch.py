"""The rollup's quantile sketch: DDSketch, its binning of values and its byte layout (docs/pipeline.md).

DDSketch (the ``ddsketch`` library, Datadog's maintained implementation) with a logarithmic
mapping at 1 % relative accuracy and unbounded dense stores. It is *mergeable exactly* (merging
adds bins, so a 1 h sketch merged from twelve 5 m sketches has the same bins as one built from the
samples) and *deterministic* (no randomness), so a rerun writes byte-identical chunks. KLL (Apache
DataSketches) was considered: its compaction is randomized, so two runs over the same samples
would serialize differently.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Iterable
from typing import Any

from lightmetrics_pipeline.rollup.codec import ChunkFormatError

SKETCH_VERSION = 1
SKETCH_RELATIVE_ACCURACY = 0.01
_U32 = struct.Struct(">I")
_SKETCH_HEAD = struct.Struct(">Bdd")  # version, relative accuracy, zero count
_BIN = struct.Struct(">id")  # bin key, count


def new_sketch() -> Any:
    from ddsketch import DDSketch

    return DDSketch(SKETCH_RELATIVE_ACCURACY)


@functools.lru_cache(maxsize=1)
def quantile_mapping() -> Any:
    """The rollup sketches' key mapping, built once: every serialized sketch states its accuracy and
    :func:`sketch_bins` refuses any other, so one mapping turns every sketch's keys into values."""
    from ddsketch.mapping import LogarithmicMapping

    return LogarithmicMapping(SKETCH_RELATIVE_ACCURACY)


def _checked_head(data: bytes) -> tuple[int, float, float]:
    if len(data) < _SKETCH_HEAD.size:
        raise ChunkFormatError("truncated sketch")
    version, accuracy, zero = _SKETCH_HEAD.unpack_from(data, 0)
    if version != SKETCH_VERSION:
        raise ChunkFormatError(f"unsupported sketch version {version}")
    if accuracy != SKETCH_RELATIVE_ACCURACY:
        # another accuracy bins values on another scale: its keys read with this mapping would be
        # wrong quantiles, silently
        raise ChunkFormatError(f"a rollup sketch has relative accuracy {SKETCH_RELATIVE_ACCURACY}, "
                               f"this one states {accuracy}")
    return version, accuracy, zero


def sketch_of(values: Iterable[float]) -> Any:
    """A DDSketch of the finite values (NaN and ±inf are not quantile-able and are left out)."""
    sk = new_sketch()
    add = sk.add
    for v in values:
        if math.isfinite(v):
            add(v)
    return sk


def sketch_keys(values: Any) -> tuple[Any, Any]:
    """``(store, key)`` arrays for float64 ``values``, exactly as :func:`sketch_of` bins them:
    store 1 (positive bins), -1 (negative bins), 0 (the zero count) or -2 (not binned: NaN, ±inf),
    and the bin key — in the zero store: -1 for -0.0, 1 for 0.0, 0 for a tiny non-zero value (the
    aggregation reads the sign of a zero ``min``/``max`` from it); 0 for NaN and ±inf.

    The logarithm is taken with numpy; where the scaled logarithm lies within 1e-6 of an integer
    (numpy's and the C library's ``log`` may differ in the last bit there, which would move the
    ceiling), the key is recomputed with the library's own scalar mapping, so every key is the
    library's.

    >>> [k.tolist() for k in sketch_keys(__import__("numpy").array([1.0, -2.0, 0.0, float("nan")]))]
    [[1, -1, 0, -2], [0, 35, 1, 0]]
    """
    import numpy as np

    mapping = quantile_mapping()
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    limit = mapping.min_possible
    store = np.where(~finite, -2, np.where(v > limit, 1, np.where(v < -limit, -1, 0))).astype(np.int8)
    binned = (store == 1) | (store == -1)
    mag = np.where(binned, np.abs(np.where(finite, v, 1.0)), 1.0)
    with np.errstate(all="ignore"):
        scaled = np.log(mag) / math.log(2.0) * mapping._multiplier
    keys = np.ceil(scaled)
    near = binned & (np.abs(scaled - np.rint(scaled)) < 1e-6)
    for i in np.flatnonzero(near):
        keys[i] = mapping.key(float(mag[i]))
    zero_sign = np.where(v == 0, np.where(np.signbit(v), -1, 1), 0)
    return store, np.where(binned, keys, np.where(store == 0, zero_sign, 0)).astype(np.int32)


def sketch_from_bins(zero_count: float, positive: Iterable[tuple[int, float]],
                     negative: Iterable[tuple[int, float]]) -> bytes:
    """The serialized sketch (:func:`serialize_sketch`) of grouped bin counts: equal, byte for
    byte, to the sketch built by adding the values one by one (bins only add)."""
    def store(bins: Iterable[tuple[int, float]]) -> bytes:
        kept = sorted((int(k), float(c)) for k, c in bins if c)
        return _U32.pack(len(kept)) + b"".join(_BIN.pack(k, c) for k, c in kept)

    return (_SKETCH_HEAD.pack(SKETCH_VERSION, SKETCH_RELATIVE_ACCURACY, float(zero_count))
            + store(positive) + store(negative))


def merge_sketches(sketches: Iterable[Any]) -> Any:
    out = new_sketch()
    for sk in sketches:
        out.merge(sk)
    return out


def _bins(store: Any) -> list[tuple[int, float]]:
    """A ddsketch store's bins as ``(key, count)``, in key order."""
    if not store.count:
        return []
    return [(k, store.bins[k - store.offset]) for k in range(store.min_key, store.max_key + 1)]


def serialize_sketch(sk: Any) -> bytes:
    """``u8 version | f64 relative_accuracy | f64 zero_count | store(+) | store(-)`` (docs/pipeline.md),
    where a store is ``u32 n | n × (i32 key, f64 count)``, its non-empty bins in increasing key order:
    one encoder with :func:`sketch_from_bins`, so the two paths cannot drift apart."""
    if sk._mapping.relative_accuracy != SKETCH_RELATIVE_ACCURACY:
        raise ValueError(f"a rollup sketch has relative accuracy {SKETCH_RELATIVE_ACCURACY}")
    return sketch_from_bins(sk._zero_count, _bins(sk._store), _bins(sk._negative_store))


def _read_store(data: bytes, pos: int, store: Any) -> int:
    if pos + _U32.size > len(data):
        raise ChunkFormatError("truncated sketch store")
    (n,) = _U32.unpack_from(data, pos)
    pos += _U32.size
    if pos + _BIN.size * n > len(data):
        raise ChunkFormatError("truncated sketch bins")
    prev = None
    for _ in range(n):
        key, count = _BIN.unpack_from(data, pos)
        pos += _BIN.size
        if (prev is not None and key <= prev) or not count > 0:
            raise ChunkFormatError("sketch bins must have increasing keys and positive counts")
        store.add(key, count)
        prev = key
    return pos


def sketch_bins(data: bytes) -> tuple[float, list[tuple[int, float]], list[tuple[int, float]]]:
    """``(zero_count, positive bins, negative bins)`` of a serialized sketch, bins as ``(key,
    count)`` in increasing key order (no ``ddsketch`` objects: the Parquet rows' quantiles)."""
    _version, _accuracy, zero = _checked_head(data)
    pos = _SKETCH_HEAD.size
    stores = []
    for _ in range(2):
        (n,) = _U32.unpack_from(data, pos)
        pos += _U32.size
        stores.append([_BIN.unpack_from(data, pos + i * _BIN.size) for i in range(n)])
        pos += n * _BIN.size
    return zero, stores[0], stores[1]


def deserialize_sketch(data: bytes) -> Any:
    from ddsketch.ddsketch import BaseDDSketch
    from ddsketch.store import DenseStore

    _version, _accuracy, zero = _checked_head(data)
    pos_store, neg_store = DenseStore(), DenseStore()
    pos = _read_store(data, _SKETCH_HEAD.size, pos_store)
    pos = _read_store(data, pos, neg_store)
    if pos != len(data):
        raise ChunkFormatError("bytes after the sketch")
    return BaseDDSketch(quantile_mapping(), pos_store, neg_store, zero)


def quantile(sk: Any, q: float) -> float | None:
    return None if sk.count == 0 else float(sk.get_quantile_value(q))


__all__ = ["SKETCH_RELATIVE_ACCURACY", "SKETCH_VERSION", "deserialize_sketch", "merge_sketches", "new_sketch",
    "quantile", "quantile_mapping", "serialize_sketch", "sketch_bins", "sketch_from_bins", "sketch_keys", "sketch_of"]
