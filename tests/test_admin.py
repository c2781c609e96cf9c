"""The admin function over the local IAM Function URL stand-in: SigV4 checked, then the real handler."""

from __future__ import annotations

import http.client
import json
import uuid
from typing import Any

import pytest
from conftest import FAST, make_frame

from functions.admin import app as admin_app
from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_quarantine
from lightmetrics.local.admin_endpoint import ADMIN_PORT_OFFSET, admin_server
from lightmetrics.local.sigv4 import SigV4Error, sign_headers, verify_sigv4
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.identity import BatchIdentity

T0 = 1_764_000_000_000_000_000


@pytest.fixture
def system(runtime):  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:10]
    s = LocalSystem(runtime, bucket=f"lm-ad-{tag}", table=f"lm-ad-{tag}", secret_name=f"lm-ad/{tag}",
                    queue_name_prefix=f"ad{tag}-", clock=FrozenClock(T0)).provision()
    s.notifications(False)
    yield s
    s.stop()


@pytest.fixture
def admin(system, monkeypatch):  # type: ignore[no-untyped-def]
    """The real functions/admin handler, configured by LM_* like the Lambda, behind the SigV4 check, running
    as the admin function's role with IAM enforced (tests/test_iam_enforced.py)."""
    for name, value in system.environment().items():
        monkeypatch.setenv(name, value)
    admin_app.reset()
    server = admin_server(system.hosted_as("admin", admin_app.handler), port=0).start()  # as the admin role
    yield server
    server.stop()
    admin_app.reset()


