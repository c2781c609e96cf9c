"""Reading rollups back (``lmctl query``) and plotting them.

A query names a metric, optional label filters, a sample-time range ``[from, to)`` and a window.
Rollup hours are *acceptance* hours, and a batch is accepted after its samples were taken (at
most the agents' retry horizon later, plus clock skew), so the reader looks at acceptance hours
from ``hour(from) - 1`` to ``hour(to) + accept_lag``. For each hour it takes the **highest
committed generation** — the largest ``generation=N`` listed under ``manifests/v1/<hour>/``
(a manifest is written after all its objects, so a listed one is complete; lower generations are
superseded and ignored). A v3 manifest names the window's Parquet objects: the reader reads the one
holding the metric's part — its footer, then only the row groups holding the metric, by ranged GETs
(:mod:`lightmetrics_pipeline.rollup.ranged_read`; a small or one-row-group object whole, checked
against its sha256) — and keeps the metric's rows. A v2 manifest: the one
chunk list holding the metric, then the chunks whose metric, window, labels and sample-time range
match (a v1 manifest lists its chunks inline). Rows of the same series and window start are merged
across hours (counts and sums add, min/max combine, ``last`` is the latest sample, sketches merge
exactly), whichever format each hour was written in.

No Spark: a query reads a few manifests and objects with a thread pool.
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from lightmetrics.protocol.keys import UtcHour, hours_between
from lightmetrics_pipeline.rollup import chunks as C
from lightmetrics_pipeline.rollup import manifest as RM
from lightmetrics_pipeline.rollup import parquet as P
from lightmetrics_pipeline.rollup import sketch as SK
from lightmetrics_pipeline.rollup import window_agg as W
from lightmetrics_pipeline.rollup.committed import read_committed
from lightmetrics_pipeline.rollup.ranged_read import read_metric
from lightmetrics_pipeline.rollup.write_chunks import committed_chunks
from lightmetrics_pipeline.s3io import S3Access, Tally, store, task_tally

STATS = ("mean", "count", "sum", "min", "max", "last", "p50", "p90", "p99")
_NS = 1_000_000_000


def parse_time(text: str, now_ns: int) -> int:
    """``2025-11-24T16:00:00Z`` (or without seconds/zone, UTC), unix seconds, ``now``, or an offset
    from now: ``-90m``/``-2h``/``-1d``, ``+1h``.

    >>> parse_time("+1h", 0) == -parse_time("-1h", 0) == 3600 * _NS
    True
    """
    t = text.strip()
    if t == "now":
        return now_ns
    m = re.fullmatch(r"([+-])(\d+)([smhd])", t)
    if m:
        offset = int(m.group(2)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(3)] * _NS
        return now_ns + offset if m.group(1) == "+" else now_ns - offset
    if re.fullmatch(r"\d{9,11}", t):
        return int(t) * _NS
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%MZ", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H"):
        try:
            return int(datetime.strptime(t, fmt).replace(tzinfo=timezone.utc).timestamp()) * _NS
        except ValueError:
            continue
    raise ValueError(f"cannot read time {text!r} (use 2025-11-24T16:00:00Z, unix seconds, now, -2h or +1h)")


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / _NS, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Series:
    labels: dict[str, str]
    points: list[W.WindowAgg]

    def to_json(self) -> dict[str, Any]:
        return {"labels": self.labels, "points": [{"t": iso(p.window_start_ns), **_json_safe(p.to_json())}
                                                  for p in self.points]}


def _json_safe(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


@dataclass
class QueryResult:
    metric: str
    window: str
    start_ns: int
    end_ns: int
    label_filter: dict[str, str]
    series: list[Series] = field(default_factory=list)
    generations: dict[str, int] = field(default_factory=dict)
    chunks_read: int = 0  # v1/v2 hours: chunks GET
    objects_read: int = 0  # v3 hours: Parquet objects read (one per hour: the metric's part)
    #: bytes of chunks and Parquet objects read (not manifests): a v3 object's footer and the row
    #: groups holding the metric, or the whole object when it is read whole
    bytes_read: int = 0
    requests: Tally = field(default_factory=Tally)
    #: hours of the queried sample time without a committed rollup (not closed yet, or not rolled up)
    uncommitted_hours: list[str] = field(default_factory=list)
    #: whether a committed hour read holds the metric (any series, any label, any time); None when
    #: no hour read is committed, so nothing can say
    metric_known: bool | None = None
    #: when no committed hour holds the metric: the closest names the newest committed hours hold
    #: (lightmetrics_pipeline.rollup.query_names), and how many names they hold
    close_matches: list[str] = field(default_factory=list)
    known_metrics: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "window": self.window, "from": iso(self.start_ns), "to": iso(self.end_ns),
                "labels": self.label_filter, "generations": self.generations, "chunks_read": self.chunks_read,
                "objects_read": self.objects_read, "bytes_read": self.bytes_read,
                "uncommitted_hours": self.uncommitted_hours, "metric_known": self.metric_known,
                "close_matches": self.close_matches, "known_metrics": self.known_metrics,
                "series": [s.to_json() for s in self.series], "s3_requests": self.requests.to_json()}


def stat_value(p: W.WindowAgg, stat: str) -> float | None:
    if stat == "mean":
        n = p.count - p.nan_count
        return p.sum / n if n else None
    if stat in ("count", "sum", "min", "max", "last"):
        return float(getattr(p, stat))
    sk = SK.deserialize_sketch(p.sketch)
    return SK.quantile(sk, {"p50": 0.5, "p90": 0.9, "p99": 0.99}[stat])


def run_query(access: S3Access, metric: str, *, start_ns: int, end_ns: int, window: str = "5m",
              labels: dict[str, str] | None = None, accept_lag_hours: int = 24, workers: int = 16) -> QueryResult:
    if window not in W.WINDOW_NS:
        raise ValueError(f"window must be one of {', '.join(W.WINDOW_NS)}")
    if end_ns <= start_ns:
        raise ValueError("--to must be after --from")
    labels = dict(labels or {})
    result = QueryResult(metric, window, start_ns, end_ns, labels)
    hours = hours_between(UtcHour.of_unix_ns(start_ns) + (-1), UtcHour.of_unix_ns(end_ns - 1) + accept_lag_hours)
    merged: dict[str, dict[int, list[W.WindowAgg]]] = {}
    label_of: dict[str, dict[str, str]] = {}

    def add(series: str, series_labels: dict[str, str], row: W.WindowAgg) -> None:
        if any(series_labels.get(k) != v for k, v in labels.items()) or not start_ns <= row.window_start_ns < end_ns:
            return
        label_of[series] = series_labels
        merged.setdefault(series, {}).setdefault(row.window_start_ns, []).append(row)

    with task_tally() as tally, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lm-query") as pool:
        manifests = list(pool.map(lambda h: read_committed(access, h), hours))
        wanted: list[tuple[UtcHour, dict[str, Any]]] = []
        objects: list[tuple[UtcHour, dict[str, Any], int | None]] = []  # v3: the metric's object per hour, its row groups
        sampled = set(hours_between(UtcHour.of_unix_ns(start_ns), UtcHour.of_unix_ns(end_ns - 1)))
        committed = [doc for doc in manifests if doc is not None]
        for hour, doc in zip(hours, manifests):
            if doc is None:
                if hour in sampled:
                    result.uncommitted_hours.append(str(hour))
                continue
            result.generations[str(hour)] = int(doc["generation"])
            if RM.is_parquet_manifest(doc):
                objects.extend((hour, o, P.rows_per_row_group(doc)) for o in P.objects_of(doc, window, metric))
                continue
            of_metric = committed_chunks(access, doc, metric)  # one chunk list: the metric's
            result.metric_known = result.metric_known or bool(of_metric)
            for c in of_metric:
                if c["window"] != window:  # committed_chunks gave this metric's alone
                    continue
                chunk_labels = {k: v for k, v in c["labels"]}
                if any(chunk_labels.get(k) != v for k, v in labels.items()):
                    continue
                if c["sample_ts_max_ns"] < start_ns - W.WINDOW_NS[window] or c["sample_ts_min_ns"] >= end_ns:
                    continue
                wanted.append((hour, c))
        st = store(access)
        codec = access.codec
        bodies = list(pool.map(lambda hc: st.get(codec.rollup_chunk(window, hc[0], metric, hc[1]["chunk_id"])), wanted))
        parts = list(pool.map(lambda ho: read_metric(st, ho[1], metric, ho[2]), objects))
    result.requests.add(tally)
    result.chunks_read = len(wanted)
    result.objects_read = len(objects)
    for (hour, c), body in zip(wanted, bodies):
        if body is None:
            raise RuntimeError(f"chunk {c['chunk_id']} of committed generation in {hour} is missing")
        result.bytes_read += len(body)
        chunk = C.decode_chunk(body)
        for r in chunk.rows:
            add(c["series"], chunk.labels, r)
    for (hour, o, _), part in zip(objects, parts):
        if part is None:
            raise RuntimeError(f"rollup object {o['key']} of the committed generation in {hour} is missing or does "
                               "not match its manifest (sha256, or size and Parquet footer)")
        result.bytes_read += part.bytes_read
        rows = part.table
        result.metric_known = result.metric_known or rows.num_rows > 0
        for series, series_labels, agg in P.window_aggs(rows):
            add(series, series_labels, agg)
    if committed and not result.metric_known:  # a misspelling: no committed hour asked for holds it
        from lightmetrics_pipeline.rollup.query_names import NAME_HOURS, closest, committed_metric_names

        result.metric_known = False
        names = committed_metric_names(access, committed[-NAME_HOURS:])
        result.close_matches, result.known_metrics = closest(metric, names), len(names)
    for key in sorted(merged, key=lambda k: sorted(label_of[k].items())):
        points = [W.merge_aggs(v) for _, v in sorted(merged[key].items())]
        result.series.append(Series(label_of[key], points))
    return result


def plot(result: QueryResult, path: str, stat: str = "mean") -> str:
    """Draw one line per series (the chosen statistic per window) into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=100)
    for s in result.series:
        xs, ys = [], []
        for p in s.points:
            v = stat_value(p, stat)
            if v is not None and math.isfinite(v):
                xs.append(datetime.fromtimestamp(p.window_start_ns / _NS, tz=timezone.utc))
                ys.append(v)
        label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) or "(no labels)"
        ax.plot(xs, ys, marker=".", linewidth=1.2, label=label)
    filt = ",".join(f"{k}={v}" for k, v in sorted(result.label_filter.items()))
    ax.set_title(f"{result.metric}{'{' + filt + '}' if filt else ''} — {stat} per {result.window}")
    ax.set_xlabel("sample time (UTC)")
    ax.set_ylabel(stat)
    # The queried span, not the data's: one window (or none) still gets a real time axis.
    ax.set_xlim(datetime.fromtimestamp(result.start_ns / _NS, tz=timezone.utc),
                datetime.fromtimestamp(result.end_ns / _NS, tz=timezone.utc))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=timezone.utc))
    ax.grid(True, alpha=0.3)
    if result.series and len(result.series) <= 12:
        ax.legend(fontsize=7, loc="best")
    elif not result.series:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


__all__ = ["STATS", "QueryResult", "Series", "iso", "parse_time", "plot", "run_query", "stat_value"]
