"""The agent client (issue 8 item 4): spool, failover, backoff, parking, auth stops, crash safety.

Against the real ingest service over HTTP (IngestHTTPServer + IngestService on the session's
moto server), and, for answers that server cannot give on demand (503/429 in sequence, a slow
answer), a scripted ingest endpoint double: a real HTTP server in a thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import T0_NS, make_frame

from lightmetrics.acceptance.accept import RESOLUTION_METADATA_KEY, accept_batch
from lightmetrics.acceptance.auth import CachedTokenKeys, TokenKeys, mint_token
from lightmetrics.acceptance.http_contract import IngestService, parse_lambda_event
from lightmetrics.client import (
    AgentClient,
    Alert,
    AuthRejected,
    BackoffPolicy,
    Spool,
    SpoolConflictError,
    identity_from_spool_name,
)
from lightmetrics.local.ingest_endpoint import IngestHTTPServer
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.manifests import AcceptedBatchManifest

KEYS = TokenKeys.generate("k1")
AGENT = "agent-A.1"
TOKEN = mint_token(KEYS, AGENT)
LMCTL = [shutil.which("lmctl") or os.path.join(os.path.dirname(sys.executable), "lmctl")]


def ident(n: int, boot: str = "boot-1") -> BatchIdentity:
    return BatchIdentity.create(AGENT, boot, n * 10, n * 10 + 9)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- the real ingest
class RealIngest:
    """IngestService behind IngestHTTPServer; ``hold_request`` pauses one answer (after accepting)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.service = IngestService(ctx, CachedTokenKeys(KEYS.model_dump_json))
        self.requests = 0
        self.hold_request: int | None = None
        self.holding = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.server = IngestHTTPServer(self, port=0, max_body_bytes=ctx.max_frame_bytes)

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        with self.lock:
            self.requests += 1
            n = self.requests
        response = self.service.handle(parse_lambda_event(event)).to_lambda()
        if n == self.hold_request:  # accepted in S3; the answer waits (the client is killed meanwhile)
            self.holding.set()
            self.release.wait(30)
        return response


@pytest.fixture
def real(ctx) -> Iterator[RealIngest]:  # type: ignore[no-untyped-def]
    ingest = RealIngest(ctx)
    ingest.server.start()
    yield ingest
    ingest.release.set()
    ingest.server.stop()


def manifest(ctx: Any, identity: BatchIdentity) -> AcceptedBatchManifest | None:
    raw = ctx.store.get(ctx.codec.accepted(identity))
    return AcceptedBatchManifest.from_bytes(raw) if raw is not None else None


