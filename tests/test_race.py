"""Race: 8 OS processes submit the same identities (200 on moto, 40 on MiniStack) to one server at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from conftest import ALL_BACKENDS, ident

from lightmetrics.aws.s3_store import S3ObjectStore
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.protocol.manifests import AcceptedBatchManifest, IdentityConflictManifest

BACKENDS = ALL_BACKENDS  # storage semantics: every test runs on moto and on MiniStack

#: On a loaded machine MiniStack's one event loop fell far behind moto (200 identities: 146 s against moto's
#: ~30 s); 40 identities (four of them conflicting) keep its run to seconds (5 s) while still racing eight
#: processes on every identity.
WORKERS, IDENTITIES = 8, {"moto": 200, "ministack": 40}


def test_processes_racing_on_identities_accept_each_exactly_once(runtime, bucket, tmp_path: Path):  # type: ignore[no-untyped-def]
    identities = IDENTITIES[getattr(runtime, "name", "moto")]
    go = tmp_path / "go"
    worker = Path(__file__).with_name("race_worker.py")
    env = dict(os.environ)
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), runtime.endpoint_url, bucket, str(w), str(identities), str(go),
             str(tmp_path / f"out-{w}.jsonl")],
            env=env,
        )
        for w in range(WORKERS)
    ]
    go.write_text("go")
    assert [p.wait(timeout=300) for p in procs] == [0] * WORKERS

    answers: dict[int, list[dict]] = defaultdict(list)
    for w in range(WORKERS):
        for line in (tmp_path / f"out-{w}.jsonl").read_text().splitlines():
            a = json.loads(line)
            answers[a["n"]].append(a)
    assert len(answers) == identities and all(len(v) == WORKERS for v in answers.values())

    store = S3ObjectStore(runtime.boto3_client("s3"), bucket)
    codec = KeyCodec()
    assert len(store.list_keys("accepted/v1/", limit=10_000)) == identities  # one record per identity
    conflicts_seen = 0
    for n, group in answers.items():
        manifest = AcceptedBatchManifest.from_bytes(store.get(codec.accepted(ident(n, agent="racer"))))
        statuses = [a["status"] for a in group]
        assert statuses.count("accepted") == 1, (n, statuses)  # exactly one acceptance
        for a in group:
            assert a["status"] in ("accepted", "duplicate", "identity_conflict"), a
            if a["status"] in ("accepted", "duplicate"):
                assert a["frame_sha256"] == manifest.frame_sha256  # nothing acknowledged differs
                assert store.head(manifest.raw_blob_key) is not None
            else:
                conflicts_seen += 1
                assert n % 10 == 0 and a["frame_sha256"] != manifest.frame_sha256
                evidence = IdentityConflictManifest.from_bytes(store.get(a["quarantine_key"]))
                assert evidence.submitted_frame_sha256 == a["frame_sha256"]
                assert evidence.accepted_frame_sha256 == manifest.frame_sha256
        if n % 10:
            assert statuses.count("duplicate") == WORKERS - 1
    # every conflicting identity: one winner, seven conflicts
    assert conflicts_seen == (identities // 10) * (WORKERS - 1)