def call(server: Any, method: str, path: str, body: bytes = b"", *, secret: str = "testing", sign: bool = True,
         service: str | None = None, send_body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    url = f"{server.url}{path}"
    headers: dict[str, str] = {}
    if sign:
        headers = sign_headers(method, url, body, access_key="testing", secret_key=secret)
        if service:  # re-sign for another service: a valid signature, but not for a Lambda URL
            from botocore.auth import SigV4Auth
            from botocore.awsrequest import AWSRequest
            from botocore.credentials import Credentials

            req = AWSRequest(method=method, url=url, data=body)
            SigV4Auth(Credentials("testing", secret), service, "us-east-1").add_auth(req)
            headers = dict(req.headers.items())
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request(method, path, body=send_body if send_body is not None else body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def _conflict(system: LocalSystem, runtime: Any, agent: str = "agent-adm") -> Any:
    ident = BatchIdentity.create(agent, "boot-1", 0, 9)
    ctx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=system.clock, policy=FAST)
    accept_batch(ctx, ident, make_frame(ident))
    second = accept_batch(ctx, ident, make_frame(ident, variant=0.5))
    index_quarantine(system.work_context(policy=FAST), second.quarantine_key)
    return second


def test_unsigned_or_wrongly_signed_requests_are_refused(system, runtime, admin):  # type: ignore[no-untyped-def]
    _conflict(system, runtime)
    assert call(admin, "GET", "/conflicts", sign=False) == (403, {"Message": "Forbidden"})
    assert call(admin, "GET", "/conflicts", secret="not-the-secret")[0] == 403
    assert call(admin, "GET", "/conflicts", service="s3")[0] == 403
    body = json.dumps({"resolution": "accept_existing", "reason": "r"}).encode()
    tampered = json.dumps({"resolution": "deny_identity", "reason": "r"}).encode()
    cid = call(admin, "GET", "/conflicts")[1]["conflicts"][0]["conflict_id"]
    # signed for one body, sent with another: refused, and nothing was resolved
    assert call(admin, "POST", f"/conflicts/{cid}/resolve", body, send_body=tampered)[0] == 403
    assert call(admin, "GET", f"/conflicts/{cid}")[1]["resolution"] == "unresolved"
    # a correct signature outside the 5-minute window is refused as on AWS
    url = f"{admin.url}/conflicts"
    headers = {k.lower(): v for k, v in sign_headers("GET", url, access_key="testing", secret_key="testing").items()}
    event = {"headers": {**headers, "host": f"{admin.host}:{admin.port}"}, "rawPath": "/conflicts",
             "rawQueryString": "", "requestContext": {"http": {"method": "GET"}}}
    assert verify_sigv4(event, {"testing": "testing"}) == "testing"
    import time

    with pytest.raises(SigV4Error, match="expired"):
        verify_sigv4(event, {"testing": "testing"}, now_s=lambda: time.time() + 600)
    with pytest.raises(SigV4Error, match="unknown access key"):
        verify_sigv4(event, {"someone-else": "testing"})


def test_admin_routes_list_show_resolve_blockers_status(system, runtime, admin):  # type: ignore[no-untyped-def]
    second = _conflict(system, runtime)
    _conflict(system, runtime, agent="agent-other")
    status, page = call(admin, "GET", "/conflicts?status=unresolved&limit=1")
    assert status == 200 and page["count"] == 1 and page["next_token"]
    status, rest = call(admin, "GET", f"/conflicts?status=unresolved&limit=1&next_token={page['next_token']}")
    assert status == 200 and rest["count"] == 1 and rest["next_token"] is None
    status, mine = call(admin, "GET", "/conflicts?agent=agent-adm")
    (entry,) = mine["conflicts"]
    assert entry["quarantine_key"] == second.quarantine_key
    cid = entry["conflict_id"]
    status, shown = call(admin, "GET", f"/conflicts/{cid}")
    assert status == 200 and shown["submitted_frame_sha256"] == second.frame_sha256
    assert shown["accepted_frame_sha256"] == second.existing_frame_sha256 and shown["resolution_record"] is None

    body = json.dumps({"resolution": "deny_identity", "reason": "cloned agent", "whole_agent": False}).encode()
    status, out = call(admin, "POST", f"/conflicts/{cid}/resolve", body)
    assert status == 200 and out["record"]["resolution"] == "deny_identity"
    assert out["record"]["resolved_by"] == "arn:aws:iam::123456789012:user/testing"  # the signer, from the event
    status, again = call(admin, "POST", f"/conflicts/{cid}/resolve", body)
    assert status == 409 and again["status"] == "already_resolved" and again["record"] == out["record"]
    status, deny = call(admin, "GET", "/denylist")
    assert status == 200 and [d["agent_id"] for d in deny["denylist"]] == ["agent-adm"]

    assert call(admin, "GET", "/conflicts?status=bogus")[0] == 400
    unknown = cid[:-1] + ("1" if cid.endswith("0") else "0")
    assert call(admin, "GET", f"/conflicts/{unknown}")[0] == 404
    assert call(admin, "POST", f"/conflicts/{cid}/resolve", b"{not json")[0] == 400
    status, blockers = call(admin, "GET", "/blockers?all=true")
    assert status == 200 and blockers == {"blockers": [], "open": 0}
    status, st = call(admin, "GET", "/status")
    # an unresolved conflict waits for a decision, it is not stuck; the reconciler never ran here (R9)
    assert status == 200 and st["unresolved_conflicts"] == 1 and st["ok"] is False
    assert [c.split(":")[0] for c in st["causes"]] == ["reconciler shard 0 has never run"], st["causes"]
    assert set(st["queues"]) == set(system.settings.queue_urls)


def test_admin_port_convention() -> None:
    assert ADMIN_PORT_OFFSET == 2  # moto on --port, ingest on port + 1, admin on port + 2


def test_sample_events_as_aws_delivers_them(system, runtime, admin):  # type: ignore[no-untyped-def]
    """events/admin/*.json (what a Function URL with IAM auth hands the function) through the handler."""
    from pathlib import Path

    from lightmetrics.local.function_host import LambdaContext

    second = _conflict(system, runtime)
    events = Path(__file__).resolve().parent.parent / "events" / "admin"
    listed = admin_app.handler(json.loads((events / "list-unresolved-conflicts.json").read_text()),
                               LambdaContext("admin"))
    assert listed["statusCode"] == 200
    (entry,) = json.loads(listed["body"])["conflicts"]
    assert entry["quarantine_key"] == second.quarantine_key
    text = (events / "resolve-accept-existing.json").read_text().replace("REPLACE-WITH-CONFLICT-ID",
                                                                       entry["conflict_id"])
    resolved = admin_app.handler(json.loads(text), LambdaContext("admin"))
    assert resolved["statusCode"] == 200
    assert json.loads(resolved["body"])["record"]["resolved_by"] == "arn:aws:iam::123456789012:user/operator"


def test_blocker_route_takes_what_lmctl_blockers_takes(system, admin):  # type: ignore[no-untyped-def]
    """The admin API's blocker route resolves an id as `lmctl blockers` does (one resolver): the short
    id (a start, ≥ 8 hex, of the work key's sha256), a whole work key or its start, or the object
    alone; a start several share is a 400 naming them, a miss a 404 with the closest work keys."""
    from urllib.parse import quote

    from conftest import ident
    from test_event_path import s3_record

    from lightmetrics.cli.short_ids import hex_token
    from lightmetrics.derived.event_path import process_sqs_record
    from lightmetrics.derived.indexing import KIND_ACCEPTED

    ctx = system.work_context(policy=FAST)
    keys = [ctx.codec.accepted(ident(60 + n, agent="agent-" + "z" * 40)) for n in range(3)]
    for key in keys:  # an accepted key with no object behind it: the indexer blocks on it
        process_sqs_record(ctx, s3_record(system.bucket, key), kind=KIND_ACCEPTED, bucket=system.bucket,
                           queue="index-accepted")
    work_keys = sorted(f"{KIND_ACCEPTED}:{k}" for k in keys)
    one = work_keys[0]

    def show(text: str) -> tuple[int, dict[str, Any]]:
        return call(admin, "GET", f"/blockers/{quote(text, safe='')}")

    for given in (hex_token(one)[:16], hex_token(one), one, one[:-2], one.split(":", 1)[1]):
        status, out = show(given)
        assert status == 200 and out["work_key"] == one and out["status"] == "open", (given, status, out)
    status, out = show(f"{KIND_ACCEPTED}:")  # the start of every work key: which one is not guessed
    assert status == 400 and out["status"] == "ambiguous" and out["candidates"] == work_keys, out
    assert all(w in out["reason"] for w in work_keys)
    status, out = show(one[:-3] + one[-2:])  # one character dropped
    assert status == 404 and out["status"] == "not_found" and out["suggestions"][0] == one, out
    assert f"did you mean {one}" in out["reason"]
    status, out = show("0123abcd0123abcd")  # a short id no blocker has
    assert status == 404 and out["status"] == "not_found", out
