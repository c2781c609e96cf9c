"""Issue 27 item 12: ``lmctl query`` reads what it needs of a v3 object — its footer, then only the
row groups holding the metric (ranged GETs) — with results identical to a whole-object read, and
objects written before row groups were recorded (one row group) still read whole.

The figure (bytes read for one metric of a full object, before and after) is printed: run
``pytest -s tests/test_rollup_query_ranged.py`` to see it (docs/performance.md quotes it).
"""

from __future__ import annotations

import io
import random
from typing import Any

import pyarrow.parquet as pq
import pytest

from lightmetrics.harness.testing.memory import InMemoryObjectStore
from lightmetrics.protocol.keys import UtcHour
from lightmetrics_pipeline.rollup import parquet as P
from lightmetrics_pipeline.rollup import sketch as SK
from lightmetrics_pipeline.rollup.query import run_query
from lightmetrics_pipeline.rollup.ranged_read import TAIL_BYTES, metric_row_groups, read_metric
from lightmetrics_pipeline.s3io import S3Access

HOUR = UtcHour.of_unix_ns(1_764_000_000 * 10**9)
METRICS, HOSTS, WINDOWS = 200, 104, 12  # 200 metrics x 104 series x 12 five-minute windows = 249,600 rows
_NS = 10**9


def _rows() -> list[dict[str, Any]]:
    """A full object's rows (just under ROWS_PER_PART) with real sketches, in a scrambled order."""
    rng = random.Random(7)
    sketches = [SK.serialize_sketch(SK.sketch_of([rng.gauss(50, 10) for _ in range(30)])) for _ in range(64)]
    start_ns = HOUR.start_unix_s * _NS
    out = []
    for m in range(METRICS):
        for h in range(HOSTS):
            labels = [("host", f"h{h:04d}"), ("region", "eu-west-1")]
            series = f'["svc.m{m:03d}",[["host","h{h:04d}"],["region","eu-west-1"]]]'
            for w in range(WINDOWS):
                ws = start_ns + w * 300 * _NS
                out.append({"metric": f"svc.m{m:03d}", "labels": labels, "series": series, "window_start": ws // 1000,
                            "window_start_ns": ws, "count": 30, "nan_count": 0, "sum": rng.uniform(0, 3000),
                            "min": rng.uniform(0, 10), "max": rng.uniform(90, 100), "last": rng.uniform(0, 100),
                            "last_ts_ns": ws + 299 * _NS, "sketch": sketches[(m + h + w) % 64], "p50": 50.0,
                            "p90": 62.8, "p99": 73.3, "acceptance_hour": str(HOUR), "rollup_generation": 1,
                            "inputs_sha256": "ab" * 32})
    rng.shuffle(out)
    return out


def _bucket(rows: list[dict[str, Any]], rows_per_row_group: int | None) -> tuple[S3Access, dict[str, Any]]:
    """A bucket holding one committed generation: the one object of window 5m, and its manifest."""
    st = InMemoryObjectStore("lm-ranged")
    access = S3Access(bucket="lm-ranged", object_store=st)
    data = P.part_bytes(rows, rows_per_row_group)
    ref = P.part_ref(access.codec, HOUR, 1, "5m", 0, data, len(rows), METRICS * HOSTS)
    st.put_if_absent(ref["key"], data)
    manifest = P.manifest_v3_bytes(hour=HOUR, generation=1, supersedes=None, input_count=1, input_sha256="ab" * 32,
                                   skipped=[], skipped_count=0, parts={"1m": 1, "5m": 1, "1h": 1}, objects=[ref],
                                   totals={"rows": len(rows), "series": METRICS * HOSTS, "samples": 1},
                                   rows_per_row_group=rows_per_row_group)
    st.put_if_absent(access.codec.rollup_manifest(HOUR, 1), manifest)
    return access, ref


@pytest.fixture(scope="module")
def buckets() -> dict[str, tuple[S3Access, dict[str, Any]]]:
    rows = _rows()
    return {"before": _bucket(rows, None), "after": _bucket(rows, P.ROWS_PER_ROW_GROUP)}


def _query(access: S3Access, metric: str) -> Any:
    return run_query(access, metric, start_ns=HOUR.start_unix_s * _NS, end_ns=(HOUR.start_unix_s + 3600) * _NS,
                     window="5m")


