"""Helpers shared by tests/test_pipeline*.py: a provisioned local system per test, accepted and
indexed batches with varied samples, and an independent (plain Python) rollup reference."""

from __future__ import annotations

import math
import random
import sys
import uuid
from collections import defaultdict
from typing import Any

from conftest import FAST, T0_NS

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.frame import Sample, decode_frame, encode_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import UtcHour
from lightmetrics_pipeline.rollup import chunks as C
from lightmetrics_pipeline.rollup.sketch import new_sketch
from lightmetrics_pipeline.s3io import S3Access

H0 = UtcHour.of_unix_ns(T0_NS)  # 2025-11-24T16, the acceptance hour of everything accepted at T0
WINDOWS = {"1m": 60 * 10**9, "5m": 300 * 10**9, "1h": 3600 * 10**9}


def make_system(runtime: Any, clock: Any, **overrides: Any) -> LocalSystem:
    tag = uuid.uuid4().hex[:10]
    return LocalSystem(runtime, bucket=f"lm-pl-{tag}", table=f"lm-pl-{tag}", secret_name=f"lm-pl/{tag}",
                       queue_name_prefix=f"pl{tag}-", clock=clock, overrides=overrides).provision()


def access_for(system: LocalSystem, runtime: Any, component: str = "pipeline-test") -> S3Access:
    """The tests' own access (the deployer's: setup, S3 Inventory's stand-in, reading results back)."""
    return S3Access.from_settings(system.settings, endpoint_url=runtime.endpoint_url, component=component)


def job_access_for(system: LocalSystem, runtime: Any, component: str = "pipeline-test") -> S3Access:
    """:func:`access_for` signing as the pipeline job role, as EMR Serverless runs the jobs (issue 28):
    a Spark job run with it (driver and executors) is refused what the role does not grant."""
    from dataclasses import replace

    credentials = system.role_session("pipeline-job").credentials
    assert credentials, "the system has no pipeline job role: the job would run as the deployer"
    return replace(access_for(system, runtime, component), access_key=credentials["aws_access_key_id"],
                   secret_key=credentials["aws_secret_access_key"], session_token=credentials["aws_session_token"])


def job_table(system: LocalSystem) -> Any:
    """The control table as the pipeline job role reads it (the audit's GC marks, the rollup's lease)."""
    return system.work_context(session=system.role_session("pipeline-job")).table


def varied_samples(seed: int, n: int = 40) -> list[Sample]:
    """Three metrics, a few label sets, sample times over ~70 minutes before T0 (two sample-time
    hours), negative values, zeros, a NaN and a repeated timestamp."""
    rng = random.Random(seed)
    out = []
    base = T0_NS - 70 * 60 * 10**9
    for i in range(n):
        metric = ("cpu.usage", "mem.rss", "disk/io")[i % 3]
        labels = {"host": f"h{rng.randint(1, 3)}"}
        if metric == "cpu.usage":
            labels["core"] = str(rng.randint(0, 1))
        ts = base + rng.randint(0, 70 * 60) * 10**9
        if i % 17 == 5:
            value = math.nan
        elif i % 11 == 3:
            value = 0.0
        else:
            value = round(rng.uniform(-50, 150), 3)
        out.append(Sample(metric, labels, ts, value))
    out.append(Sample("cpu.usage", {"host": "h1", "core": "0"}, base, 7.0))  # ties with ...
    out.append(Sample("cpu.usage", {"host": "h1", "core": "0"}, base, 9.0))  # ... itself: 'last' by ordinal
    return out


def accept_indexed(system: LocalSystem, runtime: Any, clock: Any, identity: BatchIdentity, samples: list[Sample],
                   *, compress: bool = True) -> Any:
    actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
    ctx = system.work_context(policy=FAST)
    result = accept_batch(actx, identity, encode_frame(identity, samples, compress=compress))
    assert result.status.value == "accepted", result
    index_accepted(ctx, result.manifest_key)
    index_raw_blob(ctx, result.blob_key)
    return result


