"""Security (issue 9 item 4): agent-scoped tokens, key revocation, hostile input, oversize bodies,
and keys built only from validated ids.

"Never writes anything" is measured, not assumed: every S3 request the ingest path makes goes
through the request counter of the ``s3`` fixture client (or, for the HTTP server, moto's own
per-component request count), and the bucket is listed empty at the end.
Fuzzing counts per kind are in ``FUZZ_COUNTS`` (asserted, so the report's numbers are real).
"""

from __future__ import annotations

import json
import random
import socket
import string
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from conftest import T0_NS, ident, make_frame
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from lightmetrics.acceptance.auth import CachedTokenKeys, TokenKeys, mint_token, verify_token
from lightmetrics.acceptance.http_contract import HttpRequest, IngestService
from lightmetrics.protocol.errors import AuthError, InvalidIdentityError
from lightmetrics.protocol.identity import MAX_SEQ, BatchIdentity
from lightmetrics.protocol.keys import PREFIXES, KeyCodec, UtcHour

K1, K2 = "1" * 64, "2" * 64
LIMIT = 4096
REFUSALS = {"invalid", "unauthorized", "denied"}


class Rotatable:
    """The token secret as Secrets Manager would return it, rotatable in place."""

    def __init__(self, keys: dict[str, str], current: str) -> None:
        self.value = {"current": current, "keys": keys}

    def __call__(self) -> dict[str, object]:
        return json.loads(json.dumps(self.value))


@pytest.fixture
def secret() -> Rotatable:
    return Rotatable({"k1": K1, "k2": K2}, "k2")


@pytest.fixture
def service(ctx, secret) -> IngestService:  # type: ignore[no-untyped-def]
    ctx.max_frame_bytes = LIMIT
    return IngestService(ctx, CachedTokenKeys(secret, max_age_s=0))


def keys_of(secret: Rotatable) -> TokenKeys:
    return TokenKeys.parse(secret())


def request(identity: BatchIdentity | None = None, body: bytes | None = None, *, token: str | None = None,
            secret: Rotatable | None = None, method: str = "POST", **headers: str | None) -> HttpRequest:
    identity = identity or ident(1)
    if token is None and secret is not None:
        token = mint_token(keys_of(secret), identity.agent_id)
    h: dict[str, str | None] = {
        "x-lm-agent-id": identity.agent_id, "x-lm-boot-id": identity.boot_id,
        "x-lm-seq-start": str(identity.seq_start), "x-lm-seq-end": str(identity.seq_end),
        "authorization": f"Bearer {token}" if token is not None else None,
    }
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    return HttpRequest(method, {k: v for k, v in h.items() if v is not None},
                       make_frame(identity) if body is None else body)


def refused_without_io(service: IngestService, counter, req: HttpRequest, statuses: set[int]) -> int:  # type: ignore[no-untyped-def]
    before = sum(counter.totals.values())
    resp = service.handle(req)
    assert resp.status in statuses, (resp.status, resp.body, req.headers)
    assert resp.body["status"] in REFUSALS and resp.body.get("reason"), resp.body
    assert sum(counter.totals.values()) == before, f"a refused request made S3 requests: {req.headers}"
    return resp.status


# --------------------------------------------------------------------------- tokens


def test_a_token_for_agent_a_is_refused_for_agent_b(service, secret, counter, s3, bucket):  # type: ignore[no-untyped-def]
    keys = keys_of(secret)
    a, b = ident(1, agent="agent-a"), ident(1, agent="agent-b")
    for kid in ("k1", "k2"):  # both active keys: a rotation must not widen a token's scope
        token_a = mint_token(keys, "agent-a", kid)
        verify_token(keys, token_a, "agent-a")
        with pytest.raises(AuthError) as refused:
            verify_token(keys, token_a, "agent-b")
        assert refused.value.status == 403
        assert refused_without_io(service, counter, request(b, token=token_a), {403}) == 403
        # ... also when the frame is agent A's own, only the headers claim B
        assert refused_without_io(service, counter, request(b, make_frame(a), token=token_a), {403}) == 403
    # The same service accepts A's own request: the refusals above were about scope, not set-up.
    assert service.handle(request(a, token=mint_token(keys, "agent-a"))).status == 200
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 2  # blob + manifest of A only


