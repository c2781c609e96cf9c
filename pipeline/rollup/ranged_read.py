"""One metric's rows of a v3 Parquet object, read with ranged GETs: the footer, then its row groups.

An object's rows are sorted by metric, so each row group holds a range of metrics and its
``metric`` column statistics (min, max) say which. The reader GETs the object's last
:data:`TAIL_BYTES` (the footer and, often, the last row groups), a second range only if the footer
is longer, then one ranged GET per run of adjacent row groups whose statistics span the metric —
not bytes it already holds. pyarrow decodes those row groups from a sparse view of the object that
refuses a read of a byte it was not given, so a read never silently widens.

A ranged read cannot hash the whole object, so it checks what it reads against the manifest's
``footer_sha256`` and ``row_group_sha256`` (:func:`lightmetrics_pipeline.rollup.parquet.range_checks`):
the footer before its statistics choose row groups, each row group before it is decoded; a
mismatch raises :class:`RollupObjectCorrupt` naming the object and the row group — never rows.

An object whose manifest records no ``rows_per_row_group`` (one row group: every generation written
before it was recorded), none of those checks (written before they were), or of at most
:data:`WHOLE_READ_MAX_BYTES` is read whole by one GET and checked against its sha256, as before.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from typing import Any

from lightmetrics.protocol.object_store import ObjectStore
from lightmetrics_pipeline.rollup import parquet as P

#: The tail GET: a footer of up to ~20 row groups (~3 KB of metadata each) in one request.
TAIL_BYTES = 64 * 1024
#: At most this many bytes, an object is read by one whole GET: ~10-20 ms of transfer, less than the
#: latency of the second request a ranged read needs.
WHOLE_READ_MAX_BYTES = 1024 * 1024
_MAGIC = b"PAR1"


@dataclass
class MetricRows:
    """The metric's rows of one object (an Arrow table), and what reading them cost."""

    table: Any
    bytes_read: int
    requests: int


class RollupObjectCorrupt(RuntimeError):
    """Bytes of a committed rollup object that do not match the sha256 its manifest records for them.

    >>> raise RollupObjectCorrupt("rollup/v1/…: row group 3 (bytes [0, 10)) does not match …")  # doctest: +SKIP
    """


class _Sparse(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only some ranges are held."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size, self.pos = size, 0
        self.held: list[tuple[int, bytes]] = []

    def hold(self, start: int, data: bytes) -> None:
        self.held.append((start, data))

    def sha256(self, start: int, end: int) -> str:
        """The sha256 of held bytes ``[start, end)`` (OSError if any of them was not read)."""
        self.seek(start)
        data = bytearray(end - start)
        self.readinto(data)
        return hashlib.sha256(data).hexdigest()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.size - self.pos)
        if n <= 0:
            return 0
        done = 0
        while done < n:  # a read may span two held ranges (a row group across the tail's start)
            at = self.pos + done
            piece = next(((s, d) for s, d in self.held if s <= at < s + len(d)), None)
            if piece is None:
                raise OSError(f"bytes [{at}, {self.pos + n}) of the object were not read")
            s, d = piece
            take = min(n - done, s + len(d) - at)
            buffer[done:done + take] = d[at - s:at - s + take]
            done += take
        self.pos += n
        return n


def _may_hold(row_group: Any, column: int, metric: str) -> bool:
    stats = row_group.column(column).statistics
    if stats is None or not stats.has_min_max:
        return True  # no statistics: it may
    return bool(stats.min <= metric <= stats.max)


def metric_row_groups(metadata: Any, metric: str) -> list[int]:
    """The row groups whose ``metric`` statistics span ``metric`` (all, lacking statistics)."""
    column = metadata.schema.names.index("metric")
    return [i for i in range(metadata.num_row_groups) if _may_hold(metadata.row_group(i), column, metric)]


def read_metric(store: ObjectStore, ref: dict[str, Any], metric: str, rows_per_row_group: int | None) -> MetricRows | None:
    """``metric``'s rows of the object ``ref`` (a v3 manifest entry: key, sha256, bytes) written
    with ``rows_per_row_group``; None when it is missing or not the object the manifest names (its size,
    magic or whole sha256); :class:`RollupObjectCorrupt` when bytes a ranged read decodes do not match."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    key, size = str(ref["key"]), int(ref["bytes"])
    if rows_per_row_group is None or size <= WHOLE_READ_MAX_BYTES or "row_group_sha256" not in ref:
        data = store.get(key)
        if data is None or hashlib.sha256(data).hexdigest() != ref["sha256"]:
            return None
        return MetricRows(P.read_part(data, metric), len(data), 1)
    sparse, requests = _Sparse(size), 0

    def fetch(start: int, end: int) -> bool:
        nonlocal requests
        data = store.get_range(key, start, end)
        requests += 1
        if data is None or len(data) != end - start:
            return False
        sparse.hold(start, data)
        return True

    tail_start = max(0, size - TAIL_BYTES)
    if not fetch(tail_start, size):
        return None
    tail = sparse.held[0][1]
    if len(tail) < 8 or tail[-4:] != _MAGIC:
        return None
    footer_start = P.footer_start(size, tail)
    if footer_start < tail_start and (footer_start < 0 or not fetch(footer_start, tail_start)):
        return None
    if sparse.sha256(footer_start, size) != ref["footer_sha256"]:  # before its statistics choose row groups
        raise RollupObjectCorrupt(f"{key}: its footer does not match the sha256 its manifest records; the object "
                                  "or its transfer is damaged, and no rows are read from it")
    metadata = pq.read_metadata(sparse)
    if metadata.num_row_groups != len(ref["row_group_sha256"]):
        raise RollupObjectCorrupt(f"{key}: {metadata.num_row_groups} row groups, its manifest records "
                                  f"{len(ref['row_group_sha256'])}")
    groups = metric_row_groups(metadata, metric)
    ranges = {i: P.row_group_byte_range(metadata.row_group(i)) for i in groups}
    runs: list[tuple[int, int]] = []
    for start, end in ranges.values():
        if runs and start <= runs[-1][1]:  # adjacent row groups: one GET
            runs[-1] = (runs[-1][0], max(end, runs[-1][1]))
        else:
            runs.append((start, end))
    for start, end in runs:
        end = min(end, tail_start)  # the tail already holds the rest
        if start < end and not fetch(start, end):
            return None
    for i, (start, end) in ranges.items():  # each row group it decodes, as the job wrote it
        if sparse.sha256(start, end) != ref["row_group_sha256"][i]:
            raise RollupObjectCorrupt(f"{key}: row group {i} (bytes [{start}, {end})) does not match the sha256 its "
                                      "manifest records; the object or its transfer is damaged, and no rows are "
                                      "read from it")
    pf = pq.ParquetFile(sparse, metadata=metadata, pre_buffer=False)
    table = pf.read_row_groups(groups) if groups else pf.schema_arrow.empty_table()
    return MetricRows(table.filter(pc.equal(table["metric"], metric)), sum(len(d) for _, d in sparse.held), requests)


__all__ = ["TAIL_BYTES", "WHOLE_READ_MAX_BYTES", "MetricRows", "RollupObjectCorrupt", "metric_row_groups", "read_metric"]
