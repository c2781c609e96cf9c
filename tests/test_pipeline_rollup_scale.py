"""The rollup's parallelism is sized from its input, and its driver holds no per-chunk state (issue 15)."""

from __future__ import annotations

import pytest
from pipeline_support import H0, accept_indexed, access_for, make_system, varied_samples

from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics_pipeline.rollup import job as R
from lightmetrics_pipeline.rollup.committed import read_committed
from lightmetrics_pipeline.rollup.job import RollupJob, tasks_for

NEXT = H0.next()


@pytest.fixture
def system(runtime, clock):  # type: ignore[no-untyped-def]
    return make_system(runtime, clock)


def test_task_counts_follow_the_input(system, runtime, clock, spark, monkeypatch):  # type: ignore[no-untyped-def]
    # Five agents whose ids all start with "agent-" (hex 61...): the old first-hex-digit shards put
    # them all in one listing task. Ranges of 2 agents -> 3 listing tasks; 2 inputs per decode
    # task -> 3 decode tasks; 3 chunks per write task -> as many write partitions as series.
    for n, agent in enumerate(["agent-a", "agent-b", "agent-c", "agent-d", "agent-e"]):
        accept_indexed(system, runtime, clock, BatchIdentity.create(agent, "boot-1", n, n), varied_samples(n, n=6))
    monkeypatch.setattr(R, "AGENTS_PER_LIST_TASK", 2)
    monkeypatch.setattr(R, "INPUTS_PER_DECODE_TASK", 2)
    monkeypatch.setattr(R, "CHUNKS_PER_WRITE_TASK", 3)
    access = access_for(system, runtime)
    report = RollupJob(spark, access, table=None, clock=clock).run([H0], first_open=NEXT)
    (h,) = report.hours
    assert h.status == "committed" and h.inputs == 5
    assert report.tasks["listing"] == 3 and report.tasks["decode"] == 3
    # Writes: one partition per possible object (hash-partitioned by hour, window and part): here
    # one object per window, at most as many tasks.
    assert 1 <= report.tasks["write"] <= h.objects == 3
    # the v2 parts (one delimited page a run: none here), the hour's agents (one delimited page),
    # one page per range, the hour's committed manifests
    assert report.requests.statuses("ListObjectsV2") == {"200": 1 + 1 + 3 + 1}
    assert "listing-v2" not in report.tasks  # no v2 object: no v2 stage
    doc = read_committed(access, H0)
    assert doc["totals"]["objects"] == h.objects and doc["totals"]["series"] == h.series


def test_tasks_for() -> None:
    assert [tasks_for(n, 10) for n in (0, 1, 10, 11, 25_000)] == [1, 1, 1, 2, 2_000]


def test_a_v1_manifest_is_read_and_compared_as_the_same_chunks() -> None:
    import json

    from lightmetrics.protocol.keys import KeyCodec
    from lightmetrics_pipeline.rollup import chunks as C
    from lightmetrics_pipeline.rollup import manifest as RM
    from lightmetrics_pipeline.rollup.committed import same_chunks

    codec = KeyCodec("")
    docs = [{"chunk_id": f"{i:064x}", "window": w, "metric": f"m{i % 3}", "labels": [["host", f"h{i}"]],
             "series": C.series_key(f"m{i % 3}", [("host", f"h{i}")]), "sample_ts_min_ns": 1, "sample_ts_max_ns": 2,
             "samples": 5, "rows": 1, "sha256": "ab" * 32, "bytes": 100} for i in range(7) for w in ("1m", "5m", "1h")]
    common = {"hour": H0, "generation": 3, "supersedes": 2, "input_count": 4, "input_sha256": "cd" * 32}
    v1 = RM.parse_manifest(RM.manifest_v1_bytes(**common, skipped=[], chunks=docs))
    lists = [RM.chunk_list_ref(codec, H0, part, data, n) for part, data, n in RM.chunk_lists(
                                  hour=H0, generation=3, chunks=list(reversed(docs)))]
    v2 = RM.parse_manifest(RM.manifest_bytes(**common, skipped=[], skipped_count=0, parts=1, lists=lists,
                                           totals={"chunks": 21, "series": 7, "samples": 35}))
    assert v1["schema"].endswith(".v1") and v2["schema"].endswith(".v2")
    assert same_chunks(codec, v1, v2)
    v1["chunks"][4]["sha256"] = "ef" * 32  # another chunk's bytes: not the same generation content
    assert not same_chunks(codec, v1, v2)
    newer = json.loads(RM.manifest_bytes(**common, skipped=[], skipped_count=0, parts=1, lists=lists,
                                        totals={"chunks": 21, "series": 7, "samples": 35}))
    newer["schema"] = "lightmetrics.rollup_manifest.v5"  # v4 and v3 (Parquet objects) are read; v5 would be newer
    from lightmetrics.protocol.errors import UnsupportedVersionError

    with pytest.raises(UnsupportedVersionError):
        RM.parse_manifest(json.dumps(newer).encode())
