"""Rollup format v3 (issue 15): Parquet objects holding many series — the same numbers as the
per-series reference, deterministic bytes, requests that do not grow with the series, the same
query answers as v2, and files a reader without our code can use."""

from __future__ import annotations

import io
import json
import random
import re
import struct

import pyarrow.parquet as pq
import pytest
from conftest import T0_NS
from pipeline_support import (
    H0,
    accept_indexed,
    access_for,
    make_system,
    oracle_chunks,
    reference_rollup,
    sample_frame,
    tricky_sample_rows,
    varied_samples,
)

from lightmetrics.protocol.frame import Sample
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics_pipeline.rollup import chunks as C
from lightmetrics_pipeline.rollup import parquet as P
from lightmetrics_pipeline.rollup import sketch as SK
from lightmetrics_pipeline.rollup import window_agg as W
from lightmetrics_pipeline.rollup.aggregate import chunk_rows
from lightmetrics_pipeline.rollup.committed import read_committed
from lightmetrics_pipeline.rollup.job import RollupJob
from lightmetrics_pipeline.rollup.plan import NondeterministicRollup
from lightmetrics_pipeline.rollup.query import run_query
from lightmetrics_pipeline.s3io import store

NEXT = H0.next()
_BITS = struct.Struct(">d").pack


@pytest.fixture
def system(runtime, clock):  # type: ignore[no-untyped-def]
    return make_system(runtime, clock)


def _ident(n: int, agent: str = "agent-p") -> BatchIdentity:
    return BatchIdentity.create(agent, "boot-1", n * 100, n * 100 + 99)


def _agg_bits(a: W.WindowAgg) -> tuple[object, ...]:
    """Every field of an aggregate, floats as their bits (NaN, ±0 and ±inf compared exactly)."""
    return (a.window_start_ns, a.count, a.nan_count, _BITS(a.sum), _BITS(a.min), _BITS(a.max), _BITS(a.last),
            a.last_ts_ns, a.sketch)


def _parquet_of(spark, rows, partitions: int, generation: int = 4):  # type: ignore[no-untyped-def]
    """(hour_s, window) -> Parquet bytes of the tricky samples, as the write stage builds them."""
    by_object: dict[tuple[int, str], list[dict[str, object]]] = {}
    for r in chunk_rows(sample_frame(spark, rows), partitions=partitions).collect():
        d = r.asDict(recursive=True)
        by_object.setdefault((d["hour_s"], d["window"]), []).extend(P.part_rows(d, generation, "ab" * 32))
    return {k: P.part_bytes(v) for k, v in by_object.items()}


def test_parquet_rows_equal_the_per_series_reference_bit_for_bit_and_bytes_are_deterministic(spark) -> None:  # type: ignore[no-untyped-def]
    rows = tricky_sample_rows(11)  # NaN, ±inf, ±0, ties, huge and tiny values, two hours
    objects = _parquet_of(spark, rows, partitions=3)
    want = {(hour_s, series, window): C.decode_chunk(data).rows
            for (hour_s, series, window), data in oracle_chunks(rows, 4, seed=5).items()}
    got: dict[tuple[int, str, str], list[W.WindowAgg]] = {}
    for (hour_s, window), data in objects.items():
        table = pq.read_table(io.BytesIO(data))
        assert table.schema.equals(P.arrow_schema())
        for rec, (series, _labels, agg) in zip(table.to_pylist(), P.window_aggs(table)):
            got.setdefault((hour_s, series, window), []).append(agg)
            sk = SK.deserialize_sketch(agg.sketch)
            assert (rec["p50"], rec["p90"], rec["p99"]) == (SK.quantile(sk, 0.5), SK.quantile(sk, 0.9), SK.quantile(sk, 0.99))
            assert rec["window_start"].timestamp() * 10**6 == agg.window_start_ns // 1000
            assert (rec["rollup_generation"], rec["inputs_sha256"]) == (4, "ab" * 32)
        keys = [(r["metric"], r["series"], r["window_start_ns"]) for r in table.to_pylist()]
        assert keys == sorted(keys)  # the order that makes the bytes a function of the rows
    assert set(got) == set(want)
    differ = [k for k in want if [_agg_bits(a) for a in got[k]] != [_agg_bits(a) for a in want[k]]]
    assert not differ, differ[:3]
    # Deterministic: other aggregation partitions, rows in another order -> the same bytes.
    assert _parquet_of(spark, rows, partitions=5) == objects
    some = next(iter(objects))
    table = pq.read_table(io.BytesIO(objects[some])).to_pylist()
    random.Random(3).shuffle(table)
    for r in table:
        r["labels"] = list(r["labels"])
        r["window_start"] = r["window_start_ns"] // 1000
    assert P.part_bytes(table) == objects[some]