# ---------------------------------------------------------------------- scripted endpoint double
class ScriptedIngest:
    """An ingest endpoint double: each POST gets the next scripted step
    (``{"status": 503, "headers": {...}, "body": {...}, "delay_s": 0}``), then 200 accepted."""

    def __init__(self, steps: list[dict[str, Any]]) -> None:
        self.steps = list(steps)
        self.requests: list[tuple[dict[str, str], bytes]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                step = owner.steps.pop(0) if owner.steps else {"status": 200}
                time.sleep(step.get("delay_s", 0))
                default = {"status": "accepted", "duplicate": False, "frame_sha256": sha(body)}
                payload = json.dumps(step.get("body", default if step["status"] == 200 else
                                              {"status": "unavailable"})).encode()
                try:
                    self.send_response(step["status"])
                    for k, v in step.get("headers", {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (timeout): routine

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A bound port that does not listen: connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def client(spool: Path, endpoints: list[str], **kw: Any) -> AgentClient:
    kw.setdefault("sleep", lambda s: None)
    kw.setdefault("rng", random.Random(1))
    kw.setdefault("token", TOKEN)
    return AgentClient(agent_id=AGENT, endpoints=endpoints, spool=spool, **kw)


# ---------------------------------------------------------------------------------------- tests
def test_200_deletes_only_the_confirmed_batch_and_spool_keeps_exact_bytes(real: RealIngest, tmp_path: Path) -> None:
    c = client(tmp_path, [real.server.url])
    frames = {ident(n): make_frame(ident(n), compress=n % 2 == 1) for n in range(3)}
    for i, data in frames.items():
        batch = c.enqueue(i, data)
        assert batch.path.read_bytes() == data  # the exact bytes, never re-encoded
        assert batch.path.name == f"agent={i.agent_hex}.boot={i.boot_hex}.{i.seq_range}.lmframe"
        assert identity_from_spool_name(batch.path.name) == i
    assert c.enqueue(ident(0), frames[ident(0)]).path.exists()  # same bytes: idempotent
    with pytest.raises(SpoolConflictError):
        c.enqueue(ident(0), make_frame(ident(0), variant=1.0))  # never a local identity conflict
    assert [b.identity for b in c.pending()] == list(frames)  # send order = sequence order

    report = c.run_once()
    assert (report.accepted, report.duplicates, report.pending, report.parked) == (3, 0, 0, 0)
    assert [o.identity for o in report.outcomes] == list(frames)
    for i, data in frames.items():
        m = manifest(real.ctx, i)
        assert m is not None and m.frame_sha256 == sha(data) and m.frame_bytes == len(data)
    assert not list(tmp_path.glob("*.lmframe"))

    c.enqueue(ident(1), frames[ident(1)])  # at-least-once: sent again -> duplicate -> deleted
    again = c.run_once()
    assert (again.duplicates, again.pending) == (1, 0)


def test_503_and_429_are_retried_with_jittered_backoff(tmp_path: Path) -> None:
    srv = ScriptedIngest([{"status": 503}, {"status": 429, "headers": {"Retry-After": "5"},
                                            "body": {"message": "Rate Exceeded."}}, {"status": 200}])
    sleeps: list[float] = []
    policy = BackoffPolicy(base_s=0.1, max_s=10.0, max_attempts=5)
    try:
        c = client(tmp_path, [srv.url], sleep=sleeps.append, rng=random.Random(3), backoff=policy)
        data = make_frame(ident(0))
        c.enqueue(ident(0), data)
        report = c.run_once()
    finally:
        srv.stop()
    expected_rng = random.Random(3)
    first = policy.delay(0, expected_rng)
    assert sleeps == [first, 5.0]  # full jitter below 0.1 s, then the Retry-After hint (over the 0.2 s cap)
    assert 0 <= first <= 0.1
    assert report.accepted == 1 and report.pending == 0
    assert report.answers == {"unavailable": 1, "http-429": 1, "accepted": 1}
    assert [body for _, body in srv.requests] == [data] * 3
    headers = srv.requests[0][0]
    assert (headers["x-lm-agent-id"], headers["x-lm-boot-id"], headers["x-lm-seq-start"], headers["x-lm-seq-end"]) \
        == (AGENT, "boot-1", "0", "9")
    assert headers["authorization"] == f"Bearer {TOKEN}"


def test_exhausted_attempts_keep_the_batch_and_end_the_pass(tmp_path: Path) -> None:
    srv = ScriptedIngest([{"status": 503}] * 3)
    sleeps: list[float] = []
    try:
        c = client(tmp_path, [srv.url], sleep=sleeps.append, backoff=BackoffPolicy(base_s=0.1, max_attempts=3))
        for n in range(2):
            c.enqueue(ident(n), make_frame(ident(n)))
        report = c.run_once()
    finally:
        srv.stop()
    assert report.exhausted and report.pending == 2 and len(srv.requests) == 3  # batch 1 not tried
    assert len(sleeps) == 2 and [o.action for o in report.outcomes] == ["unavailable"]


def test_timeout_is_retried(tmp_path: Path) -> None:
    srv = ScriptedIngest([{"status": 200, "delay_s": 1.0}])
    try:
        c = client(tmp_path, [srv.url], request_timeout_s=0.3)
        c.enqueue(ident(0), make_frame(ident(0)))
        report = c.run_once()
    finally:
        srv.stop()
    assert report.timeouts == 1 and report.accepted == 1 and report.pending == 0
    assert len(srv.requests) == 2


def test_failover_to_second_endpoint_when_first_refuses(real: RealIngest, tmp_path: Path, refused_url: str) -> None:
    sleeps: list[float] = []
    c = client(tmp_path, [refused_url, real.server.url], sleep=sleeps.append)
    for n in range(3):
        c.enqueue(ident(n), make_frame(ident(n)))
    report = c.run_once()
    assert report.accepted == 3 and report.pending == 0
    assert report.failovers == 1 and report.network_errors == 1  # then it stays on the live endpoint
    assert sleeps == []  # another endpoint was up: no backoff
    assert c.endpoint_index == 1


def test_idle_keep_alive_connection_closed_by_server_is_not_an_outage(real: RealIngest, tmp_path: Path) -> None:
    real.server.stop()
    real.server = IngestHTTPServer(real, port=0, request_timeout_s=0.2).start()  # closes idle connections fast
    c = client(tmp_path, [real.server.url])
    c.enqueue(ident(0), make_frame(ident(0)))
    assert c.run_once().accepted == 1
    time.sleep(0.5)  # the server has closed the kept-alive connection meanwhile
    c.enqueue(ident(1), make_frame(ident(1)))
    report = c.run_once()
    assert report.accepted == 1 and report.network_errors == 0 and report.attempts == 1


def test_all_endpoints_down_backs_off_per_round(tmp_path: Path, refused_url: str) -> None:
    sleeps: list[float] = []
    c = client(tmp_path, [refused_url, refused_url], sleep=sleeps.append, backoff=BackoffPolicy(max_attempts=6))
    c.enqueue(ident(0), make_frame(ident(0)))
    report = c.run_once()
    assert report.exhausted and report.pending == 1 and report.network_errors == 6
    assert len(sleeps) == 2  # one pause per round of two endpoints (none after the last)
    assert [b.read_bytes() for b in c.pending()] == [make_frame(ident(0))]


def test_drain_gives_up_at_its_timeout_without_overrunning_it(tmp_path: Path, refused_url: str) -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    c = client(tmp_path, [refused_url], sleep=sleep, monotonic=lambda: now[0],
               backoff=BackoffPolicy(base_s=1.0, max_s=8.0, max_attempts=4))
    c.enqueue(ident(0), make_frame(ident(0)))
    report = c.drain(timeout_s=20)
    assert report.timed_out and report.pending == 1 and report.passes >= 2
    assert now[0] <= 20 and sum(sleeps) == now[0]  # every pause fitted inside the timeout
    assert [b.read_bytes() for b in c.pending()] == [make_frame(ident(0))]


def test_conflict_is_parked_later_batches_continue_and_accept_existing_drops_it(
    real: RealIngest, tmp_path: Path
) -> None:
    ctx = real.ctx
    accepted = make_frame(ident(1))
    assert accept_batch(ctx, ident(1), accepted).status.value == "accepted"  # another copy won earlier
    alerts: list[Alert] = []
    clock = FrozenClock(T0_NS)
    c = client(tmp_path, [real.server.url], on_alert=alerts.append, clock=clock, parked_retry_s=600)
    conflicting = make_frame(ident(1), variant=0.5)
    for n, data in ((0, make_frame(ident(0))), (1, conflicting), (2, make_frame(ident(2)))):
        c.enqueue(ident(n), data)

    report = c.run_once()
    assert [(o.identity, o.action) for o in report.outcomes] == [
        (ident(0), "accepted"), (ident(1), "parked"), (ident(2), "accepted")]
    assert (report.pending, report.parked, report.parked_conflicts) == (0, 1, 1)
    assert [(a.kind, a.identity, a.http_status, a.resolution) for a in alerts] == [
        ("parked", ident(1), 409, "unresolved")]
    [parked] = c.parked()
    assert parked.read_bytes() == conflicting and parked.frame_sha256 == sha(conflicting)
    side = json.loads(parked.sidecar_path.read_text())
    assert side["kind"] == "identity_conflict" and side["http_status"] == 409 and side["resolution"] == "unresolved"
    assert side["first_attempt_unix_ns"] == side["last_attempt_unix_ns"] == T0_NS
    assert side["response"]["existing_frame_sha256"] == sha(accepted)
    assert ctx.store.get(side["response"]["quarantine_key"]) is not None  # the evidence exists
    assert manifest(ctx, ident(1)).frame_sha256 == sha(accepted)  # type: ignore[union-attr]

    before = real.requests
    assert c.run_once().outcomes == [] and real.requests == before  # not due: the slow cadence
    clock.advance(600)
    due = c.run_once()
    assert [o.action for o in due.outcomes] == ["kept_parked"] and real.requests == before + 1
    assert c.parked()[0].attempts == 2 and c.parked()[0].last_attempt_unix_ns == T0_NS + 600 * 10**9

    # The operator keeps the accepted version (the resolution record ingest HEADs, §14).
    key = ctx.codec.conflict_resolution(ident(1), sha(conflicting))
    ctx.store.client.put_object(Bucket=ctx.store.bucket, Key=key, Body=b"{}",
                                Metadata={RESOLUTION_METADATA_KEY: "accept_existing"})
    dropped = c.retry_parked()  # now, whatever the cadence
    assert [o.action for o in dropped.outcomes] == ["dropped"] and dropped.parked == 0
    assert c.parked() == [] and not list((tmp_path / "parked").iterdir())
    assert [(a.kind, a.resolution) for a in alerts[1:]] == [("dropped", "accept_existing")]
    assert manifest(ctx, ident(1)).frame_sha256 == sha(accepted)  # type: ignore[union-attr]


def test_invalid_answer_is_parked_and_not_retried_by_default(real: RealIngest, tmp_path: Path) -> None:
    alerts: list[Alert] = []
    c = client(tmp_path, [real.server.url], on_alert=alerts.append, validate_frames=False)
    c.enqueue(ident(0), make_frame(ident(5)))  # the frame names another identity: 400
    c.enqueue(ident(1), make_frame(ident(1)))
    report = c.run_once()
    assert [o.action for o in report.outcomes] == ["parked", "accepted"]
    assert (report.parked, report.parked_conflicts, report.parked_invalid) == (1, 0, 1)
    [p] = c.parked()
    assert (p.kind, p.http_status, p.status) == ("invalid", 400, "invalid") and "does not match" in (p.reason or "")
    assert alerts[0].kind == "parked" and alerts[0].parked_kind == "invalid"
    assert c.retry_parked().outcomes == []  # invalid ones wait for an operator
    assert [o.action for o in c.retry_parked(include_invalid=True).outcomes] == ["kept_parked"]


def test_non_ascii_ids_travel_percent_encoded_end_to_end(real: RealIngest, tmp_path: Path) -> None:
    """Issue 17 (protocol §7): a UTF-8 agent and boot id go in the X-Lm-* headers as
    ``UTF-8''<percent-encoded>``; ingest reads the same identity back, checks the token minted for
    it, and accepts; the record names the ids as they are."""
    agent, boot = "agent-\u00e9-\u65e5\u672c", "boot-\u65e5"
    c = AgentClient(agent_id=agent, endpoints=[real.server.url], spool=tmp_path, token=mint_token(KEYS, agent),
                    sleep=lambda s: None, rng=random.Random(1))
    odd = BatchIdentity.create(agent, boot, 0, 9)
    c.enqueue(odd, make_frame(odd))
    report = c.run_once()
    assert [o.action for o in report.outcomes] == ["accepted"], report.outcomes
    m = manifest(real.ctx, odd)
    assert m is not None and (m.agent_id, m.boot_id) == (agent, boot)
    # Raw non-ASCII in a header is refused with a message saying how to send it.
    from lightmetrics.protocol.errors import InvalidIdentityError
    from lightmetrics.protocol.identity import id_from_header

    with pytest.raises(InvalidIdentityError, match="UTF-8''"):
        id_from_header("boot-\u00e9", "boot_id")
    assert id_from_header("UTF-8''plain", "boot_id") == "plain" and id_from_header("agent-A.1", "agent_id") == "agent-A.1"


@pytest.mark.parametrize("token, status", [(mint_token(TokenKeys.generate("k9"), AGENT), 401),
                                           (mint_token(KEYS, "someone-else"), 403)], ids=["401", "403"])
def test_401_and_403_stop_the_client_and_delete_nothing(
    real: RealIngest, tmp_path: Path, token: str, status: int
) -> None:
    c = client(tmp_path, [real.server.url], token=token)
    frames = [make_frame(ident(n)) for n in range(2)]
    for n, data in enumerate(frames):
        c.enqueue(ident(n), data)
    with pytest.raises(AuthRejected) as err:
        c.drain(timeout_s=5)
    assert err.value.http_status == status and f"answered {status}" in str(err.value)
    assert err.value.identity == ident(0)
    assert [b.read_bytes() for b in c.pending()] == frames and c.parked() == []
    assert real.requests == 1  # stopped at once, no retries


def run_lmctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(LMCTL + list(args), capture_output=True, text=True, timeout=timeout)


def test_killed_mid_send_loses_nothing_and_accepts_each_batch_once(real: RealIngest, tmp_path: Path) -> None:
    spool_dir, token_file = tmp_path / "spool", tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    spool = Spool(spool_dir)
    frames = {ident(n): make_frame(ident(n), n=5 + n, compress=n % 3 == 0) for n in range(12)}
    for i, data in frames.items():
        spool.put(i, data)
    real.hold_request = 5  # the 5th request is accepted in S3, then its answer is held
    args = ["agent", "run", "--agent-id", AGENT, "--token-file", str(token_file), "--spool", str(spool_dir),
            "--endpoint", real.server.url, "--json", "--timeout", "60"]
    proc = subprocess.Popen(LMCTL + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert real.holding.wait(60), "the client never reached the 5th batch"
        os.kill(proc.pid, signal.SIGKILL)  # mid-send: request in flight, answer not received
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        real.release.set()
    left = spool.pending()
    assert [b.identity for b in left] == list(frames)[4:]  # 4 answered and deleted; the 5th kept
    assert all(b.read_bytes() == frames[b.identity] for b in left)  # byte-identical
    assert manifest(real.ctx, ident(4)) is not None  # ... although ingest had accepted it

    r = run_lmctl(*args)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["accepted"], out["duplicates"], out["pending"], out["parked"]) == (7, 1, 0, 0)
    assert spool.pending() == [] and spool.parked() == []
    for i, data in frames.items():
        m = manifest(real.ctx, i)
        assert m is not None and m.frame_sha256 == sha(data), i
    assert real.ctx.store.list_keys(real.ctx.codec.prefix + "quarantine/v1/", limit=100) == []


def test_cli_exit_codes_enqueue_and_parked_listing(real: RealIngest, tmp_path: Path, refused_url: str) -> None:
    spool_dir, token_file, frame_file = tmp_path / "spool", tmp_path / "token", tmp_path / "f.lmframe"
    token_file.write_text(TOKEN)
    accept_batch(real.ctx, ident(0), make_frame(ident(0)))
    frame_file.write_bytes(make_frame(ident(0), variant=2.0))
    ids = ["--agent-id", AGENT, "--boot-id", "boot-1", "--seq-start", "0", "--seq-end", "9"]
    r = run_lmctl("agent", "enqueue", *ids, "--frame", str(frame_file), "--spool", str(spool_dir), "--json")
    assert r.returncode == 0, r.stderr
    assert Path(json.loads(r.stdout)["path"]).read_bytes() == frame_file.read_bytes()
    other = tmp_path / "g.lmframe"
    other.write_bytes(make_frame(ident(0), variant=3.0))
    assert run_lmctl("agent", "enqueue", *ids, "--frame", str(other), "--spool", str(spool_dir)).returncode == 3

    base = ["agent", "run", "--agent-id", AGENT, "--token-file", str(token_file), "--spool", str(spool_dir), "--json"]
    down = run_lmctl(*base, "--endpoint", refused_url, "--timeout", "0.5", "--backoff-base-s", "0.01",
                     "--backoff-max-s", "0.05")
    assert down.returncode == 4 and json.loads(down.stdout)["pending"] == 1  # unavailable: retry

    parked = run_lmctl(*base, "--endpoint", refused_url, "--endpoint", real.server.url)
    assert parked.returncode == 3, parked.stderr
    out = json.loads(parked.stdout)
    assert out["failovers"] == 1 and out["parked_conflicts"] == 1
    assert out["parked_batches"][0]["resolution"] == "unresolved"
    listing = run_lmctl("agent", "parked", "--spool", str(spool_dir), "--json")
    assert listing.returncode == 3 and json.loads(listing.stdout)["parked"][0]["kind"] == "identity_conflict"

    token_file.write_text(mint_token(KEYS, "someone-else"))
    (spool_dir / ident(1).spool_name).write_bytes(make_frame(ident(1)))
    denied = run_lmctl(*base, "--endpoint", real.server.url)
    assert denied.returncode == 2 and "403" in json.loads(denied.stdout)["reason"]
    assert (spool_dir / ident(1).spool_name).exists()
