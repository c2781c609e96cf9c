"""Issue 13, operator area: operator decisions are unambiguous (property 8) and the agent client
keeps delivering (property 9).

Real moto server; the real admin handler behind the local SigV4 Function URL stand-in; the real
ingest service (with its denylist cache) behind the local HTTP server; ``lmctl`` in-process
(``CliRunner``: no terminal) and as a process on a pseudo-terminal for the confirmation prompt.
"""

from __future__ import annotations

import json
import os
import pty
import random
import select
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import make_frame
from test_admin import admin, call  # noqa: F401  (admin: the signed admin endpoint fixture)
from test_cli import LMCTL
from test_conflicts import FakeMonotonic, actx, clock, registry, system  # noqa: F401  (fixtures)
from test_conflicts import make_conflict as make_evidence

from lightmetrics.acceptance.auth import CachedTokenKeys, TokenKeys, mint_token
from lightmetrics.acceptance.denylist import DENYLIST_PK, DenylistCache, DenylistStore
from lightmetrics.acceptance.http_contract import HttpRequest, IngestService, parse_lambda_event
from lightmetrics.aws.control_table import ControlTable
from lightmetrics.cli.main import cli
from lightmetrics.client import AgentClient, AuthRejected, Spool
from lightmetrics.local.ingest_endpoint import IngestHTTPServer
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.identity import BatchIdentity

KEYS = TokenKeys.generate("k1")


def env_of(system: LocalSystem) -> dict[str, str]:
    return {**system.operator_environment(), "LM_OPERATOR": "operator-1", "COLUMNS": "200"}


def lmctl(system: LocalSystem, *args: str) -> Any:
    """lmctl in-process; CliRunner's stdin is not a terminal."""
    return CliRunner().invoke(cli, list(args), env=env_of(system))