def _many_series(n: int, per_series: int = 3) -> list[Sample]:
    base = T0_NS - 50 * 60 * 10**9
    return [Sample(f"load.m{i % 7}", {"host": f"h{i:04d}"}, base + j * 7 * 60 * 10**9, float(i * 10 + j))
            for i in range(n) for j in range(per_series)]


@pytest.mark.parametrize("series", [8, 400])
def test_puts_per_hour_are_the_objects_and_a_manifest_whatever_the_series(series, system, runtime, clock, spark,
                                                                          monkeypatch):  # type: ignore[no-untyped-def]
    accept_indexed(system, runtime, clock, _ident(1), _many_series(series))
    access = access_for(system, runtime, "pipeline-parquet")
    job = RollupJob(spark, access, table=None, clock=clock)
    report = job.run([H0], first_open=NEXT)
    (h,) = report.hours
    assert (h.status, h.format, h.series) == ("committed", 3, series)
    # One object per window (every window's rows fit one part) + the manifest: 4 PUTs for 8 series
    # as for 400 (the per-series format wrote 2 per series and window: 6 x series + 2).
    assert report.requests.statuses("PutObject") == {"200": 4} and h.objects == 3
    doc = read_committed(access, H0)
    assert doc["schema"] == P.MANIFEST_SCHEMA_V4 and doc["totals"]["objects"] == 3
    assert doc["totals"]["rows"] == sum(o["rows"] for o in doc["parquet"]["objects"]) == h.rows
    # Rerun with --recompute: the same object keys, compared with the committed ones before any
    # write -> no object PUT at all; only the manifest's create, which answers 412.
    again = job.run([H0], first_open=NEXT, recompute=True)
    assert again.hours[0].status == "recomputed" and again.requests.statuses("PutObject") == {"412": 1}
    assert dict(again.hours[0].writes) == {"committed": 3, "exists": 1}
    # Smaller parts: more objects, each window's rows split by metric; still objects + 1 PUTs, and a
    # one-metric query reads exactly one object.
    monkeypatch.setattr(P, "ROWS_PER_PART", max(1, h.rows // 12))
    late = accept_indexed(system, runtime, clock, _ident(2), _many_series(series)[:5])
    assert late.status.value == "accepted"
    split = job.run([H0], first_open=NEXT)
    (h2,) = split.hours
    assert h2.generation == 2 and h2.objects > 3
    assert split.requests.statuses("PutObject") == {"200": h2.objects + 1}
    doc2 = read_committed(access, H0)
    assert {o["window"] for o in doc2["parquet"]["objects"]} == {"1m", "5m", "1h"}
    q = run_query(access, "load.m3", start_ns=T0_NS - 2 * 3600 * 10**9, end_ns=T0_NS + 3600 * 10**9, window="5m")
    assert q.objects_read == 1 and q.chunks_read == 0 and q.generations == {str(H0): 2}
    assert {s.labels["host"] for s in q.series} == {f"h{i:04d}" for i in range(series) if i % 7 == 3}


def test_a_recompute_that_differs_writes_nothing_and_is_refused(system, runtime, clock, spark,
                                                                monkeypatch):  # type: ignore[no-untyped-def]
    accept_indexed(system, runtime, clock, _ident(1), _many_series(4))
    access = access_for(system, runtime, "pipeline-recompute")
    job = RollupJob(spark, access, table=None, clock=clock)
    assert job.run([H0], first_open=NEXT).hours[0].status == "committed"
    s3, bucket = runtime.boto3_client("s3"), system.settings.bucket

    def keys() -> set[str]:
        return {o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
                for o in page.get("Contents", [])}

    before = keys()
    plan = job.plan

    def nondeterministic(*args, **kwargs):  # type: ignore[no-untyped-def]
        # The rows carry the hour's inputs digest: another one makes every object's bytes (and key) differ.
        p = plan(*args, **kwargs)
        for h in p.hours:
            h.input_sha256 = "0" * 64
        return p

    monkeypatch.setattr(job, "plan", nondeterministic)
    with pytest.raises(NondeterministicRollup, match=r"1m part 0: committed [0-9a-f]{12}, recomputed [0-9a-f]{12}"):
        job.run([H0], first_open=NEXT, recompute=True)
    assert keys() == before  # nothing landed beside the committed objects


def test_a_generation_committed_with_a_v3_manifest_is_read_and_recomputed_as_v3(system, runtime, clock, spark,
                                                                              monkeypatch):  # type: ignore[no-untyped-def]
    # Issue 27 item 8: new manifests name the hour acceptance_hour (v4); those committed as v3 stay
    # readable, and a recompute writes their own bytes again (the manifest's create answers 412).
    from lightmetrics_pipeline.rollup import manifest as RM

    accept_indexed(system, runtime, clock, _ident(1), _many_series(3))
    access = access_for(system, runtime, "pipeline-v3-manifest")
    job = RollupJob(spark, access, table=None, clock=clock)
    monkeypatch.setattr(RM, "WRITTEN_MANIFEST_SCHEMA", RM.MANIFEST_SCHEMA_V3)  # as a job before v4 wrote it
    assert job.run([H0], first_open=NEXT).hours[0].status == "committed"
    monkeypatch.undo()
    doc = read_committed(access, H0)
    assert doc["schema"] == P.MANIFEST_SCHEMA_V3 and doc["hour"] == str(H0) and "acceptance_hour" not in doc
    again = job.run([H0], first_open=NEXT, recompute=True)
    assert again.hours[0].status == "recomputed" and again.requests.statuses("PutObject") == {"412": 1}
    q = run_query(access, "load.m1", start_ns=T0_NS - 2 * 3600 * 10**9, end_ns=T0_NS + 3600 * 10**9, window="1h")
    assert q.generations == {str(H0): 1} and q.objects_read == 1 and {s.labels["host"] for s in q.series} == {"h0001"}


def test_a_generation_written_as_one_row_group_per_object_is_recomputed_so_and_read_whole(
        system, runtime, clock, spark, monkeypatch):  # type: ignore[no-untyped-def]
    # Issue 27 item 12: objects are written in row groups of ROWS_PER_ROW_GROUP rows, and the
    # manifest records it; a generation committed before (no rows_per_row_group: one row group
    # each) is recomputed in its own layout, byte for byte (no object PUT, the manifest a 412).
    accept_indexed(system, runtime, clock, _ident(1), _many_series(40))
    access = access_for(system, runtime, "pipeline-row-groups")
    job = RollupJob(spark, access, table=None, clock=clock)
    monkeypatch.setattr(P, "ROWS_PER_ROW_GROUP", None)  # as a job before row groups were recorded
    assert job.run([H0], first_open=NEXT).hours[0].status == "committed"
    monkeypatch.setattr(P, "ROWS_PER_ROW_GROUP", 7)  # any other size would change every object's bytes
    doc = read_committed(access, H0)
    assert "rows_per_row_group" not in doc["parquet"] and P.rows_per_row_group(doc) is None
    for o in doc["parquet"]["objects"]:
        assert pq.read_metadata(io.BytesIO(store(access).get(o["key"]))).num_row_groups == 1
    again = job.run([H0], first_open=NEXT, recompute=True)
    assert again.hours[0].status == "recomputed" and again.requests.statuses("PutObject") == {"412": 1}
    q = run_query(access, "load.m1", start_ns=T0_NS - 2 * 3600 * 10**9, end_ns=T0_NS + 3600 * 10**9, window="5m")
    assert q.objects_read == 1 and q.bytes_read == P.objects_of(doc, "5m", "load.m1")[0]["bytes"]
    # The next generation is written in the current size, recorded; the query's answer is the same.
    late = accept_indexed(system, runtime, clock, _ident(2), _many_series(40)[:3])
    assert late.status.value == "accepted"
    assert job.run([H0], first_open=NEXT).hours[0].generation == 2
    doc2 = read_committed(access, H0)
    assert doc2["parquet"]["rows_per_row_group"] == 7
    (five,) = P.objects_of(doc2, "5m", "load.m1")
    assert pq.read_metadata(io.BytesIO(store(access).get(five["key"]))).num_row_groups == -(-five["rows"] // 7)
    q2 = run_query(access, "load.m1", start_ns=T0_NS - 2 * 3600 * 10**9, end_ns=T0_NS + 3600 * 10**9, window="5m")
    assert [s.labels for s in q2.series] == [s.labels for s in q.series]


def test_objects_entries_carry_their_row_groups_sha256_and_a_generation_without_them_is_recomputed_so(
        system, runtime, clock, spark, monkeypatch):  # type: ignore[no-untyped-def]
    # A ranged read checks what it reads against the manifest (docs/protocol.md §4.6): each object's
    # entry names the sha256 of its footer and of each row group, as the objects' bytes give them. A
    # generation committed before they were recorded is recomputed without them, byte for byte.
    accept_indexed(system, runtime, clock, _ident(1), _many_series(40))
    access = access_for(system, runtime, "pipeline-range-checks")
    job = RollupJob(spark, access, table=None, clock=clock)
    from lightmetrics_pipeline.rollup import job as J

    monkeypatch.setattr(P, "ROWS_PER_ROW_GROUP", 7)
    written = J.write_parquet

    def before_checks(*args, **kwargs):  # type: ignore[no-untyped-def]
        # as a job before the checks were recorded (decided in the driver; executors import P afresh)
        return written(*args, **{**kwargs, "range_checks": {hs: False for hs in args[2]}})

    monkeypatch.setattr(J, "write_parquet", before_checks)
    assert job.run([H0], first_open=NEXT).hours[0].status == "committed"
    monkeypatch.setattr(J, "write_parquet", written)
    doc = read_committed(access, H0)
    assert doc["parquet"]["objects"] and not P.records_range_checks(doc)
    again = job.run([H0], first_open=NEXT, recompute=True)
    assert again.hours[0].status == "recomputed" and again.requests.statuses("PutObject") == {"412": 1}
    late = accept_indexed(system, runtime, clock, _ident(2), _many_series(40)[:3])
    assert late.status.value == "accepted"
    assert job.run([H0], first_open=NEXT).hours[0].generation == 2
    doc2 = read_committed(access, H0)
    assert P.records_range_checks(doc2)
    for o in doc2["parquet"]["objects"]:
        data = store(access).get(o["key"])
        assert pq.read_metadata(io.BytesIO(data)).num_row_groups == len(o["row_group_sha256"]) == -(-o["rows"] // 7)
        assert {k: o[k] for k in ("footer_sha256", "row_group_sha256")} == P.range_checks(data)
    again = job.run([H0], first_open=NEXT, recompute=True)  # with them: the same bytes again
    assert again.hours[0].status == "recomputed" and again.requests.statuses("PutObject") == {"412": 1}


def _query_table(q) -> dict[tuple[tuple[tuple[str, str], ...], int], tuple[object, ...]]:  # type: ignore[no-untyped-def]
    return {(tuple(sorted(s.labels.items())), p.window_start_ns): _agg_bits(p) for s in q.series for p in s.points}


def test_query_answers_the_same_from_v2_and_v3(runtime, clock, spark) -> None:  # type: ignore[no-untyped-def]
    answers = []
    for fmt in (2, 3):
        system = make_system(runtime, clock)
        for n in range(3):
            accept_indexed(system, runtime, clock, _ident(n), varied_samples(n, n=60))
        access = access_for(system, runtime)
        report = RollupJob(spark, access, table=None, clock=clock, rollup_format=fmt).run([H0], first_open=NEXT)
        assert report.hours[0].format == fmt
        assert read_committed(access, H0)["schema"] == ("lightmetrics.rollup_manifest.v2" if fmt == 2 else
                                                       P.MANIFEST_SCHEMA_V4)
        per_format = {}
        for metric in ("cpu.usage", "mem.rss", "disk/io"):
            for window in ("1m", "5m", "1h"):
                q = run_query(access, metric, start_ns=T0_NS - 3 * 3600 * 10**9, end_ns=T0_NS + 3600 * 10**9,
                              window=window)
                assert q.series
                per_format[(metric, window)] = _query_table(q)
        answers.append(per_format)
    assert answers[0] == answers[1]


def _plain_read(s3, bucket: str) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    """What a reader without lightmetrics does: boto3, json and pyarrow only. The rows of the
    highest committed generation of each hour (its manifest is the largest generation=N.json; it
    names the hour, generation and inputs digest the rows carry)."""
    def keys(prefix: str) -> list[str]:
        return [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for o in page.get("Contents", [])]

    best: dict[str, dict[str, object]] = {}
    for key in keys("manifests/v1/"):
        if re.search(r"/generation=\d{10}\.json$", key):
            doc = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            hour = doc.get("acceptance_hour", doc.get("hour"))  # manifest v4; v3 named it hour
            if hour not in best or doc["generation"] > best[hour]["generation"]:
                best[hour] = doc
    current = {(h, d["generation"], d["inputs"]["sha256"]) for h, d in best.items()}
    out = []
    for key in keys("rollup/v1/"):
        if not key.endswith(".parquet"):
            continue
        window = re.search(r"window=(\w+)/", key).group(1)  # type: ignore[union-attr]
        table = pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))
        for r in table.to_pylist():
            if (r["acceptance_hour"], r["rollup_generation"], r["inputs_sha256"]) in current:
                out.append({**r, "window": window})
    return out


def test_rollups_are_readable_with_plain_pyarrow(system, runtime, clock, spark) -> None:  # type: ignore[no-untyped-def]
    results = [accept_indexed(system, runtime, clock, _ident(n), varied_samples(n, n=50)) for n in range(2)]
    access = access_for(system, runtime)
    job = RollupJob(spark, access, table=None, clock=clock)
    assert job.run([H0], first_open=NEXT).hours[0].generation == 1
    results.append(accept_indexed(system, runtime, clock, _ident(5), varied_samples(5, n=50)))  # a late batch
    assert job.run([H0], first_open=NEXT).hours[0].generation == 2  # generation 1's objects stay, superseded
    s3 = runtime.boto3_client("s3")
    rows = _plain_read(s3, system.settings.bucket)
    assert {r["rollup_generation"] for r in rows} == {2}
    st = store(access)
    ref = reference_rollup({KeyCodec("").parse(r.manifest_key).identity.manifest_id: st.get(r.blob_key)  # type: ignore[union-attr]
                            for r in results})
    for metric in ("cpu.usage", "disk/io"):
        q = run_query(access, metric, start_ns=T0_NS - 3 * 3600 * 10**9, end_ns=T0_NS + 3600 * 10**9, window="5m")
        plain = {(tuple(sorted(r["labels"])), r["window_start_ns"]):
                 (r["window_start_ns"], r["count"], r["nan_count"], _BITS(r["sum"]), _BITS(r["min"]), _BITS(r["max"]),
                  _BITS(r["last"]), r["last_ts_ns"], r["sketch"])
                 for r in rows if r["metric"] == metric and r["window"] == "5m"}
        assert plain == _query_table(q)
        # ... and both are the samples' numbers (all three batches: the superseding generation's)
        want = {k for k in ref if k[0] == metric and k[2] == "5m"}
        assert sum(p[1] for p in plain.values()) == sum(ref[k]["count"] for k in want)
