"""The rollup's inputs over v1 and v2 (issue 26, derived state v2 slice 2): an hour's manifest-ids
are the union of its v1 entries and its v2 entries (a rollup that missed the v2 ones would be
wrong silently), each batch once; a refused v2 object fails its hour with the key and the reason."""

from __future__ import annotations

import pytest
from pipeline_support import H0, accept_indexed, access_for, make_system, varied_samples

from lightmetrics.protocol.derived_entries import AcceptedByTimeEntry
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.segment_entries import AcceptedSegmentEntry
from lightmetrics.protocol.segment_keys import SegmentIndex, SegmentKeyCodec
from lightmetrics.protocol.segments import encode_segments
from lightmetrics_pipeline import s3io
from lightmetrics_pipeline.rollup.committed import read_committed
from lightmetrics_pipeline.rollup.job import RollupJob

NEXT = H0.next()
ACC = SegmentIndex.ACCEPTED_BY_TIME


@pytest.fixture
def system(runtime, clock):  # type: ignore[no-untyped-def]
    return make_system(runtime, clock)


def _to_v2(access, store, identity: BatchIdentity, *, keep_v1: bool) -> AcceptedSegmentEntry:  # type: ignore[no-untyped-def]
    """The batch's v2 entry, from its v1 entry and the record's ETag; the v1 object deleted unless kept."""
    codec = access.codec
    v1_key = codec.accepted_by_time(H0, identity)
    v1 = AcceptedByTimeEntry.model_validate_json(store.get(v1_key))
    head = store.head(v1.manifest_key)
    if not keep_v1:
        store.delete(v1_key)
    return AcceptedSegmentEntry.from_v1(v1).model_copy(update={"record_etag": head.etag})


def test_the_inputs_are_the_union_of_v1_and_v2_each_batch_once(system, runtime, clock, spark):  # type: ignore[no-untyped-def]
    idents = [BatchIdentity.create(f"agent-{c}", "boot-1", n, n) for n, c in enumerate("abcd")]
    for n, ident in enumerate(idents):
        accept_indexed(system, runtime, clock, ident, varied_samples(n, n=4))
    access = access_for(system, runtime)
    store = s3io.store(access)
    # c only in v2 (its v1 entry gone), d in both (a rolling deploy indexed it twice)
    entries = [_to_v2(access, store, idents[2], keep_v1=False), _to_v2(access, store, idents[3], keep_v1=True)]
    for seg in encode_segments(access.codec, ACC, H0, 0, 1, entries):
        store.put_if_absent(seg.key, seg.body)
    report = RollupJob(spark, access, table=None, clock=clock).run([H0], first_open=NEXT)
    (h,) = report.hours
    assert (h.status, h.inputs) == ("committed", 4)
    assert read_committed(access, H0)["inputs"]["count"] == 4
    # the v2 parts (once), the agents, one range, the part-hour, the committed manifests
    assert report.requests.statuses("ListObjectsV2") == {"200": 1 + 1 + 1 + 1 + 1}
    assert report.tasks["listing-v2"] == 1


def test_a_refused_v2_object_fails_its_hour_with_the_key_and_reason(system, runtime, clock, spark):  # type: ignore[no-untyped-def]
    accept_indexed(system, runtime, clock, BatchIdentity.create("agent-a", "boot-1", 1, 1), varied_samples(1, n=4))
    access = access_for(system, runtime)
    store = s3io.store(access)
    bad = SegmentKeyCodec(access.codec.prefix).segment(ACC, 0, H0, "ab" * 32)
    store.put_if_absent(bad, b"{}")
    report = RollupJob(spark, access, table=None, clock=clock).run([H0], first_open=NEXT)
    (h,) = report.hours
    assert h.status == "refused" and bad in h.reason and "sha256" in h.reason
    assert report.refused == [h] and read_committed(access, H0) is None
    assert h.to_json()["reason"] == h.reason


def test_the_preflight_finds_a_v2_only_hour_in_the_parts_it_is_given() -> None:
    from lightmetrics.harness.testing.memory.object_store import InMemoryObjectStore
    from lightmetrics.protocol.keys import KeyCodec
    from lightmetrics_pipeline.rollup.preflight import preflight

    store, codec = InMemoryObjectStore(), KeyCodec("")
    store.put_if_absent(SegmentKeyCodec("").segment(ACC, 3, H0, "ab" * 32), b"{}")
    kw = {"first_open": NEXT + 1, "now_hour": NEXT + 1, "settle_s": 900, "explicit": True}
    assert preflight(store, codec, [H0, NEXT], parts=(1, 3), **kw).with_data == [H0]
    store.requests.clear()
    assert preflight(store, codec, [H0, NEXT], **kw).with_data == []  # v1 alone: the v2 hour is missed
    assert store.requests["ListObjectsV2"] == 2 * 2 + 1  # v1-only: the listings of before v2


def test_a_stray_key_under_the_v2_root_stops_the_run_before_spark_naming_the_key(  # type: ignore[no-untyped-def]
        system, runtime, clock, monkeypatch):
    """A key under ``accepted-by-time/v2/`` outside every ``part=<pp>/`` prefix belongs to no hour,
    and without the parts no hour's inputs are known: the run stops before Spark and before the
    lease, names the key and exits 1 (``lmctl pipeline rollup`` and the spark-submit entry point),
    nothing committed (V-D4: never skipped)."""
    import json

    from click.testing import CliRunner

    from lightmetrics.cli.main import cli
    from lightmetrics_pipeline import jobs

    def no_spark(*_a, **_k):  # type: ignore[no-untyped-def]
        raise AssertionError("Spark started although the v2 parts are unknown")

    monkeypatch.setattr(jobs, "_spark", no_spark)
    accept_indexed(system, runtime, clock, BatchIdentity.create("agent-a", "boot-1", 1, 1), varied_samples(1, n=4))
    access = access_for(system, runtime)
    stray = SegmentKeyCodec(access.codec.prefix).root(ACC) + "stray.json"
    s3io.store(access).put_if_absent(stray, b"{}")
    for name, value in system.environment().items():
        monkeypatch.setenv(name, value)
    got = CliRunner().invoke(cli, ["pipeline", "rollup", "--hour", str(H0), "--allow-open-hour", "--json"])
    assert got.exit_code == 1, got.output
    doc = json.loads(got.stdout)
    assert doc["status"] == "error" and stray in doc["reason"] and "part=<pp>/" in doc["reason"]
    assert jobs.main(["rollup", "--hour", str(H0)]) == 1
    assert read_committed(access, H0) is None