def on_a_terminal(system: LocalSystem, args: list[str], answer: str, timeout_s: float = 90) -> tuple[int, str]:
    """Run lmctl with a pseudo-terminal as stdin/stdout; type ``answer`` at the [y/N] prompt."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(LMCTL + args, stdin=slave, stdout=slave, stderr=slave,
                            env={**os.environ, **env_of(system)}, close_fds=True)
    os.close(slave)
    out, answered, deadline = b"", False, time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the process closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
                if not answered and b"[y/N]" in out:
                    os.write(master, answer.encode() + b"\n")
                    answered = True
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, out.decode("utf-8", "replace")


def make_conflict(system: LocalSystem, runtime: Any, clock: Any, ident: BatchIdentity) -> str:
    """An indexed identity conflict on ``ident``: its conflict id."""
    _, second = make_evidence(system, runtime, clock, ident)
    return registry(system).show(second.quarantine_key).entry.conflict_id


def table(system: LocalSystem) -> ControlTable:
    return system.work_context().blockers.table


class Ingest:
    """The real ingest service with its denylist cache (TTL 60 s on ``now``) behind the local
    HTTP server; counts requests per boot."""

    def __init__(self, system: LocalSystem, runtime: Any, clock: Any, now: FakeMonotonic) -> None:
        cache = DenylistCache(ControlTable(runtime.boto3_client("dynamodb"), system.table), ttl_s=60, now=now)
        self.service = IngestService(actx(system, runtime, clock, "collector-http"),
                                     CachedTokenKeys(lambda: KEYS, max_age_s=300, now=now), cache)
        self.boots: list[str] = []
        self.server = IngestHTTPServer(self, port=0).start()
        self.url = self.server.url

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        request = parse_lambda_event(event)
        self.boots.append(request.headers.get("x-lm-boot-id", ""))
        return self.service.handle(request).to_lambda()

    def post(self, ident: BatchIdentity, token: str) -> tuple[int, dict[str, Any]]:
        headers = {"x-lm-agent-id": ident.agent_id, "x-lm-boot-id": ident.boot_id,
                   "x-lm-seq-start": str(ident.seq_start), "x-lm-seq-end": str(ident.seq_end),
                   "authorization": f"Bearer {token}"}
        r = self.service.handle(HttpRequest("POST", headers, make_frame(ident)))
        return r.status, r.body


@pytest.fixture
def ingest(system, runtime, clock):  # type: ignore[no-untyped-def]
    now = FakeMonotonic()
    server = Ingest(system, runtime, clock, now)
    server.now = now  # type: ignore[attr-defined]
    yield server
    server.server.stop()


# =========================================================================== property 8
def test_property_8_admin_api_accepts_only_json_booleans_for_boolean_fields(system, runtime, clock, admin):  # type: ignore[no-untyped-def]
    cid = make_conflict(system, runtime, clock, BatchIdentity.create("agent-bool", "boot-1", 0, 9))
    for value in ("false", "true", 0, 1, None, [], {}, "no"):
        body = json.dumps({"resolution": "deny_identity", "reason": "clone", "whole_agent": value}).encode()
        status, out = call(admin, "POST", f"/conflicts/{cid}/resolve", body)
        assert (status, out.get("status")) == (400, "invalid"), (value, status, out)
        assert "whole_agent" in out["reason"] and "JSON boolean" in out["reason"], out
    for body_json in ({"resolution": "deny_identity", "reason": 7},           # not coerced to "7"
                      {"resolution": ["deny_identity"], "reason": "r"},
                      {"resolution": "deny_identity", "reason": "r", "wholeagent": True},  # a typo is not ignored
                      [{"resolution": "deny_identity"}]):
        status, out = call(admin, "POST", f"/conflicts/{cid}/resolve", json.dumps(body_json).encode())
        assert status == 400, (body_json, out)
    # nothing was decided by any of those
    assert call(admin, "GET", f"/conflicts/{cid}")[1]["resolution"] == "unresolved"
    assert call(admin, "GET", "/denylist")[1]["denylist"] == []

    # a query-string boolean is `true` or `false`, nothing else
    for value in ("1", "yes", "True", "", "on"):
        status, out = call(admin, "GET", f"/blockers?all={value}")
        assert status == 400 and "all" in out["reason"], (value, out)
    assert call(admin, "GET", "/blockers?all=true")[0] == 200 and call(admin, "GET", "/blockers?all=false")[0] == 200

    # JSON booleans are honoured: false denies that boot only
    body = json.dumps({"resolution": "deny_identity", "reason": "clone", "whole_agent": False}).encode()
    assert call(admin, "POST", f"/conflicts/{cid}/resolve", body)[0] == 200
    [entry] = call(admin, "GET", "/denylist")[1]["denylist"]
    assert entry["boot_id"] == "boot-1"
    # the lift route's boolean as well
    for value in ("true", 1, None):
        body = json.dumps({"agent_id": "agent-bool", "whole_agent": value, "reason": "r"}).encode()
        status, out = call(admin, "POST", "/denylist/remove", body)
        assert status == 400 and "whole_agent" in out["reason"], (value, status, out)
    assert len(call(admin, "GET", "/denylist")[1]["denylist"]) == 1


def test_property_8_resolve_refuses_two_decisions_at_once(system, runtime, clock):  # type: ignore[no-untyped-def]
    cid = make_conflict(system, runtime, clock, BatchIdentity.create("agent-two", "boot-1", 0, 9))
    for both in (["--accept-existing", "--deny-identity"], ["--deny-identity", "--accept-existing"]):
        r = lmctl(system, "conflicts", "resolve", cid, *both, "--reason", "r")
        assert r.exit_code == 2, r.output
        assert "--accept-existing" in r.output and "--deny-identity" in r.output and "not both" in r.output
        r = lmctl(system, "conflicts", "resolve", cid, *both, "--reason", "r", "--yes", "--json")
        assert r.exit_code == 2 and "not both" in json.loads(r.stdout)["reason"]
    assert registry(system).show(cid).record is None
    assert table(system).query(DENYLIST_PK) == []


def test_property_8_a_deny_decision_asks_for_confirmation(system, runtime, clock):  # type: ignore[no-untyped-def]
    cid = make_conflict(system, runtime, clock, BatchIdentity.create("agent-ask", "boot-1", 0, 9))
    r = lmctl(system, "conflicts", "resolve", cid, "--deny-identity", "--reason", "clone")  # no terminal, no --yes
    assert r.exit_code == 2 and "--yes" in r.output, r.output
    r = lmctl(system, "conflicts", "resolve", cid, "--deny-identity", "--reason", "clone", "--json")
    assert r.exit_code == 2 and "--yes" in json.loads(r.stdout)["reason"]
    assert registry(system).show(cid).record is None and table(system).query(DENYLIST_PK) == []

    args = ["conflicts", "resolve", cid, "--deny-identity", "--whole-agent", "--reason", "clone"]
    code, out = on_a_terminal(system, args, "n")
    assert code == 2 and "agent-ask" in out and "every boot" in out and "nothing" in out.lower(), out
    assert registry(system).show(cid).record is None and table(system).query(DENYLIST_PK) == []
    code, out = on_a_terminal(system, args, "y")
    assert code == 0, out
    assert registry(system).show(cid).record.resolution == "deny_identity"  # type: ignore[union-attr]
    [item] = table(system).query(DENYLIST_PK)
    assert item["boot_id"] == "*" and item["who"] == "operator-1"

    # lifting asks as well
    r = lmctl(system, "denylist", "remove", "--agent", "agent-ask", "--whole-agent", "--reason", "mistake")
    assert r.exit_code == 2 and "--yes" in r.output, r.output
    code, out = on_a_terminal(system, ["denylist", "remove", "--agent", "agent-ask", "--whole-agent",
                                       "--reason", "mistake"], "n")
    assert code == 2 and len(table(system).query(DENYLIST_PK)) == 1, out
    # accept_existing changes no one's access: no question asked
    cid2 = make_conflict(system, runtime, clock, BatchIdentity.create("agent-ask", "boot-2", 0, 9))
    r = lmctl(system, "conflicts", "resolve", cid2, "--accept-existing", "--reason", "stale replay")
    assert r.exit_code == 0, r.output


def test_property_8_a_denial_is_lifted_by_an_audited_command_and_ingest_stops_denying_within_the_ttl(  # type: ignore[no-untyped-def]
        system, runtime, clock, ingest, admin):
    agent = "agent-lift"
    token = mint_token(KEYS, agent)
    boot1 = [BatchIdentity.create(agent, "boot-1", n * 10, n * 10 + 9) for n in range(4)]
    cid = make_conflict(system, runtime, clock, boot1[0])
    r = lmctl(system, "conflicts", "resolve", cid, "--deny-identity", "--reason", "suspected clone", "--yes")
    assert r.exit_code == 0, r.output
    assert ingest.post(boot1[1], token)[1]["status"] == "denied"

    # the lift needs a reason, a selection and a confirmation
    sel = ["--agent", agent, "--boot", "boot-1"]
    r = lmctl(system, "denylist", "remove", *sel, "--yes")
    assert r.exit_code == 2 and "--reason" in r.output, r.output
    r = lmctl(system, "denylist", "remove", "--agent", agent, "--reason", "x", "--yes")
    assert r.exit_code == 2 and "--boot" in r.output and "--whole-agent" in r.output, r.output
    r = lmctl(system, "denylist", "remove", "--agent", agent, "--whole-agent", "--reason", "x", "--yes")
    assert r.exit_code == 2 and "not denied" in r.output and "boot-1" in r.output, r.output  # names what is denied
    assert len(table(system).query(DENYLIST_PK)) == 1

    r = lmctl(system, "denylist", "remove", *sel, "--reason", "false alarm: re-imaged host", "--yes", "--json")
    assert r.exit_code == 0, r.output
    lift = json.loads(r.stdout)["lift"]
    assert lift["entry"] == f"{agent.encode().hex()}#{b'boot-1'.hex()}"
    assert (lift["lifted_by"], lift["reason"], lift["conflict_id"]) == ("operator-1", "false alarm: re-imaged host", cid)
    assert lift["denied_by"] == "operator-1" and lift["denied_reason"] == "suspected clone"
    assert lift["lifted_at_unix_ns"] >= lift["denied_at_unix_ns"] > 0
    assert table(system).query(DENYLIST_PK) == []
    # the audit trail is durable: one write-once record in the control table, listed by lmctl and the API
    r = lmctl(system, "denylist", "--json")
    assert json.loads(r.stdout)["denylist"] == [] and json.loads(r.stdout)["lifted"] == [lift]
    assert call(admin, "GET", "/denylist")[1]["lifted"] == [lift]

    # ingest stops denying within LM_DENYLIST_TTL_S
    ingest.now.t += 59
    assert ingest.post(boot1[2], token)[0] == 403
    ingest.now.t += 2
    assert ingest.post(boot1[2], token)[0] == 200

    # the lift is not undone by re-applying the old decision, and cannot be repeated
    r = lmctl(system, "conflicts", "resolve", cid, "--deny-identity", "--reason", "again", "--yes", "--json")
    assert r.exit_code == 2 and json.loads(r.stdout)["status"] == "already_resolved"
    assert table(system).query(DENYLIST_PK) == []
    r = lmctl(system, "denylist", "remove", *sel, "--reason", "again", "--yes")
    assert r.exit_code == 2 and "not denied" in r.output
    assert len(json.loads(lmctl(system, "denylist", "--json").stdout)["lifted"]) == 1

    # a later denial of the same boot is a new decision: it denies again, and is lifted on its own
    cid2 = make_conflict(system, runtime, clock, BatchIdentity.create(agent, "boot-1", 1000, 1009))
    body = json.dumps({"resolution": "deny_identity", "reason": "clone, really", "whole_agent": True}).encode()
    assert call(admin, "POST", f"/conflicts/{cid2}/resolve", body)[0] == 200
    ingest.now.t += 61
    assert ingest.post(boot1[3], token)[1]["status"] == "denied"
    # the admin API route: same rules, the signer is the audit's `lifted_by`
    for bad in ({"agent_id": agent, "whole_agent": True}, {"agent_id": agent, "whole_agent": True, "reason": " "},
                {"agent_id": agent, "boot_id": "boot-1", "whole_agent": True, "reason": "r"},
                {"agent_id": agent, "reason": "r"}):
        assert call(admin, "POST", "/denylist/remove", json.dumps(bad).encode())[0] == 400, bad
    status, out = call(admin, "POST", "/denylist/remove", json.dumps(
        {"agent_id": agent, "boot_id": "boot-9", "reason": "r"}).encode())
    assert status == 404 and out["status"] == "not_denied"
    status, out = call(admin, "POST", "/denylist/remove", json.dumps(
        {"agent_id": agent, "whole_agent": True, "reason": "confirmed benign"}).encode())
    assert status == 200 and out["lift"]["lifted_by"] == "arn:aws:iam::123456789012:user/testing"
    assert out["lift"]["conflict_id"] == cid2 and out["lift"]["entry"] == f"{agent.encode().hex()}#*"
    assert call(admin, "GET", "/denylist")[1]["denylist"] == [] and len(call(admin, "GET", "/denylist")[1]["lifted"]) == 2
    ingest.now.t += 61
    assert ingest.post(boot1[3], token)[0] == 200


def test_property_8_a_lift_cut_short_by_a_crash_is_completed_by_its_retry(system, clock):  # type: ignore[no-untyped-def]
    """The lift record is written before the entry is deleted; a crash in between leaves the audit
    (never a deletion without one), and running the lift again finishes it under the first record."""
    t = table(system)
    store = DenylistStore(t, clock)
    store.add("agent-crash", "boot-1", who="alice", reason="clone?", conflict_id="c-1")
    sk = f"{b'agent-crash'.hex()}#{b'boot-1'.hex()}"
    alices_denial = t.get(DENYLIST_PK, sk)
    real_delete = t.client.delete_item

    def crash(**kwargs: Any) -> Any:
        raise ConnectionError("injected crash before the entry's delete")

    t.client.delete_item = crash
    try:
        with pytest.raises(ConnectionError):
            store.remove("agent-crash", "boot-1", who="bob", reason="benign")
    finally:
        t.client.delete_item = real_delete
    [lift] = store.lifts()
    assert (lift.lifted_by, lift.reason, lift.denied_by, lift.conflict_id) == ("bob", "benign", "alice", "c-1")
    assert len(store.list()) == 1  # still denied: the lift did not finish
    clock.advance(5)
    again = store.remove("agent-crash", "boot-1", who="carol", reason="finishing bob's lift")
    assert again == lift and store.list() == [] and store.lifts() == [lift]  # one record, bob's
    # a denial re-created after the lift is a new decision: a lift that read the old one never deletes it
    clock.advance(5)
    store.add("agent-crash", "boot-1", who="dave", reason="clone after all")
    real_get = t.get
    t.get = lambda pk, key, **kw: alices_denial if (pk, key) == (DENYLIST_PK, sk) else real_get(pk, key, **kw)  # type: ignore[method-assign]
    try:
        assert store.remove("agent-crash", "boot-1", who="erin", reason="stale read") == lift
    finally:
        t.get = real_get  # type: ignore[method-assign]
    assert [e.who for e in store.list()] == ["dave"] and store.lifts() == [lift]


def test_property_8_a_deny_decision_made_while_a_lift_is_on_its_way_stands_and_one_before_it_does_not(
        system, clock):  # type: ignore[no-untyped-def]
    """C6 under concurrency: a lift cancels the decisions at or before it, whatever order the
    requests land in. A decision after the lift that finds the entry between the lift's record and
    its delete keeps the entry (and a later lift can still remove it); one at or before the lift,
    landing in the same window, or re-creating the entry after the delete, does not."""
    t = table(system)
    store = DenylistStore(t, clock)
    agent, sk = "agent-race", f"{b'agent-race'.hex()}#{b'boot-1'.hex()}"
    real_delete = t.delete

    def lift_with(decision_offset_s: int) -> Any:
        """bob lifts; another operator's decision (at the lift's time + offset) lands between the
        lift record and the entry's delete."""
        def delete(pk: str, key: str, **kw: Any) -> Any:
            if pk == DENYLIST_PK:
                store.add(agent, "boot-1", who="carol", reason="deny again",
                          decided_at_unix_ns=clock.now_ns() + decision_offset_s * 10**9)
            return real_delete(pk, key, **kw)

        t.delete = delete  # type: ignore[method-assign]
        try:
            return store.remove(agent, "boot-1", who="bob", reason="benign")
        finally:
            t.delete = real_delete  # type: ignore[method-assign]

    store.add(agent, "boot-1", who="alice", reason="clone?")
    clock.advance(10)
    first = lift_with(+5)  # carol decided after bob's lift: denied again
    [entry] = store.list()
    assert entry.who == "alice" and entry.decided_at_unix_ns == first.lifted_at_unix_ns + 5 * 10**9
    clock.advance(10)
    second = store.remove(agent, "boot-1", who="dave", reason="carol agrees now")  # a lift of carol's decision
    assert store.list() == [] and second.sk != first.sk and len(store.lifts()) == 2

    clock.advance(1)  # a decision at a lift's very instant is one the lift cancels
    store.add(agent, "boot-1", who="alice", reason="again")
    clock.advance(10)
    lift_with(-5)  # carol's decision is older than bob's lift: the lift cancels it
    assert store.list() == []
    # a stale re-apply of a decision older than the lift re-creates the entry after the delete: it goes again
    assert t.get(DENYLIST_PK, sk) is None
    store.add(agent, "boot-1", who="carol", reason="re-applied", decided_at_unix_ns=clock.now_ns() - 5 * 10**9)
    assert store.list() == [] and t.get(DENYLIST_PK, sk) is None
    clock.advance(1)
    store.add(agent, "boot-1", who="erin", reason="a new decision")  # after every lift: it stands
    assert [e.who for e in store.list()] == ["erin"]


