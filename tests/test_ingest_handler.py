"""The ingest Lambda handler, replaying the sample events of events/ingest/ (docs/protocol.md §6-7, the HTTP contract)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from conftest import ALL_BACKENDS

from functions.ingest import app
from lightmetrics.harness.testing import sample_events
from lightmetrics.local.function_host import LambdaContext

BACKENDS = ALL_BACKENDS  # storage semantics: every test runs on moto and on MiniStack

EVENTS = Path(__file__).resolve().parent.parent / "events" / "ingest"


@pytest.fixture
def ingest_env(runtime, bucket, monkeypatch):  # type: ignore[no-untyped-def]
    secret_id = f"lm-test/tokens-{uuid.uuid4().hex[:8]}"
    secret = json.loads((EVENTS / "secret.json").read_text())
    secret.pop("_comment")
    runtime.boto3_client("secretsmanager").create_secret(Name=secret_id, SecretString=json.dumps(secret))
    for name, value in {
        "LM_BUCKET": bucket,
        "LM_AUTH_SECRET_ID": secret_id,
        "LM_COLLECTOR_ID": "collector-lambda",
        "LM_MAX_FRAME_BYTES": str(sample_events.SAMPLE_MAX_FRAME_BYTES),
        "LM_S3_MAX_ATTEMPTS": "2",
    }.items():
        monkeypatch.setenv(name, value)
    app.reset()
    yield bucket
    app.reset()


def invoke(name: str) -> tuple[int, dict, dict]:
    event = json.loads((EVENTS / name).read_text())
    out = app.handler(event, LambdaContext("ingest"))
    return out["statusCode"], json.loads(out["body"]), out["headers"]


def test_sample_events_are_up_to_date(tmp_path):  # type: ignore[no-untyped-def]
    sample_events.write(tmp_path)
    for path in sorted(tmp_path.iterdir()):
        assert path.read_text() == (EVENTS / path.name).read_text(), f"regenerate {path.name}"


def test_every_sample_event_gets_its_documented_answer(ingest_env):  # type: ignore[no-untyped-def]
    index = json.loads((EVENTS / "index.json").read_text())
    assert {e["status_code"] for e in index} >= {200, 400, 401, 403, 405, 409, 413}
    for entry in index:
        status, body, headers = invoke(entry["event"])
        assert (status, body["status"]) == (entry["status_code"], entry["status"]), (entry, body)
        assert headers["content-type"] == "application/json"
        if status >= 400:
            assert body.get("reason"), f"{entry['event']} must say why"
        if entry["event"] == "duplicate.json":
            assert body["duplicate"] is True
        if entry["event"] == "identity-conflict.json":
            assert body["quarantine_key"].startswith("quarantine/v1/identity-conflict/")
            assert body["existing_frame_sha256"] != body["frame_sha256"]
            assert body["resolution"] == "unresolved"


def test_refused_requests_write_nothing(ingest_env, runtime):  # type: ignore[no-untyped-def]
    for name in ("missing-token.json", "revoked-key.json", "token-for-another-agent.json", "oversize-body.json",
                 "invalid-identity.json", "invalid-frame.json", "frame-identity-mismatch.json", "method-get.json"):
        invoke(name)
    assert runtime.boto3_client("s3").list_objects_v2(Bucket=ingest_env).get("KeyCount") == 0


def test_s3_failing_is_503_with_retry_after(ingest_env):  # type: ignore[no-untyped-def]
    from lightmetrics.local.hosting import host_from_env
    from lightmetrics.protocol.hosting import hosted

    app.reset()
    # The local runtime injects LM_FAULTS into the clients of the functions it hosts (the function
    # itself never reads it).
    with hosted(host_from_env({"LM_FAULTS": json.dumps([{"fault": "503", "operation": "PutObject", "times": -1}])})):
        status, body, headers = invoke("accepted.json")
    assert (status, body["status"], headers["retry-after"]) == (503, "unavailable", "2")
    assert body["retry_after_s"] == 2


def test_bad_configuration_fails_the_cold_start_loudly(monkeypatch):  # type: ignore[no-untyped-def]
    from lightmetrics.protocol.errors import ConfigError

    monkeypatch.setenv("LM_BUCKET", "Not_A_Bucket")
    app.reset()
    with pytest.raises(ConfigError, match="LM_BUCKET"):
        invoke("accepted.json")
    app.reset()


def test_an_empty_body_is_400_saying_so(ingest_env, runtime):  # type: ignore[no-untyped-def]
    """Issue 17: an empty POST (no frame) is answered 400 invalid, ``duplicate`` false, with a reason
    that says the body is empty (not the frame decoder's "truncated in magic"), one content-type."""
    event = json.loads((EVENTS / "accepted.json").read_text())
    event["body"], event["isBase64Encoded"] = "", False
    out = app.handler(event, LambdaContext("ingest"))
    body = json.loads(out["body"])
    assert out["statusCode"] == 400 and body["status"] == "invalid" and body["duplicate"] is False, out
    assert body["reason"].startswith("empty body"), body
    assert [k for k in out["headers"] if k.lower() == "content-type"] == ["content-type"]
    assert runtime.boto3_client("s3").list_objects_v2(Bucket=ingest_env).get("KeyCount") == 0


def test_a_missing_identity_header_is_named(ingest_env, runtime):  # type: ignore[no-untyped-def]
    """Issue 27 item 7: a POST without ``X-Lm-Boot-Id`` was answered "boot_id must be a string"; the
    400 names the header (and every other one that is missing), and nothing is written."""
    event = json.loads((EVENTS / "accepted.json").read_text())
    event["headers"] = {k: v for k, v in event["headers"].items() if k.lower() != "x-lm-boot-id"}
    out = app.handler(event, LambdaContext("ingest"))
    body = json.loads(out["body"])
    assert out["statusCode"] == 400 and body["status"] == "invalid", out
    assert body["reason"] == ("invalid identity headers: missing header X-Lm-Boot-Id (a submission names its "
                              "identity in X-Lm-Agent-Id, X-Lm-Boot-Id, X-Lm-Seq-Start, X-Lm-Seq-End)"), body
    event["headers"] = {k: v for k, v in event["headers"].items() if not k.lower().startswith("x-lm-seq")}
    body = json.loads(app.handler(event, LambdaContext("ingest"))["body"])
    assert body["reason"].startswith("invalid identity headers: missing header X-Lm-Boot-Id, X-Lm-Seq-Start, "
                                     "X-Lm-Seq-End ("), body
    assert runtime.boto3_client("s3").list_objects_v2(Bucket=ingest_env).get("KeyCount") == 0
