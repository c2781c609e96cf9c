"""Every trigger's sample event (events/) runs through `lmctl invoke` against the local runtime."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import FAST
from test_cli import LMCTL

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.harness.testing import sample_events
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.identity import BatchIdentity

EVENTS = os.path.join(os.path.dirname(__file__), "..", "events")


def test_background_sample_events_are_up_to_date(tmp_path):  # type: ignore[no-untyped-def]
    for path in sample_events.write_background(tmp_path):
        rel = path.relative_to(tmp_path)
        with open(os.path.join(EVENTS, rel)) as committed:
            assert path.read_text() == committed.read(), f"regenerate {rel}"


@pytest.fixture(scope="module")
def sample_system(runtime):  # type: ignore[no-untyped-def]
    system = LocalSystem(runtime, bucket=sample_events.SAMPLE_BUCKET, table="lm-samples",
                         secret_name="lm-samples/tokens", queue_name_prefix="samples-").provision()
    actx = accept_context(system.settings, client=runtime.boto3_client("s3"), policy=FAST)
    ident = BatchIdentity.create(sample_events.AGENT, sample_events.BOOT, 0, 9)
    accept_batch(actx, ident, sample_events._frame(0))
    assert accept_batch(actx, ident, sample_events._frame(0, value=7.0)).status.value == "identity_conflict"
    return system


def invoke(system, function: str, event: str) -> dict:  # type: ignore[no-untyped-def]
    env = {**os.environ, **system.environment()}
    r = subprocess.run(LMCTL + ["invoke", function, "--event", os.path.join(EVENTS, event), "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def keys(runtime, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    out = runtime.boto3_client("s3").list_objects_v2(Bucket=sample_events.SAMPLE_BUCKET, Prefix=prefix)
    return [o["Key"] for o in out.get("Contents", [])]


def test_indexer_samples(sample_system, runtime):  # type: ignore[no-untyped-def]
    assert invoke(sample_system, "index-accepted", "index_accepted/object-created.json") == {"batchItemFailures": []}
    assert len(keys(runtime, "accepted-by-time/")) == 1 and len(keys(runtime, "accepted-by-blob/")) == 1
    assert invoke(sample_system, "index-raw-blobs", "index_raw_blobs/object-created.json") == {"batchItemFailures": []}
    assert len(keys(runtime, "raw-blobs-by-time/")) == 1
    assert invoke(sample_system, "index-quarantine", "index_quarantine/object-created.json") == {
        "batchItemFailures": []}
    assert len(keys(runtime, "quarantine-by-blob/")) == 1
    assert invoke(sample_system, "index-accepted", "index_accepted/s3-test-event.json") == {"batchItemFailures": []}
    # a poisoned body is acknowledged, not redelivered forever: it became a blocker
    assert invoke(sample_system, "index-accepted", "index_accepted/poisoned-body.json") == {"batchItemFailures": []}
    blockers = sample_system.work_context().blockers.list()
    assert [b.kind for b in blockers] == ["event-parse"]


def test_scheduled_samples(sample_system, runtime):  # type: ignore[no-untyped-def]
    fanout = invoke(sample_system, "reconcile", "reconcile/scheduled.json")  # the one schedule fans out
    assert fanout["fanout"] is True and fanout["sent"] == fanout["shards"] == sample_system.settings.reconcile_shards
    report = invoke(sample_system, "reconcile", "reconcile/shard.json")  # a shard's run, as its message or lmctl invoke
    assert {"checkpoint_after", "entries", "lag_s", "outcomes"} <= set(report)
    swept = invoke(sample_system, "sweep-dlq", "sweep_dlq/scheduled.json")
    assert set(swept["blockers_made"]) == {"index-accepted-dlq", "index-raw-blobs-dlq", "index-quarantine-dlq"}


def test_state_machine_inputs_are_valid_inputs_of_their_machines():  # type: ignore[no-untyped-def]
    from lightmetrics.derived.walk import WalkParams
    from lightmetrics.reaps import ReapParams

    parse = {"bootstrap-walk": WalkParams.parse, "reap": ReapParams.parse}
    names = sorted(os.listdir(os.path.join(EVENTS, "statemachines")))
    assert names == ["bootstrap-walk-scheduled.json", "reap-gc-dry-run.json", "reap-scheduled-when-enabled.json",
                     "reap-scheduled.json"]
    for name in names:
        with open(os.path.join(EVENTS, "statemachines", name)) as fh:
            event = json.load(fh)
        machine = "reap" if name.startswith("reap") else "bootstrap-walk"
        parse[machine](event)  # raises on anything the machine's begin task would refuse
        if machine == "reap":
            assert "dry_run" in event  # every reap input states it explicitly (docs/reaps.md)