# =========================================================================== property 9
def agent_client(spool: Path, ingest: Ingest, clock: FrozenClock, agent: str, **kw: Any) -> AgentClient:
    kw.setdefault("token", mint_token(KEYS, agent))
    return AgentClient(agent_id=agent, endpoints=[ingest.url], spool=spool, clock=clock, sleep=lambda _s: None,
                       rng=random.Random(1), parked_retry_s=300, **kw)


def test_property_9_a_denied_boot_parks_only_its_batches_and_other_boots_keep_flowing(  # type: ignore[no-untyped-def]
        system, runtime, clock, ingest, tmp_path):
    agent = "agent-park"
    DenylistStore(table(system), clock).add(agent, "boot-1", who="alice", reason="investigating")
    denied = [BatchIdentity.create(agent, "boot-1", n * 10, n * 10 + 9) for n in range(3)]
    flowing = [BatchIdentity.create(agent, "boot-2", n * 10, n * 10 + 9) for n in range(3)]
    alerts: list[Any] = []
    c = agent_client(tmp_path, ingest, clock, agent, on_alert=alerts.append)
    for i in denied + flowing:  # send order: boot-1 first
        c.enqueue(i, make_frame(i))
    report = c.run_once()
    assert report.accepted == 3 and report.pending == 0, report.to_json()
    assert sorted((str(p.identity), p.kind, p.http_status, p.status) for p in c.parked()) == sorted(
        (str(i), "denied", 403, "denied") for i in denied)
    ctx = actx(system, runtime, clock)
    assert all(ctx.store.get(ctx.codec.accepted(i)) is not None for i in flowing)
    assert all(ctx.store.get(ctx.codec.accepted(i)) is None for i in denied)
    assert {a.parked_kind for a in alerts} == {"denied"} and len(alerts) == 3
    assert ingest.boots.count("boot-1") == 1  # one answer denied the boot; its other batches were not sent
    listing = CliRunner().invoke(cli, ["agent", "parked", "--spool", str(tmp_path), "--json"])
    assert listing.exit_code == 2 and {p["kind"] for p in json.loads(listing.stdout)["parked"]} == {"denied"}

    # more batches of both boots: the denied boot's are parked, the other's accepted
    later = [BatchIdentity.create(agent, b, 100, 109) for b in ("boot-1", "boot-2")]
    for i in later:
        c.enqueue(i, make_frame(i))
    clock.advance(300)  # parked denials are retried at the parked cadence: one probe per boot
    before = ingest.boots.count("boot-1")
    report = c.run_once()
    assert report.accepted == 1 and len(c.parked()) == 4 and ingest.boots.count("boot-1") - before == 1

    # the operator lifts the denial; within the cache TTL and the parked cadence, they flow
    DenylistStore(table(system), clock).remove(agent, "boot-1", who="alice", reason="benign")
    ingest.now.t += 61
    clock.advance(300)
    report = c.run_once()
    assert report.accepted == 4 and c.parked() == [] and c.pending() == []
    assert all(ctx.store.get(ctx.codec.accepted(i)) is not None for i in denied + later)


