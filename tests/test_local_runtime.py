"""The embedded local runtime: moto server + function host, provisioning, the ingest endpoint."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote_plus

import pytest
from botocore.exceptions import ClientError
from werkzeug.test import Client
from werkzeug.wrappers import Response

from lightmetrics.acceptance.auth import TokenKeys
from lightmetrics.deployment.resource_types import FunctionSpec, QueueSpec, ResourceSpec
from lightmetrics.deployment.resources import SPEC
from lightmetrics.local import (
    FunctionHost,
    IngestHTTPServer,
    LocalRuntime,
    env_exports,
    function_name_from,
    provision,
)

BUCKET = "lightmetrics-local"
TABLE = "lightmetrics-control"
SECRET = "lightmetrics/ingest-tokens"
ECHO_ARN = "arn:aws:lambda:us-east-1:123456789012:function:echo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def echo(event: Any, context: Any) -> dict[str, Any]:
    return {
        "event": event,
        "function_name": context.function_name,
        "remaining": context.get_remaining_time_in_millis() > 0,
    }


def boom(event: Any, context: Any) -> None:
    raise ValueError("boom")


def local_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("lm-local")}


@pytest.fixture(scope="module")
def runtime() -> Iterator[LocalRuntime]:
    before = local_threads()  # another suite's session runtime may be running too
    rt = LocalRuntime(port=free_port(), functions={"echo": echo, "boom": boom})
    rt.start()
    yield rt
    rt.stop()
    assert local_threads() - before == set(), "runtime threads left behind"


@pytest.fixture(scope="module")
def provisioned(runtime: LocalRuntime) -> dict[str, Any]:
    return provision(runtime, SPEC, bucket=BUCKET, table=TABLE, secret_name=SECRET)


# --------------------------------------------------------------------------- spec


def test_spec_shapes() -> None:
    assert SPEC.bucket.versioned and SPEC.bucket.logical_name == "AuthorityBucket"
    assert SPEC.table.attribute_definitions() == [
        {"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "sk", "AttributeType": "S"},
    ]
    assert [(q.name, q.prefix, q.dlq_name) for q in SPEC.queues] == [
        ("index-accepted", "accepted/v1/", "index-accepted-dlq"),
        ("index-raw-blobs", "raw-blobs/v1/", "index-raw-blobs-dlq"),
        ("index-quarantine", "quarantine/v1/", "index-quarantine-dlq"),
    ]
    assert ResourceSpec().notification_configuration({}) == {}
    assert SPEC.function("ingest").handler_string == "functions.ingest.app.handler"
    q = QueueSpec("idx", "accepted/v1/", "idx-dlq", max_receive_count=3)
    cfg = ResourceSpec(queues=(q,)).notification_configuration({"idx": "arn:q"}, namespace="ns/")
    assert cfg == {
        "QueueConfigurations": [
            {
                "Id": "idx",
                "QueueArn": "arn:q",
                "Events": ["s3:ObjectCreated:*"],
                "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "ns/accepted/v1/"}]}},
            }
        ]
    }
    for bad in (
        '{"current": "k2", "keys": {"k1": "00"}}',
        '{"current": "k1", "keys": {"k1": "xyz"}}',
        "[]",
        '{"current": "a", "keys": {"a": "00", "b": "00", "c": "00"}}',
    ):
        with pytest.raises(ValueError):
            TokenKeys.parse(bad)


def test_env_exports() -> None:
    class RT:
        endpoint_url = "http://127.0.0.1:4566"
        region = "us-east-1"

    lines = env_exports(RT(), {"LM_BUCKET": "b", "table": "t x", "LM_PREFIX": None})
    assert lines == [
        "export AWS_ENDPOINT_URL=http://127.0.0.1:4566",
        "export AWS_DEFAULT_REGION=us-east-1",
        "export AWS_ACCESS_KEY_ID=testing",
        "export AWS_SECRET_ACCESS_KEY=testing",
        "export LM_BUCKET=b",
        "export LM_TABLE='t x'",
    ]
    with pytest.raises(ValueError):
        env_exports(RT(), {"bad;name": 1})


# --------------------------------------------------------------------------- provisioning


def test_bucket_is_versioned(runtime: LocalRuntime, provisioned: dict[str, Any]) -> None:
    s3 = runtime.boto3_client("s3")
    s3.head_bucket(Bucket=BUCKET)
    assert s3.get_bucket_versioning(Bucket=BUCKET)["Status"] == "Enabled"


def test_table_keys_and_ttl(runtime: LocalRuntime, provisioned: dict[str, Any]) -> None:
    ddb = runtime.boto3_client("dynamodb")
    table = ddb.describe_table(TableName=TABLE)["Table"]
    assert table["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    ttl = ddb.describe_time_to_live(TableName=TABLE)["TimeToLiveDescription"]
    assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": "expires_at"}


def test_secret_shape(runtime: LocalRuntime, provisioned: dict[str, Any]) -> None:
    value = runtime.boto3_client("secretsmanager").get_secret_value(SecretId=SECRET)["SecretString"]
    assert value == provisioned["secret_value"]
    doc = json.loads(value)
    assert doc["current"] == "k1" and list(doc["keys"]) == ["k1"]
    assert len(bytes.fromhex(doc["keys"]["k1"])) == 32


def test_provision_is_idempotent(runtime: LocalRuntime, provisioned: dict[str, Any]) -> None:
    # (the spec's state machines have fixed names: created by whichever test of the session ran first)
    assert provisioned["created"][:3] == ["bucket", "table", "secret"]
    assert set(provisioned["created"][3:]) <= {"state-machine:bootstrap-walk", "state-machine:reap"}
    again = provision(runtime, SPEC, bucket=BUCKET, table=TABLE, secret_name=SECRET)
    assert again["created"] == []
    assert again["secret_value"] == provisioned["secret_value"]  # issued tokens stay valid


def test_provision_queues_and_notifications(runtime: LocalRuntime) -> None:
    spec = ResourceSpec(
        queues=(QueueSpec("lm-test-index", "accepted/", "lm-test-index-dlq", max_receive_count=3),)
    )
    clients = {s: runtime.boto3_client(s) for s in ("s3", "dynamodb", "secretsmanager", "sqs")}
    out = provision(
        clients, spec, bucket="lm-test-queues", table="lm-test-queues", secret_name="lm-test-queues"
    )
    q = out["queues"]["lm-test-index"]
    sqs, s3 = clients["sqs"], clients["s3"]
    attrs = sqs.get_queue_attributes(QueueUrl=q["url"], AttributeNames=["All"])["Attributes"]
    assert json.loads(attrs["RedrivePolicy"]) == {"deadLetterTargetArn": q["dlq_arn"], "maxReceiveCount": 3}
    assert attrs["VisibilityTimeout"] == "60"
    s3.put_object(Bucket="lm-test-queues", Key="other/x", Body=b"1")
    s3.put_object(Bucket="lm-test-queues", Key="accepted/a b", Body=b"1")
    keys: list[str] = []
    deadline = time.monotonic() + 10
    while not keys and time.monotonic() < deadline:
        for m in sqs.receive_message(QueueUrl=q["url"], MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            keys += [r["s3"]["object"]["key"] for r in json.loads(m["Body"]).get("Records", [])]
    # Prefix-filtered and URL-encoded (moto's s3:TestEvent has no Records). moto encodes with
    # quote_plus, "/" included ("accepted%2Fa+b"); AWS keeps "/": consumers must unquote_plus.
    assert [unquote_plus(k) for k in keys] == ["accepted/a b"]


# --------------------------------------------------------------------------- through the server


def test_conditional_create_412(runtime: LocalRuntime, provisioned: dict[str, Any]) -> None:
    s3 = runtime.boto3_client("s3")
    s3.put_object(Bucket=BUCKET, Key="accepted/v1/once", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=BUCKET, Key="accepted/v1/once", Body=b"second", IfNoneMatch="*")
    assert err.value.response["Error"]["Code"] == "PreconditionFailed"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert s3.get_object(Bucket=BUCKET, Key="accepted/v1/once")["Body"].read() == b"first"


def test_invoke_runs_in_process_handler(runtime: LocalRuntime) -> None:
    lam = runtime.boto3_client("lambda")
    for name in ("echo", ECHO_ARN, f"{ECHO_ARN}:$LATEST"):
        resp = lam.invoke(FunctionName=name, Payload=json.dumps({"a": [1, "x"]}).encode())
        assert resp["StatusCode"] == 200 and "FunctionError" not in resp
        assert json.loads(resp["Payload"].read()) == {
            "event": {"a": [1, "x"]},
            "function_name": "echo",
            "remaining": True,
        }


def test_invoke_exception_is_unhandled_function_error(runtime: LocalRuntime) -> None:
    resp = runtime.boto3_client("lambda").invoke(FunctionName="boom", Payload=b"{}")
    assert resp["StatusCode"] == 200 and resp["FunctionError"] == "Unhandled"
    body = json.loads(resp["Payload"].read())
    assert body["errorType"] == "ValueError" and body["errorMessage"] == "boom"
    assert isinstance(body["stackTrace"], list) and "raise ValueError" in body["stackTrace"][-1]


def test_other_paths_reach_moto(runtime: LocalRuntime) -> None:
    lam = runtime.boto3_client("lambda")
    assert lam.list_functions()["Functions"] == []  # answered by moto's Lambda
    with pytest.raises(ClientError) as err:
        lam.invoke(FunctionName="not-hosted", Payload=b"{}")
    assert err.value.response["Error"]["Code"] == "ResourceNotFoundException"
    with urllib.request.urlopen(f"{runtime.endpoint_url}/moto-api/config", timeout=5) as resp:
        assert "lambda" in json.loads(resp.read())


def test_function_host_resolves_spec_modules_lazily(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lm_lazy_handler.py").write_text("def handler(event, context):\n    return {'lazy': event}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    downstream = Response("moto", status=418)
    specs = (FunctionSpec("lazy", "lm_lazy_handler"), FunctionSpec("broken", "lm_no_such_module"))
    client = Client(FunctionHost(downstream, specs=specs))
    ok = client.post("/2015-03-31/functions/lazy/invocations", data=b'{"n": 1}')
    assert ok.status_code == 200 and ok.get_json() == {"lazy": {"n": 1}}
    broken = client.post("/2015-03-31/functions/broken/invocations", data=b"")
    assert broken.headers["X-Amz-Function-Error"] == "Unhandled"
    assert broken.get_json()["errorType"] == "Runtime.ImportModuleError"
    assert client.post("/2015-03-31/functions/other/invocations").status_code == 418
    assert client.get("/2015-03-31/functions/lazy/invocations").status_code == 418
    assert function_name_from("arn%3Aaws%3Alambda%3Aus-east-1%3A123456789012%3Afunction%3Alazy") == "lazy"


def test_step_functions_runs_asl_with_lambda_task(runtime: LocalRuntime) -> None:
    sfn = runtime.boto3_client("stepfunctions")
    definition = {
        "StartAt": "Prepare",
        "States": {
            "Prepare": {"Type": "Pass", "Result": {"step": 1}, "Next": "Echo"},
            "Echo": {"Type": "Task", "Resource": ECHO_ARN, "End": True},
        },
    }
    machine = sfn.create_state_machine(
        name="lm-test-echo", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/sfn"
    )["stateMachineArn"]
    execution = sfn.start_execution(stateMachineArn=machine, input="{}")["executionArn"]
    deadline = time.monotonic() + 20
    while (desc := sfn.describe_execution(executionArn=execution))["status"] == "RUNNING":
        assert time.monotonic() < deadline, "execution did not finish"
        time.sleep(0.05)
    assert desc["status"] == "SUCCEEDED", desc
    assert json.loads(desc["output"]) == {"event": {"step": 1}, "function_name": "echo", "remaining": True}
    types = [e["type"] for e in sfn.get_execution_history(executionArn=execution)["events"]]
    assert "LambdaFunctionScheduled" in types and "LambdaFunctionSucceeded" in types


def test_unnamed_executions_get_a_uuid_each_as_in_aws(runtime: LocalRuntime) -> None:
    """Issue 17: ``aws stepfunctions start-execution`` without ``--name`` twice in a row (moto alone
    names both ``None``, and the second fails with ExecutionAlreadyExists)."""
    import uuid

    sfn = runtime.boto3_client("stepfunctions")
    definition = {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}
    machine = sfn.create_state_machine(
        name="lm-test-unnamed", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/sfn"
    )["stateMachineArn"]
    names = [sfn.start_execution(stateMachineArn=machine, input="{}")["executionArn"].rsplit(":", 1)[-1]
             for _ in range(2)]
    assert names[0] != names[1] and all(str(uuid.UUID(n)) == n for n in names)
    named = sfn.start_execution(stateMachineArn=machine, name="mine", input="{}")["executionArn"]
    assert named.endswith(":mine")  # a given name is kept


def test_stop_frees_port_and_threads(runtime: LocalRuntime) -> None:
    before = local_threads()
    port = free_port()
    second = LocalRuntime(port=port).start()
    second.boto3_client("s3").list_buckets()  # leaves an idle keep-alive connection open
    second.stop()
    assert local_threads() - before == set()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    LocalRuntime(port=port).start().stop()  # the same port can be served again at once
    assert local_threads() - before == set()
    # The module runtime's process settings were restored on the way out.
    assert runtime.boto3_client("lambda").invoke(FunctionName="echo", Payload=b"{}")["StatusCode"] == 200


def test_a_served_runtime_process_exits_on_sigterm_without_finalizing(tmp_path: Any) -> None:
    """The demo's moto process (``python -m lightmetrics.local.server``) stops serving on SIGTERM and
    exits 0 at once: the interpreter's finalization (atexit handlers, tearing down moto's modules) is
    skipped; it outlasted the demo's grace under load and the process was then killed."""
    import signal
    import subprocess
    import sys

    from lightmetrics.local.server import RemoteRuntime

    port_file, marker = tmp_path / "port", tmp_path / "finalized"
    code = ("import atexit, sys; atexit.register(lambda: open(sys.argv[2], 'w').write('finalized')); "
            "from lightmetrics.local.server import _serve_main; _serve_main(['0', sys.argv[1]])")
    proc = subprocess.Popen([sys.executable, "-c", code, str(port_file), str(marker)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        remote = RemoteRuntime(f"http://127.0.0.1:{port_file.read_text().strip()}", proc)
        remote.boto3_client("s3").create_bucket(Bucket="served")  # it served
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not marker.exists()


# --------------------------------------------------------------------------- ingest endpoint

LIMIT = 1024


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        self.events.append(event)
        body = {"status": "accepted", "function": context.function_name}
        return {
            "statusCode": 200,
            "headers": {"Content-Type": "application/json", "X-Lm": "1"},
            "body": json.dumps(body),
        }


@pytest.fixture
def ingest() -> Iterator[tuple[IngestHTTPServer, Recorder]]:
    recorder = Recorder()
    server = IngestHTTPServer(recorder, port=free_port(), max_body_bytes=LIMIT, request_timeout_s=5).start()
    yield server, recorder
    server.stop()


def raw_exchange(port: int, data: bytes, timeout: float = 3.0) -> tuple[bytes, float]:
    """Send ``data`` (and no more), read the response until the server closes; (response, seconds)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):  # socket.timeout here would mean the server waited for the body
            chunks.append(chunk)
    return b"".join(chunks), time.monotonic() - start


def test_ingest_post_becomes_function_url_event(ingest: tuple[IngestHTTPServer, Recorder]) -> None:
    server, recorder = ingest
    frame = bytes(range(256))
    req = urllib.request.Request(
        f"{server.url}/v1/frames?a=1&a=2",
        data=frame,
        method="POST",
        headers={
            "X-Lm-Agent-Id": "agent-1",
            "Authorization": "Bearer k1.abc",
            "Content-Type": "application/octet-stream",
        },
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200 and resp.headers["X-Lm"] == "1"
        assert json.loads(resp.read()) == {"status": "accepted", "function": "ingest"}
    (event,) = recorder.events
    assert (
        event["version"] == "2.0"
        and event["rawPath"] == "/v1/frames"
        and event["rawQueryString"] == "a=1&a=2"
    )
    assert event["queryStringParameters"] == {"a": "1,2"}
    assert event["isBase64Encoded"] is True and base64.b64decode(event["body"]) == frame
    assert (
        event["headers"]["x-lm-agent-id"] == "agent-1"
        and event["headers"]["authorization"] == "Bearer k1.abc"
    )
    assert all(k == k.lower() for k in event["headers"])
    http = event["requestContext"]["http"]
    assert http["method"] == "POST" and http["path"] == "/v1/frames" and http["sourceIp"] == "127.0.0.1"


def test_ingest_refuses_oversized_body_without_reading_it(ingest: tuple[IngestHTTPServer, Recorder]) -> None:
    server, recorder = ingest
    # Declares 10 GB but sends 5 bytes: a server that tried to read the body would hang here.
    head = b"POST /v1/frames HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\nhello"
    response, seconds = raw_exchange(server.port, head)
    status_line, _, rest = response.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 413 Request Entity Too Large"
    body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert body["status"] == "invalid" and "exceeds the limit of 1024" in body["reason"]
    assert seconds < 2.0 and recorder.events == []
    # With Expect: 100-continue the client is refused before it is invited to send.
    expect = b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2048\r\n\r\n"
    response, _ = raw_exchange(server.port, expect)
    assert response.startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in response


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (b"Content-Length: 12abc\r\n", b"400"),
        (b"Content-Length: -1\r\n", b"400"),
        (b"Content-Length: 5\r\nContent-Length: 6\r\n", b"400"),
        (b"Transfer-Encoding: chunked\r\n", b"411"),
    ],
)
def test_ingest_refuses_bad_content_length(
    ingest: tuple[IngestHTTPServer, Recorder], headers: bytes, status: bytes
) -> None:
    server, recorder = ingest
    response, _ = raw_exchange(server.port, b"POST / HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert response.split(b" ", 2)[1] == status
    body = json.loads(response.split(b"\r\n\r\n", 1)[1])
    assert (body["status"], body["duplicate"], bool(body["reason"])) == ("invalid", False, True)  # the documented shape
    assert recorder.events == []


def test_ingest_post_without_a_body_reaches_the_handler_with_one_content_type() -> None:
    """Issue 17: ``curl -X POST`` without data sends neither Content-Length nor Transfer-Encoding: an
    empty body (RFC 9112 §6.3), which the handler answers as a Function URL would let it; a handler
    that names ``content-type`` in lower case gets exactly one such header back."""
    events: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        events.append(event)
        return {"statusCode": 400, "headers": {"content-type": "application/json"},
                "body": json.dumps({"status": "invalid", "duplicate": False, "reason": "empty body"})}

    server = IngestHTTPServer(handler, port=free_port(), max_body_bytes=LIMIT, request_timeout_s=5).start()
    try:
        response, _ = raw_exchange(server.port, b"POST /v1/frames HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    finally:
        server.stop()
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.split(b" ", 2)[1] == b"400" and json.loads(body)["duplicate"] is False
    assert [line for line in head.lower().split(b"\r\n") if line.startswith(b"content-type:")] == [
        b"content-type: application/json"]
    assert len(events) == 1 and not events[0].get("body")


def test_ingest_stop_frees_port() -> None:
    before = local_threads()
    server = IngestHTTPServer(Recorder(), port=0).start()
    idle = socket.create_connection(
        ("127.0.0.1", server.port), timeout=2
    )  # an idle client must not block stop()
    time.sleep(0.05)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2.0
    idle.close()
    assert local_threads() - before == set()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()


def test_ingest_handler_results_and_failures() -> None:
    def plain(event: dict[str, Any], context: Any) -> Any:
        if event["rawPath"] == "/crash":
            raise RuntimeError("bug")
        return {"status": "accepted", "body_seen": "body" in event}  # no statusCode: 200 JSON

    with IngestHTTPServer(plain, port=0) as server:
        with urllib.request.urlopen(f"{server.url}/ok", timeout=5) as resp:  # GET: no body, no 411
            assert resp.status == 200 and json.loads(resp.read()) == {
                "status": "accepted",
                "body_seen": False,
            }
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(f"{server.url}/crash", data=b"x"), timeout=5)
        assert err.value.code == 502 and json.loads(err.value.read())["status"] == "unavailable"