def test_one_metric_of_a_full_object_reads_its_row_groups_not_the_object(buckets) -> None:  # type: ignore[no-untyped-def]
    (_, old), (_, new) = buckets["before"], buckets["after"]
    md = pq.read_metadata(io.BytesIO(buckets["after"][0].object_store.get(new["key"])))  # type: ignore[union-attr]
    assert md.num_row_groups == -(-new["rows"] // P.ROWS_PER_ROW_GROUP) == 16
    assert md.serialized_size + 8 <= TAIL_BYTES  # the footer: one tail GET
    before, after = _query(buckets["before"][0], "svc.m100"), _query(buckets["after"][0], "svc.m100")
    # Identical results; one object read either way.
    assert [s.to_json() for s in after.series] == [s.to_json() for s in before.series]
    assert len(after.series) == HOSTS and all(len(s.points) == WINDOWS for s in after.series)
    assert before.objects_read == after.objects_read == 1
    # Before: the whole object. After: the 64 KiB tail and the one or two row groups holding the metric.
    assert before.bytes_read == old["bytes"]
    assert after.bytes_read <= TAIL_BYTES + 2 * new["bytes"] // md.num_row_groups + 4096
    assert after.bytes_read * 8 < new["bytes"]
    print(f"\none metric of a full object ({new['rows']:,} rows, {METRICS} metrics): before {before.bytes_read:,} bytes "
          f"(the whole object, one row group); after {after.bytes_read:,} bytes of a {new['bytes']:,}-byte object "
          f"({md.num_row_groups} row groups of {P.ROWS_PER_ROW_GROUP:,} rows, footer {md.serialized_size:,} bytes): "
          f"{after.bytes_read / before.bytes_read:.1%} of before")


@pytest.mark.parametrize("metric", ["svc.m000", "svc.m100", "svc.m199", "svc.m1000", "zzz", "a"])
def test_ranged_rows_equal_the_whole_objects_rows_and_requests_are_the_tail_and_one_run(buckets, metric) -> None:  # type: ignore[no-untyped-def]
    access, ref = buckets["after"]
    st = access.object_store
    whole = P.read_part(st.get(ref["key"]), metric)
    got = read_metric(st, ref, metric, P.ROWS_PER_ROW_GROUP)
    assert got is not None and got.table.equals(whole)
    md = pq.read_metadata(io.BytesIO(st.get(ref["key"])))
    groups = metric_row_groups(md, metric)
    # Statistics are ranges: a name sorting between two present ones ("svc.m1000") may pick a group.
    assert len(groups) <= 2 and (groups or whole.num_rows == 0)
    # The tail, then one GET when the metric has rows (its adjacent groups are one range).
    assert got.requests == (2 if groups else 1)
    # An old (one row group) object: one whole GET, checked against its sha256.
    old_access, old_ref = buckets["before"]
    old = read_metric(old_access.object_store, old_ref, metric, None)
    assert old is not None and old.table.equals(whole) and (old.requests, old.bytes_read) == (1, old_ref["bytes"])


def test_ranged_reads_through_the_s3_adapter_read_the_same_rows(buckets, runtime) -> None:  # type: ignore[no-untyped-def]
    # The S3 adapter's Range header, end to end on the local runtime (moto): the same rows and bytes.
    from conftest import FAST, make_bucket

    from lightmetrics.aws.s3_store import S3ObjectStore, s3_client_config

    access, ref = buckets["after"]
    s3 = S3ObjectStore(runtime.boto3_client("s3", config=s3_client_config()), make_bucket(runtime), read_policy=FAST)
    s3.put_if_absent(ref["key"], access.object_store.get(ref["key"]))
    for metric in ("svc.m042", "svc.m199", "nope"):
        want = read_metric(access.object_store, ref, metric, P.ROWS_PER_ROW_GROUP)
        got = read_metric(s3, ref, metric, P.ROWS_PER_ROW_GROUP)
        assert want is not None and got is not None and got.table.equals(want.table)
        assert (got.bytes_read, got.requests) == (want.bytes_read, want.requests)


def test_a_ranged_read_of_an_object_of_another_size_or_a_missing_one_is_refused(buckets) -> None:  # type: ignore[no-untyped-def]
    access, ref = buckets["after"]
    assert read_metric(access.object_store, {**ref, "bytes": ref["bytes"] + 10}, "svc.m001", P.ROWS_PER_ROW_GROUP) is None
    assert read_metric(access.object_store, {**ref, "key": ref["key"] + "x"}, "svc.m001", P.ROWS_PER_ROW_GROUP) is None


def test_part_bytes_are_deterministic_and_record_their_row_groups() -> None:
    rows = _rows()[:40_000]
    a, b = P.part_bytes(rows), P.part_bytes(list(reversed(rows)))
    assert a == b and pq.read_metadata(io.BytesIO(a)).num_row_groups == 3
    assert pq.read_metadata(io.BytesIO(P.part_bytes(rows, None))).num_row_groups == 1
    common: dict[str, Any] = {"hour": HOUR, "generation": 1, "supersedes": None, "input_count": 1,
                              "input_sha256": "ab" * 32, "skipped": [], "skipped_count": 0, "parts": {}, "objects": [],
                              "totals": {"rows": 0, "series": 0, "samples": 0}}
    import json

    doc = json.loads(P.manifest_v3_bytes(**common))
    assert doc["parquet"]["rows_per_row_group"] == P.ROWS_PER_ROW_GROUP == P.rows_per_row_group(doc)
    legacy = json.loads(P.manifest_v3_bytes(**common, rows_per_row_group=None))
    assert "rows_per_row_group" not in legacy["parquet"] and P.rows_per_row_group(legacy) is None


def test_a_flipped_byte_in_one_row_group_or_the_footer_fails_loudly_and_other_metrics_still_read(buckets) -> None:  # type: ignore[no-untyped-def]
    """A ranged read cannot hash the whole object, so the manifest records the sha256 of the object's
    footer and of each row group (docs/protocol.md §4.6): a read checks the footer before trusting its
    statistics and every row group it decodes, and a damaged one is an error naming the object and
    the row group, never rows. Row groups it does not read do not matter to it."""
    from lightmetrics_pipeline.rollup.ranged_read import RollupObjectCorrupt

    access, ref = buckets["after"]
    intact = access.object_store.get(ref["key"])
    assert intact is not None
    md = pq.read_metadata(io.BytesIO(intact))
    assert len(ref["row_group_sha256"]) == md.num_row_groups and len(ref["footer_sha256"]) == 64
    (group, *_) = metric_row_groups(md, "svc.m100")
    start, end = P.row_group_byte_range(md.row_group(group))

    def damaged(at: int) -> InMemoryObjectStore:
        data = bytearray(intact)
        data[at] ^= 0x01
        st = InMemoryObjectStore("lm-damaged")
        st.put_if_absent(ref["key"], bytes(data))
        return st

    st = damaged((start + end) // 2)
    with pytest.raises(RollupObjectCorrupt, match=rf"{ref['key']}: row group {group} \(bytes \[{start}, {end}\)\) "
                                                  r"does not match the sha256 its manifest records"):
        read_metric(st, ref, "svc.m100", P.ROWS_PER_ROW_GROUP)
    assert group not in metric_row_groups(md, "svc.m000")  # another metric's row groups are intact: read
    got = read_metric(st, ref, "svc.m000", P.ROWS_PER_ROW_GROUP)
    assert got is not None and got.table.equals(P.read_part(intact, "svc.m000"))
    footer_at = len(intact) - 8 - md.serialized_size // 2
    with pytest.raises(RollupObjectCorrupt, match=rf"{ref['key']}: its footer does not match the sha256"):
        read_metric(damaged(footer_at), ref, "svc.m000", P.ROWS_PER_ROW_GROUP)
    # Through `lmctl query`'s reader: the error, not a series with wrong numbers.
    bad = S3Access(bucket="lm-damaged", object_store=st)
    bad.object_store.put_if_absent(access.codec.rollup_manifest(HOUR, 1),  # type: ignore[union-attr]
                                   access.object_store.get(access.codec.rollup_manifest(HOUR, 1)))  # type: ignore[union-attr]
    with pytest.raises(RollupObjectCorrupt, match="does not match"):
        _query(bad, "svc.m100")


def test_an_object_whose_manifest_records_no_row_group_sha256_is_read_whole_and_checked(buckets) -> None:  # type: ignore[no-untyped-def]
    """A generation written before the checks were recorded (the fields absent): a ranged reader
    cannot check what it reads, so it reads the object whole and checks its sha256 (§4.6, §17 E2)."""
    access, ref = buckets["after"]
    legacy = {k: v for k, v in ref.items() if k not in ("footer_sha256", "row_group_sha256")}
    got = read_metric(access.object_store, legacy, "svc.m100", P.ROWS_PER_ROW_GROUP)
    assert got is not None and (got.requests, got.bytes_read) == (1, ref["bytes"])
    assert got.table.equals(read_metric(access.object_store, ref, "svc.m100", P.ROWS_PER_ROW_GROUP).table)  # type: ignore[union-attr]
    data = bytearray(access.object_store.get(ref["key"]))  # type: ignore[arg-type]
    data[len(data) // 2] ^= 0x01
    st = InMemoryObjectStore("lm-damaged-legacy")
    st.put_if_absent(ref["key"], bytes(data))
    assert read_metric(st, legacy, "svc.m100", P.ROWS_PER_ROW_GROUP) is None  # the whole object's sha256 refuses it