def test_property_9_only_a_rejected_token_stops_the_client(system, runtime, clock, ingest, tmp_path):  # type: ignore[no-untyped-def]
    agent = "agent-tok"
    DenylistStore(table(system), clock).add("agent-den", None, who="alice", reason="investigating")
    # ingest's answers tell a rejected token from a denied identity
    mine = BatchIdentity.create(agent, "boot-1", 0, 9)
    assert ingest.post(mine, mint_token(TokenKeys.generate("k9"), agent))[:1] == (401,)
    status, body = ingest.post(mine, mint_token(KEYS, "someone-else"))
    assert (status, body["status"]) == (403, "unauthorized") and "another agent" in body["reason"], body
    status, body = ingest.post(BatchIdentity.create("agent-den", "boot-1", 0, 9), mint_token(KEYS, "agent-den"))
    assert (status, body["status"]) == (403, "denied") and "denylist" in body["reason"], body

    for n, (token, http) in enumerate(((mint_token(TokenKeys.generate("k9"), agent), 401),
                                       (mint_token(KEYS, "someone-else"), 403))):
        spool = tmp_path / f"s{n}"
        c = agent_client(spool, ingest, clock, agent, token=token)
        frames = [make_frame(BatchIdentity.create(agent, b, 0, 9)) for b in ("boot-1", "boot-2")]
        for b, data in zip(("boot-1", "boot-2"), frames):
            c.enqueue(BatchIdentity.create(agent, b, 0, 9), data)
        with pytest.raises(AuthRejected) as err:
            c.drain(timeout_s=5)
        assert err.value.http_status == http and "token" in str(err.value)
        assert [b.read_bytes() for b in c.pending()] == frames and c.parked() == []