def test_a_revoked_key_is_refused(service, secret, counter, s3, bucket):  # type: ignore[no-untyped-def]
    old = mint_token(keys_of(secret), "agent-a", "k1")
    assert service.handle(request(ident(1), token=old)).status == 200
    secret.value = {"current": "k2", "keys": {"k2": K2}}  # k1 removed from the secret
    with pytest.raises(AuthError) as refused:
        verify_token(keys_of(secret), old, "agent-a")
    assert refused.value.status == 401 and "not active" in str(refused.value)
    # a new batch and a retry of the accepted one: both refused before any S3 request
    assert refused_without_io(service, counter, request(ident(2), token=old), {401}) == 401
    assert refused_without_io(service, counter, request(ident(1), token=old), {401}) == 401
    assert service.handle(request(ident(2), secret=secret)).status == 200  # k2 tokens still work
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 4


def test_revocation_through_secrets_manager_and_the_lambda_handler(runtime, bucket, monkeypatch):  # type: ignore[no-untyped-def]
    """The deployed path: the key is removed from the Secrets Manager secret; the handler refuses."""
    import base64

    from functions.ingest import app
    from lightmetrics.local.function_host import LambdaContext

    sm = runtime.boto3_client("secretsmanager")
    name = f"lm-sec/{uuid.uuid4().hex[:8]}"
    sm.create_secret(Name=name, SecretString=json.dumps({"current": "k1", "keys": {"k1": K1, "k2": K2}}))
    for k, v in {"LM_BUCKET": bucket, "LM_AUTH_SECRET_ID": name, "LM_SECRET_CACHE_S": "0",
                 "LM_COLLECTOR_ID": "collector-sec"}.items():
        monkeypatch.setenv(k, v)
    app.reset()
    keys = TokenKeys(current="k1", keys={"k1": K1, "k2": K2})

    def call(i: BatchIdentity, token: str) -> tuple[int, dict]:
        event = {"version": "2.0", "requestContext": {"http": {"method": "POST"}}, "isBase64Encoded": True,
                 "headers": {"x-lm-agent-id": i.agent_id, "x-lm-boot-id": i.boot_id,
                             "x-lm-seq-start": str(i.seq_start), "x-lm-seq-end": str(i.seq_end),
                             "authorization": f"Bearer {token}"},
                 "body": base64.b64encode(make_frame(i)).decode()}
        out = app.handler(event, LambdaContext("ingest"))
        return out["statusCode"], json.loads(out["body"])

    try:
        assert call(ident(1), mint_token(keys, "agent-a", "k1"))[0] == 200
        status, body = call(ident(2, agent="agent-b"), mint_token(keys, "agent-a", "k2"))
        assert (status, body["status"]) == (403, "unauthorized")  # the token is rejected, not the identity
        sm.put_secret_value(SecretId=name, SecretString=json.dumps({"current": "k2", "keys": {"k2": K2}}))
        status, body = call(ident(3), mint_token(keys, "agent-a", "k1"))
        assert (status, body["status"]) == (401, "unauthorized")
        assert call(ident(3), mint_token(keys, "agent-a", "k2"))[0] == 200
    finally:
        app.reset()
    keys_written = [o["Key"] for o in runtime.boto3_client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert len(keys_written) == 4 and not any(ident(2, agent="agent-b").agent_hex in k for k in keys_written)


# --------------------------------------------------------------------------- hostile input

FUZZ_COUNTS: Counter[str] = Counter()


def hostile_requests(secret: Rotatable) -> Iterator[tuple[str, HttpRequest, set[int]]]:
    """(kind, request, allowed statuses) — deterministic (seeded), many per kind."""
    rng = random.Random(20261126)
    good = ident(7)
    frame = make_frame(good)
    keys = keys_of(secret)
    token = mint_token(keys, good.agent_id)

    for _ in range(1000):
        body = rng.randbytes(rng.randrange(0, 600))
        if body.startswith(b"LMF1"):
            continue
        yield "random_bytes", request(good, body, token=token), {400}
    for _ in range(100):  # random bytes behind a valid magic
        yield "random_after_magic", request(good, b"LMF1" + rng.randbytes(rng.randrange(0, 400)), token=token), {400}
    for n in range(len(frame)):
        yield "truncation", request(good, frame[:n], token=token), {400}
    for _ in range(1000):
        pos, bit = rng.randrange(len(frame)), 1 << rng.randrange(8)
        flipped = bytearray(frame)
        flipped[pos] ^= bit
        yield "bit_flip", request(good, bytes(flipped), token=token), {400}
    for extra in (b"\x00", b"junk", frame, rng.randbytes(100)):
        yield "trailing_bytes", request(good, frame + extra, token=token), {400}
    yield "oversize", request(good, frame + b"\x00" * LIMIT, token=token), {413}
    yield "oversize", request(good, b"\x00" * (LIMIT + 1), token=token), {413}

    bad_ids = ["", "a/b", "../../etc/passwd", "/", "x\r\nx-lm-agent-id: other", "a\x00b", "\x1b[31mred", "tab\there",
               "nel\u0085", "del\x7f", "é" * 65, "a" * 129, "\ud800", "\x9f"]
    odd_but_valid_ids = ["..", ".", "%2e%2e%2f", "..\\..\\windows", "agent=evil", "a b", "\u202egnp.exe", "😀" * 32,
                         "*", "?", "#", "\u2028", "ﬁ", "NUL"]
    for value in bad_ids:
        for header in ("agent_id", "boot_id"):
            req = request(good, token=token)
            headers = dict(req.headers)
            headers[f"x-lm-{header.replace('_', '-')}"] = value
            yield "header_injection", HttpRequest("POST", headers, frame), {400}
    for value in odd_but_valid_ids:
        # a valid id with a token for it: the frame binds a different identity, so still a 400
        odd = BatchIdentity.create(value, "boot-1", 70, 79)
        yield "odd_valid_id", request(odd, frame, token=mint_token(keys, value)), {400}
        yield "odd_valid_id", request(odd, rng.randbytes(64), token=mint_token(keys, value)), {400}
    bad_seqs = ["-1", "+1", "1e3", "0x10", str(MAX_SEQ + 1), "9" * 100, " 5", "5 ", "٣", "5_000", "", "1.0",
                "١٢", "0b1", "∞", "NaN", "5\r\n"]
    for value in bad_seqs:
        for header in ("x-lm-seq-start", "x-lm-seq-end"):
            headers = dict(request(good, token=token).headers)
            headers[header] = value
            yield "seq_number", HttpRequest("POST", headers, frame), {400}
    hi = BatchIdentity.create("agent-a", "boot-1", MAX_SEQ, MAX_SEQ)
    yield "seq_number", request(hi, frame, token=token), {400}  # valid u64 max, frame of another identity
    headers = dict(request(good, token=token).headers)
    headers["x-lm-seq-start"], headers["x-lm-seq-end"] = "10", "5"
    yield "seq_number", HttpRequest("POST", headers, frame), {400}
    for missing in ("x-lm-agent-id", "x-lm-boot-id", "x-lm-seq-start", "x-lm-seq-end", "authorization"):
        headers = {k: v for k, v in request(good, token=token).headers.items() if k != missing}
        yield "missing_header", HttpRequest("POST", headers, frame), {400, 401}
    yield "missing_header", HttpRequest("POST", {}, frame), {400, 401}
    yield "missing_header", HttpRequest("POST", {}, b""), {400, 401}
    other_agent = mint_token(keys, "agent-other")
    for auth in ("", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer k1", f"Bearer k1.{'a' * 63}",
                 f"Bearer kX.{'a' * 64}", f"Bearer k1.{'A' * 64}", f"Bearer k1.{'a' * 10_000}", "Bearer ../k1",
                 f"Bearer {token} extra", f"Bearer {other_agent}", f"Token {token}", "Bearer k1.\u0661" * 3,
                 f"Bearer {'k' * 65}.{'a' * 64}"):
        headers = dict(request(good, token=token).headers)
        headers["authorization"] = auth
        yield "authorization", HttpRequest("POST", headers, frame), {401, 403}
    for method in ("GET", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS", "post", ""):
        yield "method", request(good, frame, token=token, method=method), {405}
    for enc in ("gzip", "br", "deflate", "zstd", "identity, gzip"):
        yield "content_encoding", request(good, frame, token=token, content_encoding=enc), {400}
    for _ in range(500):  # random printable/unicode/control junk in every header at once
        junk = lambda: "".join(rng.choice(string.printable + "\x00\x7f\u0085é/..") for _ in range(rng.randrange(0, 40)))  # noqa: E731
        headers = {h: junk() for h in ("x-lm-agent-id", "x-lm-boot-id", "x-lm-seq-start", "x-lm-seq-end",
                                      "authorization")}
        yield "random_headers", HttpRequest("POST", headers, rng.randbytes(rng.randrange(0, 200))), {400, 401}


def test_hostile_frames_and_headers_never_crash_and_never_write(service, secret, counter, s3, bucket):  # type: ignore[no-untyped-def]
    FUZZ_COUNTS.clear()
    for kind, req, statuses in hostile_requests(secret):
        refused_without_io(service, counter, req, statuses)
        FUZZ_COUNTS[kind] += 1
    assert sum(counter.totals.values()) == 0
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    # enough of each kind to mean something (the report quotes these numbers)
    assert FUZZ_COUNTS["random_bytes"] >= 990 and FUZZ_COUNTS["bit_flip"] == 1000
    assert FUZZ_COUNTS["truncation"] > 100 and FUZZ_COUNTS["header_injection"] == 28
    assert sum(FUZZ_COUNTS.values()) > 2900, dict(FUZZ_COUNTS)
    print("fuzz counts:", dict(FUZZ_COUNTS), "total", sum(FUZZ_COUNTS.values()))


HEADER_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from("/.\r\n\x00"),
                      max_size=140)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(agent=HEADER_TEXT, boot=HEADER_TEXT, start=st.one_of(HEADER_TEXT, st.integers(-5, 2**70).map(str)),
       end=st.one_of(HEADER_TEXT, st.integers(-5, 2**70).map(str)), body=st.binary(max_size=300),
       minted=st.booleans())
def test_generated_headers_never_crash_and_never_write(service, secret, counter, agent, boot, start, end, body,  # type: ignore[no-untyped-def]
                                                       minted):
    token = mint_token(keys_of(secret), agent) if minted else "k1." + "0" * 64
    headers = {"x-lm-agent-id": agent, "x-lm-boot-id": boot, "x-lm-seq-start": start, "x-lm-seq-end": end,
               "authorization": f"Bearer {token}"}
    refused_without_io(service, counter, HttpRequest("POST", headers, body), {400, 401, 403})
    FUZZ_COUNTS["hypothesis_headers"] += 1


def test_malformed_lambda_events_are_answered_not_crashed(runtime, bucket, monkeypatch):  # type: ignore[no-untyped-def]
    from functions.ingest import app
    from lightmetrics.local.function_host import LambdaContext

    monkeypatch.setenv("LM_BUCKET", bucket)
    app.reset()
    s3_before = runtime.request_count("s3", "ingest")
    events = [
        {"version": "2.0", "requestContext": {"http": {"method": "POST"}}, "isBase64Encoded": True, "body": "%%%"},
        {"version": "2.0", "requestContext": {"http": {"method": "POST"}}, "isBase64Encoded": True, "body": "QQ"},
        {"version": "2.0", "requestContext": {"http": {"method": "POST"}}, "headers": None, "body": None},
        {"version": "2.0", "requestContext": {"http": {"method": "POST"}}, "headers": {"x-lm-agent-id": "a"},
         "body": "not a frame"},
        {"httpMethod": "POST", "headers": {"X-Lm-Agent-Id": "../x"}, "body": "", "isBase64Encoded": False},
    ]
    try:
        for event in events:
            out = app.handler(event, LambdaContext("ingest"))
            assert out["statusCode"] in (400, 401), (event, out)
            FUZZ_COUNTS["lambda_event"] += 1
    finally:
        app.reset()
    assert runtime.request_count("s3", "ingest") == s3_before


# --------------------------------------------------------------------------- oversize at the local server


def test_local_server_refuses_oversize_with_413_before_reading_the_body(runtime, bucket, monkeypatch):  # type: ignore[no-untyped-def]
    """The real ingest handler behind the local HTTP endpoint: the client declares a body one byte
    over the limit and sends none of it; a server that read before deciding would wait forever."""
    from functions.ingest import app
    from lightmetrics.local.ingest_endpoint import IngestHTTPServer

    sm = runtime.boto3_client("secretsmanager")
    name = f"lm-sec/{uuid.uuid4().hex[:8]}"
    sm.create_secret(Name=name, SecretString=json.dumps({"current": "k1", "keys": {"k1": K1}}))
    for k, v in {"LM_BUCKET": bucket, "LM_AUTH_SECRET_ID": name, "LM_MAX_FRAME_BYTES": str(LIMIT)}.items():
        monkeypatch.setenv(k, v)
    app.reset()
    s3_before = runtime.request_count("s3", "ingest")
    good = ident(1)
    token = mint_token(TokenKeys(current="k1", keys={"k1": K1}), good.agent_id)
    try:
        with IngestHTTPServer(app.handler, port=0, max_body_bytes=LIMIT, request_timeout_s=5) as server:
            for declared in (LIMIT + 1, 10**12):
                with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                    sock.sendall((f"POST /v1/frames HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n"
                                  f"Authorization: Bearer {token}\r\nX-Lm-Agent-Id: {good.agent_id}\r\n\r\n").encode())
                    response = _read_response(sock)  # no body byte was sent: an answer proves it was not read
                assert response.startswith(b"HTTP/1.1 413 "), response[:200]
                assert json.loads(response.split(b"\r\n\r\n", 1)[1])["status"] == "invalid"
            assert runtime.request_count("s3", "ingest") == s3_before
            # the same server accepts a frame within the limit: the refusal was the limit, not the wiring
            import urllib.request

            body = make_frame(good)
            req = urllib.request.Request(server.url + "/v1/frames", data=body, method="POST", headers={
                "Authorization": f"Bearer {token}", "X-Lm-Agent-Id": good.agent_id, "X-Lm-Boot-Id": good.boot_id,
                "X-Lm-Seq-Start": str(good.seq_start), "X-Lm-Seq-End": str(good.seq_end)})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200 and json.loads(resp.read())["status"] == "accepted"
    finally:
        app.reset()
    assert runtime.request_count("s3", "ingest") == s3_before + 2


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


# --------------------------------------------------------------------------- keys from validated ids only

VALID_ID = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")).filter(
    lambda c: c != "/" and not 0x7F <= ord(c) <= 0x9F), min_size=1, max_size=40).filter(
    lambda s: len(s.encode()) <= 128)