def reference_rollup(frames: dict[str, bytes]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(series labels+metric text, window, window start) -> the aggregates, computed the plain way."""
    groups: dict[tuple[str, tuple[tuple[str, str], ...], str, int], list[tuple[int, str, int, float]]] = defaultdict(list)
    for mid, data in frames.items():
        for ordinal, s in enumerate(decode_frame(data).samples):
            for window, w in WINDOWS.items():
                groups[(s.metric, s.labels, window, (s.ts_unix_ns // w) * w)].append((s.ts_unix_ns, mid, ordinal, s.value))
    out = {}
    for (metric, labels, window, start), items in groups.items():
        non_nan = [v for *_, v in items if not math.isnan(v)]
        latest = max(items, key=lambda t: (t[0], t[1], t[2]))
        out[(metric, labels, window, start)] = {
            "count": len(items), "nan_count": len(items) - len(non_nan), "sum": math.fsum(non_nan),
            "min": min(non_nan) if non_nan else math.nan, "max": max(non_nan) if non_nan else math.nan,
            "last": latest[3], "last_ts_ns": latest[0], "values": [v for v in non_nan if math.isfinite(v)],
        }
    return out


# ------------------------------------------------------------------ the aggregation's oracle (issue 15)

SampleRow = tuple[int, str, str, int, float, int]  # hour_s, manifest_id, series, ts_ns, value, ord
_NS = 10**9
_GAMMA = new_sketch()._mapping.gamma
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 1e308, -1e308, 5e-324, -5e-324,
           sys.float_info.min, sys.float_info.min * _GAMMA * 1.0000001, _GAMMA ** 7, -(_GAMMA ** -3), 1e-300, 123.456]


def tricky_sample_rows(seed: int) -> list[tuple[int, str, str, int, float, int]]:
    """Series with NaN, ±inf, ±0, negatives, huge and tiny values, timestamps that tie within and
    across batches, negative timestamps, several windows and two hours."""
    rng = random.Random(seed)
    rows = []
    hours = [H0.start_unix_s, H0.start_unix_s + 3600]
    mids = [f"{a:02x}.62.{n:020d}-{n:020d}" for a in (0x61, 0x62, 0x7a) for n in range(3)]
    for s in range(40):
        series = C.series_key(f"m{s % 3}", [("host", f"h{s}")])
        hour_s = hours[s % 2]
        base = -7 * 60 * _NS if s == 7 else hour_s * _NS - 30 * 60 * _NS
        for mid in rng.sample(mids, rng.randint(1, 4)):
            for o in range(rng.randint(1, 25)):
                ts = base + rng.choice([0, 0, 59 * _NS, 60 * _NS, rng.randint(0, 3600) * _NS, rng.randint(0, 10**12)])
                value = rng.choice(SPECIAL + [rng.uniform(-1e3, 1e3) for _ in range(6)] + [float(rng.randint(-5, 5))])
                rows.append((hour_s, mid, series, ts, value, o))
    rows.append((hours[0], mids[0], C.series_key("z", []), 5, -0.0, 0))  # a series of only -0.0
    rows.append((hours[0], mids[1], C.series_key("z", []), 5, 0.0, 0))   # ... then a 0.0 at the same time
    rows.append((hours[0], mids[0], C.series_key("nan", []), 5, math.nan, 0))  # only NaN
    return rows


def sample_frame(spark: Any, rows: list[SampleRow]) -> Any:
    """Decoded sample rows as the rollup sees them (``SAMPLE_SCHEMA`` without errors), each value's
    sketch bin computed as ``lightmetrics_pipeline.rollup.decode`` does, and NaN as null — what a NaN becomes when
    ``mapInPandas`` hands pandas output to Spark."""
    import numpy as np

    from lightmetrics_pipeline.rollup.decode import SAMPLE_SCHEMA
    from lightmetrics_pipeline.rollup.sketch import sketch_keys
    from lightmetrics_pipeline.rollup.window_agg import exact_parts

    values = np.array([r[4] for r in rows], dtype=np.float64)
    store, key = sketch_keys(values)
    parts = zip(*(a.tolist() for a in exact_parts(values)))
    data = [(*r[:4], None if math.isnan(r[4]) else r[4], r[5], int(s), int(k),
             *((None, None, None) if b == -2**31 else (b, m, sh)), None)
            for r, s, k, (b, m, sh) in zip(rows, store.tolist(), key.tolist(), parts)]
    return spark.createDataFrame(data, SAMPLE_SCHEMA)


def oracle_chunks(rows: list[SampleRow], generation: int, seed: int = 0) -> dict[tuple[int, str, str], bytes]:
    """(hour_s, series, window) -> chunk bytes, computed per series and window by the reference
    Python (``chunks.aggregate_window`` and ``sketch_of``), from the samples in a shuffled order."""
    from lightmetrics_pipeline.rollup import chunks as C
    from lightmetrics_pipeline.rollup import window_agg as W

    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    groups: dict[tuple[int, str], list[SampleRow]] = defaultdict(list)
    for r in shuffled:
        groups[(r[0], r[2])].append(r)
    out = {}
    for (hour_s, series), items in groups.items():
        hour = UtcHour(hour_s)
        contributors = sorted({r[1] for r in items})
        ts = [r[3] for r in items]
        for window, w in WINDOWS.items():
            by_start: dict[int, list[SampleRow]] = defaultdict(list)
            for r in items:
                by_start[(r[3] // w) * w].append(r)
            aggs = [W.aggregate_window([r[4] for r in rs], [r[3] for r in rs], [r[1] for r in rs], [r[5] for r in rs], ws)
                    for ws, rs in sorted(by_start.items())]
            cid = C.chunk_id(hour, window, series, generation, contributors)
            header = C.chunk_header(hour=hour, window=window, series=series, generation=generation, chunk_id_=cid,
                                    manifest_ids=contributors, ts_min=min(ts), ts_max=max(ts), samples=len(items),
                                    rows=len(aggs))
            out[(hour_s, series, window)] = C.encode_chunk(header, aggs)
    return out