def test_property_9_unparseable_spool_files_are_moved_aside_and_delivery_continues(  # type: ignore[no-untyped-def]
        system, runtime, clock, ingest, tmp_path):
    agent = "agent-junk"
    good = [BatchIdentity.create(agent, "boot-1", n * 10, n * 10 + 9) for n in range(3)]
    spool = Spool(tmp_path)
    for i in good:
        spool.put(i, make_frame(i))
    hex_a, hex_b = agent.encode().hex(), b"boot-1".hex()
    truncated = BatchIdentity.create(agent, "boot-1", 500, 509)
    mismatched = BatchIdentity.create(agent, "boot-1", 600, 609)
    junk = {
        "garbage.lmframe": b"not a frame",
        "notes.txt": b"hello",
        f"agent={hex_a}.boot={hex_b}.00000000000000000009-00000000000000000000.lmframe": make_frame(good[0]),
        f"agent={hex_a}.boot=00.00000000000000000000-00000000000000000009.lmframe": b"x",
        truncated.spool_name: make_frame(truncated)[:25],
        mismatched.spool_name: make_frame(good[1]),
    }
    for name, data in junk.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "parked" / "stray-file").write_bytes(b"?")
    (tmp_path / ".agent.lock").write_bytes(b"")  # hidden files are not spool files: left alone
    alerts: list[Any] = []
    c = agent_client(tmp_path, ingest, clock, agent, on_alert=alerts.append)
    report = c.run_once()
    assert report.accepted == 3 and report.pending == 0, report.to_json()
    assert ingest.boots == ["boot-1"] * 3  # nothing unparseable was sent
    aside = {u.original_name: u for u in c.spool.unreadable()}
    assert set(aside) == set(junk) | {"stray-file"}
    for name, data in junk.items():
        assert not (tmp_path / name).exists() and aside[name].read_bytes() == data  # kept, byte for byte
        assert aside[name].reason, name
    assert "not a spool batch name" in aside["notes.txt"].reason
    assert "truncated" in aside[truncated.spool_name].reason or "short" in aside[truncated.spool_name].reason
    assert "does not match" in aside[mismatched.spool_name].reason
    assert (tmp_path / ".agent.lock").exists()
    assert report.unreadable == len(junk) + 1 and {a.kind for a in alerts} == {"unreadable"}

    listing = CliRunner().invoke(cli, ["agent", "parked", "--spool", str(tmp_path), "--json"])
    assert listing.exit_code == 2, listing.output
    listed = json.loads(listing.stdout)["unreadable"]
    assert {u["original_name"] for u in listed} == set(aside)
    assert all(u["reason"] and Path(u["path"]).exists() for u in listed)
    text = CliRunner().invoke(cli, ["agent", "parked", "--spool", str(tmp_path)], env={"COLUMNS": "250"})
    assert "notes.txt" in text.output and "unreadable" in text.output

    # a new batch later flows as usual, and the set-aside files stay put
    later = BatchIdentity.create(agent, "boot-1", 1000, 1009)
    c.enqueue(later, make_frame(later))
    assert c.run_once().accepted == 1 and len(c.spool.unreadable()) == len(aside)