SEQ = st.integers(0, MAX_SEQ)
SHA = st.binary(min_size=32, max_size=32).map(bytes.hex)
KEY_CHARS = set("0123456789abcdef") | set("=/.-_") | set(string.ascii_lowercase) | set(string.digits)


@hsettings(max_examples=400, deadline=None)
@given(agent=VALID_ID, boot=VALID_ID, a=SEQ, b=SEQ, sha=SHA, prefix=st.sampled_from(["", "lm/", "team-a/lm/"]))
def test_keys_never_escape_their_prefix(agent, boot, a, b, sha, prefix):  # type: ignore[no-untyped-def]
    identity = BatchIdentity.create(agent, boot, min(a, b), max(a, b))
    codec = KeyCodec(prefix)
    hour = UtcHour.of_unix_ns(T0_NS)
    built = {
        "accepted": codec.accepted(identity),
        "accepted-by-time": codec.accepted_by_time(hour, identity),
        "accepted-by-blob": codec.accepted_by_blob(sha, identity),
        "quarantine": codec.quarantine(identity, sha),
        "quarantine-by-blob": codec.quarantine_by_blob(sha, identity),
        "conflict-resolution": codec.conflict_resolution(identity, sha),
        "raw-blob": codec.raw_blob(sha),
        "raw-blobs-by-time": codec.raw_blobs_by_time(hour, sha),
    }
    for name, key in built.items():
        assert key.startswith(prefix) and any(key[len(prefix):].startswith(p) for p in PREFIXES.values()), key
        rest = key[len(prefix):]
        segments = rest.split("/")
        assert "" not in segments and "." not in segments and ".." not in segments, key
        assert ".." not in rest and set(rest) <= KEY_CHARS, (name, key)
        if name in ("accepted", "quarantine", "accepted-by-blob", "quarantine-by-blob", "conflict-resolution"):
            assert f"/agent={identity.agent_hex}/boot={identity.boot_hex}/" in key
        parsed = codec.parse(key)
        if parsed.identity is not None:
            assert parsed.identity == identity
    FUZZ_COUNTS["key_codec_valid"] += 1


BAD_ID = st.one_of(
    st.text(min_size=1, max_size=20).map(lambda s: s + "/" + s),
    st.text(min_size=0, max_size=5).map(lambda s: s + chr(0x1F) + s),
    st.sampled_from(["\x00", "\x7f", "\x85", "\x9f", "a\nb"]),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=129, max_size=200).filter(
        lambda s: "/" not in s),
    st.just(""),
)


@hsettings(max_examples=300, deadline=None)
@given(bad=BAD_ID, where=st.sampled_from(["agent", "boot"]))
def test_invalid_ids_never_become_keys(bad, where):  # type: ignore[no-untyped-def]
    args = ("agent-a", "boot-1") if where == "boot" else (bad, "boot-1")
    args = (args[0], bad) if where == "boot" else args
    with pytest.raises(InvalidIdentityError):
        BatchIdentity.create(*args, 0, 9)
    FUZZ_COUNTS["key_codec_invalid"] += 1
