"""Identity conflicts end to end (issue 8): registry, resolutions, the denylist in ingest, tokens, lmctl."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import ALL_BACKENDS, FAST, RecordingMetrics, make_frame

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.acceptance.auth import CachedTokenKeys, TokenKeys, mint_token
from lightmetrics.acceptance.conflict_records import (
    ACCEPT_EXISTING,
    CONFLICTS_PK,
    DENY_IDENTITY,
    ConflictAlreadyResolved,
    ConflictNotFound,
    InvalidConflictId,
    InvalidResolution,
    conflict_id,
    parse_conflict_id,
)
from lightmetrics.acceptance.conflicts import ConflictRegistry
from lightmetrics.acceptance.denylist import DENYLIST_PK, DenylistCache
from lightmetrics.acceptance.http_contract import HttpRequest, IngestService
from lightmetrics.aws.control_table import ControlTable
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_quarantine
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.clock import FrozenClock, utc_text
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.work.outcome import Outcome

T0 = 1_764_000_000_000_000_000


class FakeMonotonic:
    """An injectable monotonic clock (seconds) for the caches' staleness bounds."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


#: The registry's storage behaviour (conditional writes racing, queries and pages, a resolution's conditional
#: update) runs on moto and MiniStack; the CLI, token and denylist tests are not about storage, and the walk's
#: rebuild needs the local runtime's Lambda host, which only the moto runtime has.
STORAGE = pytest.mark.backends(*ALL_BACKENDS)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def system(runtime, clock):  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:10]
    s = LocalSystem(runtime, bucket=f"lm-cf-{tag}", table=f"lm-cf-{tag}", secret_name=f"lm-cf/{tag}",
                    queue_name_prefix=f"cf{tag}-", clock=clock).provision()
    s.notifications(False)  # indexing is driven by the test
    yield s
    s.stop()


def actx(system: LocalSystem, runtime: Any, clock: Any, collector: str = "collector-1") -> Any:
    settings = system.settings.model_copy(update={"collector_id": collector})
    return accept_context(settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)


def registry(system: LocalSystem) -> ConflictRegistry:
    ctx = system.work_context(policy=FAST)
    return ConflictRegistry(ctx.store, ctx.codec, ctx.blockers.table, clock=system.clock, policy=FAST)


def make_conflict(system: LocalSystem, runtime: Any, clock: Any, ident: BatchIdentity) -> tuple[Any, Any]:
    """Accept one frame, then submit different content for the same identity and index the evidence."""
    first = accept_batch(actx(system, runtime, clock, "collector-1"), ident, make_frame(ident))
    second = accept_batch(actx(system, runtime, clock, "collector-2"), ident, make_frame(ident, variant=0.5))
    assert (first.status.value, second.status.value) == ("accepted", "identity_conflict")
    assert index_quarantine(system.work_context(policy=FAST), second.quarantine_key) is Outcome.DONE
    return first, second


# --------------------------------------------------------------------------- registry


@STORAGE
def test_racing_collectors_make_one_registry_entry_with_both_hashes(system, runtime, clock):  # type: ignore[no-untyped-def]
    """Six collectors (threads, each with its own client and collector id) race two different frames
    for one identity: one is accepted, every other submission is the same conflict -> one entry."""
    ident = BatchIdentity.create("agent-race", "boot-1", 0, 9)
    frames = [make_frame(ident), make_frame(ident, variant=0.5)]
    barrier, answers = threading.Barrier(6), []
    lock = threading.Lock()

    def collector(i: int) -> None:
        ctx = actx(system, runtime, clock, f"collector-{i}")
        barrier.wait()
        result = accept_batch(ctx, ident, frames[i % 2])
        with lock:
            answers.append(result)

    threads = [threading.Thread(target=collector, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(a.status.value for a in answers)
    assert statuses == ["accepted", "duplicate", "duplicate", "identity_conflict", "identity_conflict",
                        "identity_conflict"]
    quarantine_keys = {a.quarantine_key for a in answers if a.quarantine_key}
    assert len(quarantine_keys) == 1  # one piece of evidence for the one conflicting hash

    metrics = RecordingMetrics()
    ctx = system.work_context(policy=FAST, metrics=metrics)
    (qkey,) = quarantine_keys
    assert index_quarantine(ctx, qkey) is Outcome.DONE
    assert index_quarantine(ctx, qkey) is Outcome.NOOP_RESOLVED  # replays never duplicate or overwrite
    assert metrics.values == {"ConflictsRegistered": 1}

    page = registry(system).list()
    assert len(page.items) == 1 and page.next_token is None
    (e,) = page.items
    shas = {hashlib.sha256(f).hexdigest() for f in frames}
    assert {e.accepted_frame_sha256, e.submitted_frame_sha256} == shas
    accepted = next(a for a in answers if a.status.value == "accepted")
    assert e.accepted_frame_sha256 == accepted.frame_sha256 and e.accepted_manifest_key == accepted.manifest_key
    assert {e.accepted_raw_blob_key, e.submitted_raw_blob_key} == {ctx.codec.raw_blob(s) for s in shas}
    assert (e.agent_id, e.boot_id, e.seq_start, e.seq_end) == ("agent-race", "boot-1", 0, 9)
    assert e.first_seen_unix_ns == T0 and e.resolution == "unresolved"
    assert e.collectors[0] == accepted_collector(system, accepted.manifest_key) and len(e.collectors) == 2
    assert e.conflict_id == conflict_id(ident, e.submitted_frame_sha256) and e.quarantine_key == qkey


def accepted_collector(system: LocalSystem, manifest_key: str) -> str:
    raw = system.work_context().store.get(manifest_key)
    return json.loads(raw)["collector_id"]


def test_conflict_ids_parse_and_reject(system, runtime, clock):  # type: ignore[no-untyped-def]
    ident = BatchIdentity.create("agent-id", "boot-1", 5, 7)
    sha = "ab" * 32
    codec = system.work_context().codec
    cid = conflict_id(ident, sha)
    assert cid == f"{ident.manifest_id}.{sha}"
    assert parse_conflict_id(cid, codec) == (ident, sha)
    assert parse_conflict_id(codec.quarantine(ident, sha), codec) == (ident, sha)  # the evidence key works too
    for bad in ("", "nope", cid[:-1], cid.replace(".", "/"), codec.accepted(ident)):
        with pytest.raises(InvalidConflictId):
            parse_conflict_id(bad, codec)
    with pytest.raises(ConflictNotFound):
        registry(system).show(cid)


@STORAGE
def test_list_filters_and_pagination(system, runtime, clock):  # type: ignore[no-untyped-def]
    reg = registry(system)
    made = []
    for n in range(5):
        clock.advance(1)
        ident = BatchIdentity.create(f"agent-{n % 2}", "boot-1", n * 10, n * 10 + 9)
        made.append(make_conflict(system, runtime, clock, ident)[1])
    reg.resolve(made[0].quarantine_key, ACCEPT_EXISTING, reason="replayed", who="t")
    seen, token = [], None
    while True:
        page = reg.list(limit=2, next_token=token)
        seen += page.items
        token = page.next_token
        if token is None:
            break
    assert [e.quarantine_key for e in seen] == [m.quarantine_key for m in reversed(made)]  # newest first
    assert [e.quarantine_key for e in reg.list(newest_first=False).items] == [m.quarantine_key for m in made]
    assert {e.agent_id for e in reg.list(agent="agent-1").items} == {"agent-1"}
    assert len(reg.list(agent="agent-0").items) == 3
    assert [e.quarantine_key for e in reg.list(status="resolved").items] == [made[0].quarantine_key]
    assert len(reg.list(status="unresolved", limit=1).items) == 1
    assert len(reg.list(status="unresolved").items) == 4
    with pytest.raises(InvalidConflictId):
        reg.list(next_token="not-a-token!")
    with pytest.raises(InvalidResolution):
        reg.list(status="pending")


# --------------------------------------------------------------------------- resolutions and ingest


def _service(system: LocalSystem, runtime: Any, clock: Any, keys: TokenKeys, now: FakeMonotonic,
             counter: RequestCounter | None = None, ttl_s: float = 60) -> IngestService:
    ddb = runtime.boto3_client("dynamodb")
    if counter is not None:
        counter.attach(ddb)
    cache = DenylistCache(ControlTable(ddb, system.table), ttl_s=ttl_s, now=now)
    return IngestService(actx(system, runtime, clock, "collector-http"),
                         CachedTokenKeys(lambda: keys, max_age_s=300, now=now), cache)


def _post(service: IngestService, token: str, ident: BatchIdentity, frame: bytes) -> tuple[int, dict[str, Any]]:
    headers = {"x-lm-agent-id": ident.agent_id, "x-lm-boot-id": ident.boot_id, "x-lm-seq-start": str(ident.seq_start),
               "x-lm-seq-end": str(ident.seq_end), "authorization": f"Bearer {token}"}
    r = service.handle(HttpRequest("POST", headers, frame))
    return r.status, r.body


@STORAGE
def test_accept_existing_then_the_agent_learns_it_and_a_second_resolve_is_refused(system, runtime, clock):  # type: ignore[no-untyped-def]
    keys = TokenKeys.generate("k1")
    now = FakeMonotonic()
    svc = _service(system, runtime, clock, keys, now)
    token = mint_token(keys, "agent-ae")
    ident = BatchIdentity.create("agent-ae", "boot-1", 0, 9)
    assert _post(svc, token, ident, make_frame(ident))[0] == 200
    parked = make_frame(ident, variant=0.5)
    status, body = _post(svc, token, ident, parked)
    assert status == 409 and body["status"] == "identity_conflict" and body["resolution"] == "unresolved"
    index_quarantine(system.work_context(policy=FAST), body["quarantine_key"])

    reg = registry(system)
    (entry,) = reg.list(status="unresolved").items
    record = reg.resolve(entry.conflict_id, ACCEPT_EXISTING, reason="stale spool replay", who="alice")
    assert record.resolution == ACCEPT_EXISTING and record.resolved_by == "alice" and record.resolved_at_unix_ns == T0
    # What the agent sees when it retries its parked batch: still 409, now with the decision.
    status, body = _post(svc, token, ident, parked)
    assert status == 409 and body["resolution"] == "accept_existing"

    store = system.work_context().store
    res_key = reg.show(entry.conflict_id).resolution_key
    before = store.get(res_key)
    with pytest.raises(ConflictAlreadyResolved) as refused:
        reg.resolve(entry.conflict_id, DENY_IDENTITY, reason="changed my mind", who="bob")
    assert refused.value.record.resolved_by == "alice"
    assert store.get(res_key) == before  # nothing overwritten
    assert store.head(res_key).metadata["lm-resolution"] == "accept_existing"
    assert system.work_context().blockers.table.query(DENYLIST_PK) == []  # the refused deny left no trace
    detail = reg.show(entry.conflict_id)
    assert detail.entry.resolution == "accept_existing" and detail.record.reason == "stale spool replay"
    assert not detail.repaired_index and reg.list(status="unresolved").items == []
    for bad in ("", "  "):
        with pytest.raises(InvalidResolution):
            reg.resolve(entry.conflict_id, ACCEPT_EXISTING, reason=bad, who="x")
    with pytest.raises(InvalidResolution):
        reg.resolve(entry.conflict_id, "maybe", reason="r", who="x")


def test_deny_identity_is_enforced_by_ingest_after_the_cache_bound(system, runtime, clock):  # type: ignore[no-untyped-def]
    keys = TokenKeys.generate("k1")
    now = FakeMonotonic()
    svc = _service(system, runtime, clock, keys, now, ttl_s=60)
    token = mint_token(keys, "agent-dn")
    idents = [BatchIdentity.create("agent-dn", "boot-1", n * 10, n * 10 + 9) for n in range(4)]
    assert _post(svc, token, idents[0], make_frame(idents[0]))[0] == 200  # the cache is loaded here (empty)
    status, body = _post(svc, token, idents[0], make_frame(idents[0], variant=0.5))
    assert status == 409
    record = registry(system).resolve(body["quarantine_key"], DENY_IDENTITY, reason="suspected clone", who="alice")
    assert record.denylist_entries == [f"{b'agent-dn'.hex()}#{b'boot-1'.hex()}"]

    now.t += 59  # within the staleness bound: the cached (empty) list still answers
    assert _post(svc, token, idents[1], make_frame(idents[1]))[0] == 200
    now.t += 2  # past LM_DENYLIST_TTL_S: the next request refreshes and is refused
    status, body = _post(svc, token, idents[2], make_frame(idents[2]))
    assert status == 403 and body["status"] == "denied" and "denylist" in body["reason"]
    assert _post(svc, token, idents[0], make_frame(idents[0], variant=0.5))[0] == 403  # the parked batch too
    other_boot = BatchIdentity.create("agent-dn", "boot-2", 0, 9)
    assert _post(svc, token, other_boot, make_frame(other_boot))[0] == 200  # only that boot is denied

    # --whole-agent: every boot of the agent.
    status, body = _post(svc, token, other_boot, make_frame(other_boot, variant=0.5))
    registry(system).resolve(body["quarantine_key"], DENY_IDENTITY, reason="revoke", who="alice", whole_agent=True)
    now.t += 61
    third_boot = BatchIdentity.create("agent-dn", "boot-3", 0, 9)
    assert _post(svc, token, third_boot, make_frame(third_boot))[0] == 403
    items = {i["sk"]: i for i in system.work_context().blockers.table.query(DENYLIST_PK)}
    assert set(items) == {f"{b'agent-dn'.hex()}#{b'boot-1'.hex()}", f"{b'agent-dn'.hex()}#*"}
    assert items[f"{b'agent-dn'.hex()}#*"]["who"] == "alice"


def test_denylist_costs_at_most_one_table_read_per_ttl(system, runtime, clock):  # type: ignore[no-untyped-def]
    """N accepts -> one Query per LM_DENYLIST_TTL_S window, never one per request (counted)."""
    keys = TokenKeys.generate("k1")
    now, counter = FakeMonotonic(), RequestCounter()
    svc = _service(system, runtime, clock, keys, now, counter=counter, ttl_s=60)
    token = mint_token(keys, "agent-cost")
    n = 0
    for window in range(3):
        for _ in range(20):  # 20 requests spread over 57 s of one window
            ident = BatchIdentity.create("agent-cost", "boot-1", n, n)
            assert _post(svc, token, ident, make_frame(ident))[0] == 200
            n += 1
            now.t += 3
        assert sum(counter.totals.values()) == window + 1  # every DynamoDB request so far
        now.t += 60 - 3 * 20 + 3
    assert dict(counter.totals) == {"dynamodb.Query": 3} and svc.denylist.refreshes == 3


def test_denylist_survives_an_unreachable_table(system, runtime, clock):  # type: ignore[no-untyped-def]
    """The table is not on the request path: if it cannot be read, ingest keeps its last list."""
    now = FakeMonotonic()
    broken = DenylistCache(ControlTable(runtime.boto3_client("dynamodb"), "no-such-table"), ttl_s=60, now=now)
    ident = BatchIdentity.create("agent-x", "boot-1", 0, 0)
    assert broken.denied(ident) is None and broken.denied(ident) is None
    assert broken.refreshes == 1  # a failed read also waits a full TTL before the next try


# --------------------------------------------------------------------------- tokens


def test_two_active_keys_rotation_and_revocation(system, runtime, clock):  # type: ignore[no-untyped-def]
    both = TokenKeys(current="k2", keys={"k1": "1" * 64, "k2": "2" * 64})
    state = {"keys": both}
    now = FakeMonotonic()
    svc = IngestService(actx(system, runtime, clock), CachedTokenKeys(lambda: state["keys"], max_age_s=300, now=now))
    old, new = mint_token(both, "agent-rot", "k1"), mint_token(both, "agent-rot")
    assert new.startswith("k2.") and old.startswith("k1.")
    idents = [BatchIdentity.create("agent-rot", "boot-1", n, n) for n in range(4)]
    assert _post(svc, old, idents[0], make_frame(idents[0]))[0] == 200  # during a rotation both work
    assert _post(svc, new, idents[1], make_frame(idents[1]))[0] == 200
    state["keys"] = TokenKeys(current="k2", keys={"k2": "2" * 64})  # k1 removed from the secret
    assert _post(svc, old, idents[2], make_frame(idents[2]))[0] == 200  # cached for LM_SECRET_CACHE_S
    now.t += 301
    status, body = _post(svc, old, idents[2], make_frame(idents[2]))
    assert status == 401 and "not active" in body["reason"]
    assert _post(svc, new, idents[3], make_frame(idents[3]))[0] == 200

    # lmctl agent-token prints a token for the current key, or for --key-id
    sm = runtime.boto3_client("secretsmanager")
    sm.put_secret_value(SecretId=system.secret_name, SecretString=both.model_dump_json())
    from lightmetrics.cli.main import cli

    env = system.operator_environment()
    r = CliRunner().invoke(cli, ["agent-token", "--agent-id", "agent-rot"], env=env)
    assert r.exit_code == 0 and r.stdout.strip() == new
    r = CliRunner().invoke(cli, ["agent-token", "--agent-id", "agent-rot", "--key-id", "k1", "--json"], env=env)
    assert r.exit_code == 0 and json.loads(r.stdout) == {"agent_id": "agent-rot", "key_id": "k1", "token": old}
    r = CliRunner().invoke(cli, ["agent-token", "--agent-id", "agent-rot", "--key-id", "k9"], env=env)
    assert r.exit_code == 2 and "not active" in r.output


# --------------------------------------------------------------------------- lmctl conflicts


def test_lmctl_conflicts_list_show_resolve(system, runtime, clock):  # type: ignore[no-untyped-def]
    from lightmetrics.cli.main import cli

    ident = BatchIdentity.create("agent-cli", "boot-7", 100, 119)
    _, second = make_conflict(system, runtime, clock, ident)
    env = {**system.operator_environment(), "LM_OPERATOR": "operator-1", "COLUMNS": "200"}
    runner = CliRunner()
    r = runner.invoke(cli, ["conflicts", "list", "--json"], env=env)
    assert r.exit_code == 1, r.output  # unresolved conflicts make `list` exit 1
    out = json.loads(r.stdout)
    assert out["unresolved"] == 1 and out["count"] == 1
    cid = out["conflicts"][0]["conflict_id"]
    assert out["conflicts"][0]["collectors"] == ["collector-1", "collector-2"]
    table = runner.invoke(cli, ["conflicts", "list", "--output", "wide"], env=env)  # issue 27 item 4: whole ids
    shown = runner.invoke(cli, ["conflicts", "show", cid], env=env)
    assert shown.exit_code == 0 and second.frame_sha256 in shown.stdout and "collector-2" in shown.stdout
    assert table.exit_code == 1 and "agent-cli/boot-7" in table.stdout and "collector-1, collector-2" in table.stdout
    first_column = "".join(line.split("│")[1].strip() for line in table.stdout.splitlines() if line.startswith("│"))
    assert first_column == cid  # the id is folded over lines, never cut short
    # Issue 27 item 7: the hint said "--accept-existing | --deny-identity --reason TEXT", as if only a deny took a reason.
    assert "decide: lmctl conflicts resolve ID --accept-existing --reason TEXT\n" in table.stdout
    assert "    or: lmctl conflicts resolve ID --deny-identity --reason TEXT\n" in table.stdout

    r = runner.invoke(cli, ["conflicts", "resolve", cid, "--reason", "x"], env=env)
    assert r.exit_code == 2 and "--accept-existing or --deny-identity" in r.output
    r = runner.invoke(cli, ["conflicts", "resolve", cid, "--accept-existing", "--reason", "stale replay", "--json"],
                      env=env)
    assert r.exit_code == 0, r.output
    resolved = json.loads(r.stdout)["record"]
    assert resolved["resolved_by"] == "operator-1"
    r = runner.invoke(cli, ["conflicts", "resolve", cid, "--deny-identity", "--reason", "again", "--yes", "--json"],
                      env=env)
    assert r.exit_code == 2 and json.loads(r.stdout)["status"] == "already_resolved"
    # ... and said when in raw nanoseconds; now the time operators read everywhere else.
    r = runner.invoke(cli, ["conflicts", "resolve", cid, "--accept-existing", "--reason", "again"], env=env)
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == (f"error: conflict {cid} was already resolved as accept_existing by operator-1 at "
                                f"{utc_text(resolved['resolved_at_unix_ns'])} ('stale replay'); resolutions are write-once"), r.stderr
    r = runner.invoke(cli, ["conflicts", "list", "--status", "unresolved", "--json"], env=env)
    assert r.exit_code == 0 and json.loads(r.stdout)["count"] == 0
    r = runner.invoke(cli, ["conflicts", "show", "bogus", "--json"], env=env)
    assert r.exit_code == 2 and json.loads(r.stdout)["status"] == "error"
    r = runner.invoke(cli, ["status", "--json"], env=env)
    assert json.loads(r.stdout)["unresolved_conflicts"] == 0


def test_lmctl_conflicts_show_takes_a_unique_prefix_of_the_id(system, runtime, clock):  # type: ignore[no-untyped-def]
    """Issue 17: an operator copies the start of an id; a prefix of one conflict shows it, a prefix
    of several names them and exits 2, a prefix of none exits 2."""
    from lightmetrics.acceptance.conflict_records import conflict_id
    from lightmetrics.cli.main import cli

    _, one = make_conflict(system, runtime, clock, BatchIdentity.create("agent-pfx", "boot-1", 0, 9))
    _, two = make_conflict(system, runtime, clock, BatchIdentity.create("agent-pfx", "boot-2", 0, 9))
    ids = [conflict_id(BatchIdentity.create("agent-pfx", b, 0, 9), r.frame_sha256)
           for b, r in (("boot-1", one), ("boot-2", two))]
    env = {**system.operator_environment(), "COLUMNS": "200"}
    runner = CliRunner()
    boot_1 = ids[0].split(".")[1]
    prefix = ids[0][:ids[0].index(".") + 1 + len(boot_1)]  # <agent-hex>.<boot-hex>: boot-1's conflict only
    shown = runner.invoke(cli, ["conflicts", "show", prefix, "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    assert ids[0] in shown.stdout and one.frame_sha256 in shown.stdout
    agent_only = ids[0][:ids[0].index(".")]  # both conflicts of the agent
    r = runner.invoke(cli, ["conflicts", "show", agent_only], env=env)
    assert r.exit_code == 2 and ids[0] in r.output and ids[1] in r.output and "several" in r.output
    r = runner.invoke(cli, ["conflicts", "show", "ffff0000", "--json"], env=env)
    assert r.exit_code == 2 and "no conflict id starts with" in json.loads(r.stdout)["reason"]


def test_lmctl_conflicts_resolve_takes_a_unique_prefix_and_list_shows_whole_hashes(system, runtime, clock):  # type: ignore[no-untyped-def]
    """Issue 17: the prefix `conflicts show` takes works for `conflicts resolve` too (an ambiguous or
    unknown one exits 2 saying so, changing nothing), and `conflicts list` prints both sha256 whole."""
    from lightmetrics.acceptance.conflict_records import conflict_id
    from lightmetrics.cli.main import cli

    made = [make_conflict(system, runtime, clock, BatchIdentity.create("agent-rpx", b, 0, 9)) for b in ("boot-1", "boot-2")]
    ids = [conflict_id(BatchIdentity.create("agent-rpx", b, 0, 9), r.frame_sha256)
           for b, (_, r) in zip(("boot-1", "boot-2"), made)]
    env = {**system.operator_environment(), "LM_OPERATOR": "operator-1"}
    runner = CliRunner()
    table = runner.invoke(cli, ["conflicts", "list", "--agent", "agent-rpx", "--output", "wide"], env=env)
    listed = json.loads(runner.invoke(cli, ["conflicts", "list", "--agent", "agent-rpx", "--json"], env=env).stdout)
    for entry in listed["conflicts"]:
        assert entry["accepted_frame_sha256"] in table.stdout and entry["submitted_frame_sha256"] in table.stdout
    agent_only = ids[0][:ids[0].index(".")]
    r = runner.invoke(cli, ["conflicts", "resolve", agent_only, "--accept-existing", "--reason", "x", "--json"], env=env)
    assert r.exit_code == 2 and "several" in json.loads(r.stdout)["reason"], r.output
    r = runner.invoke(cli, ["conflicts", "resolve", "ffff0000", "--accept-existing", "--reason", "x", "--json"], env=env)
    assert r.exit_code == 2 and "no conflict id starts with" in json.loads(r.stdout)["reason"], r.output
    prefix = ids[0][:ids[0].index(".") + 1 + len(ids[0].split(".")[1])]  # <agent-hex>.<boot-hex>: boot-1's only
    r = runner.invoke(cli, ["conflicts", "resolve", prefix, "--accept-existing", "--reason", "stale", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["record"]["conflict_id"] == ids[0]
    r = runner.invoke(cli, ["conflicts", "resolve", prefix, "--deny-identity", "--reason", "x", "--yes", "--json"],
                      env=env)
    assert r.exit_code == 2 and json.loads(r.stdout)["status"] == "already_resolved", r.output


def test_lmctl_conflicts_table_fits_100_columns_and_its_short_ids_work(system, runtime, clock):  # type: ignore[no-untyped-def]
    """Issue 27 item 4: conflict ids are 117 characters and the table was ~320 wide. By default it
    fits 100 columns, its id column a short id (the start of the submitted sha256) that `show` and
    `resolve` take; a miss suggests the closest; --output wide prints ids whole; --json is unchanged."""
    from lightmetrics.acceptance.conflict_records import conflict_id
    from lightmetrics.cli.main import cli

    agent = "agent-" + "w" * 60
    made = [make_conflict(system, runtime, clock, BatchIdentity.create(agent, b, 0, 9)) for b in ("boot-1", "boot-2")]
    ids = {r.frame_sha256: conflict_id(BatchIdentity.create(agent, b, 0, 9), r.frame_sha256)
           for b, (_, r) in zip(("boot-1", "boot-2"), made)}
    env = {**system.operator_environment(), "LM_OPERATOR": "operator-1"}
    runner = CliRunner()
    listed = json.loads(runner.invoke(cli, ["conflicts", "list", "--agent", agent, "--json"], env=env).stdout)
    assert sorted(e["conflict_id"] for e in listed["conflicts"]) == sorted(ids.values())  # whole, as before
    table = runner.invoke(cli, ["conflicts", "list", "--agent", agent], env=env)
    rows = [line for line in table.stdout.splitlines() if line[:1] in "┏┃┡│└" or line.startswith("identity")]
    assert table.exit_code == 1 and len(rows) == 7, table.stdout
    # every line fits, the hints under the table too (the decide hint was 109 characters)
    assert "lmctl conflicts resolve" in table.stdout and max(map(len, table.stdout.splitlines())) <= 100, table.stdout
    shorts = [line.split("│")[1].strip() for line in table.stdout.splitlines() if line.startswith("│ ")]
    assert len(shorts) == 2 and all(sum(sha.startswith(s) for sha in ids) == 1 for s in shorts), table.stdout
    wide = runner.invoke(cli, ["conflicts", "list", "--agent", agent, "--output", "wide"], env=env)
    assert all(cid in wide.stdout for cid in ids.values()), wide.stdout
    short = shorts[0]
    whole = next(cid for sha, cid in ids.items() if sha.startswith(short))
    shown = runner.invoke(cli, ["conflicts", "show", short, "--json"], env=env)
    assert shown.exit_code == 0 and json.loads(shown.stdout)["conflict_id"] == whole, shown.output
    typo = short[:-1] + ("0" if short[-1] != "0" else "1")
    r = runner.invoke(cli, ["conflicts", "show", typo, "--json"], env=env)
    reason = json.loads(r.stdout)["reason"]
    assert r.exit_code == 2 and "no conflict id starts with" in reason and f"did you mean {whole}" in reason, reason
    r = runner.invoke(cli, ["conflicts", "resolve", short, "--accept-existing", "--reason", "stale", "--json"], env=env)
    assert r.exit_code == 0 and json.loads(r.stdout)["record"]["conflict_id"] == whole, r.output
    # The denylist's tables too (they were ~300 wide with a long agent id and a whole conflict id):
    # every line fits, the conflict a short id `conflicts show` takes; --output wide has them whole.
    other = next(cid for cid in ids.values() if cid != whole)
    r = runner.invoke(cli, ["conflicts", "resolve", other, "--deny-identity", "--reason", "cloned " * 12, "--yes"],
                      env=env)
    assert r.exit_code == 0, r.output
    for args in (["denylist"], ["denylist", "list"]):
        listed = runner.invoke(cli, args, env=env)
        assert listed.exit_code == 0 and max(map(len, listed.stdout.splitlines())) <= 100, listed.stdout
    denied = [line.split("│")[5].strip() for line in listed.stdout.splitlines() if line.startswith("│ ")]
    assert len(denied) == 1 and other.rsplit(".", 1)[1].startswith(denied[0]), listed.stdout
    shown = runner.invoke(cli, ["conflicts", "show", denied[0], "--json"], env=env)
    assert shown.exit_code == 0 and json.loads(shown.stdout)["conflict_id"] == other, shown.output
    assert other in runner.invoke(cli, ["denylist", "--output", "wide"], env=env).stdout
    boot = json.loads(runner.invoke(cli, ["conflicts", "show", other, "--json"], env=env).stdout)["boot_id"]
    r = runner.invoke(cli, ["denylist", "remove", "--agent", agent, "--boot", boot, "--reason", "mistake " * 10,
                            "--yes"], env=env)
    assert r.exit_code == 0, r.output
    listed = runner.invoke(cli, ["denylist"], env=env)
    assert "lifted denials" in listed.stdout and max(map(len, listed.stdout.splitlines())) <= 100, listed.stdout


def test_a_short_conflict_id_of_several_is_refused_naming_them():  # type: ignore[no-untyped-def]
    """Two conflicts whose submitted sha256 start alike: their common start is refused (exit 2 in the
    CLI) naming both; the registry read is the one `conflicts list --limit 1000` makes."""
    from types import SimpleNamespace

    from lightmetrics.acceptance.conflict_records import ConflictNotFound, InvalidConflictId
    from lightmetrics.cli.conflict_cmds import _conflict_id

    entries = [SimpleNamespace(conflict_id=f"61.62.0-9.{sha}", submitted_frame_sha256=sha)
               for sha in ("abcd1234" + "0" * 56, "abcd1299" + "1" * 56)]
    reads: list[int] = []

    class Registry:
        def list(self, *, limit: int) -> SimpleNamespace:
            reads.append(limit)
            return SimpleNamespace(items=entries)

        def complete_id(self, text: str) -> str:
            raise ConflictNotFound(text)

    with pytest.raises(InvalidConflictId, match="several") as refused:
        _conflict_id(Registry(), "ABCD12")
    assert all(e.conflict_id in str(refused.value) for e in entries) and reads == [1000]
    assert _conflict_id(Registry(), "abcd12340") == entries[0].conflict_id


def test_walk_rebuilds_a_missing_registry_item(system, runtime, clock):  # type: ignore[no-untyped-def]
    ident = BatchIdentity.create("agent-walk", "boot-1", 0, 9)
    _, second = make_conflict(system, runtime, clock, ident)
    table = system.work_context().blockers.table
    (item,) = table.query(CONFLICTS_PK)
    table.delete(CONFLICTS_PK, item["sk"])  # the index lost (e.g. a table restored from an old backup)
    assert registry(system).list().items == []
    control = system.walk_control()
    result = control.follow(control.start(page_size=10, parallelism=2), poll_s=0.05, timeout_s=120)
    assert result.status == "finished", result.detail
    (rebuilt,) = registry(system).list().items
    assert rebuilt.quarantine_key == second.quarantine_key and rebuilt.resolution == "unresolved"


# --------------------------------------------------------------------------- the demo's phase


def test_demo_conflict_phase_with_the_agent_client(system, runtime, clock, tmp_path):  # type: ignore[no-untyped-def]
    """The demo phase on a real AgentClient over HTTP: listed, parked batch visible, resolved, dropped."""
    from types import SimpleNamespace

    from lightmetrics.acceptance.http_contract import parse_lambda_event
    from lightmetrics.client import AgentClient, BackoffPolicy
    from lightmetrics.harness.demo_conflicts import run_conflict_phase, summary_row
    from lightmetrics.local.ingest_endpoint import IngestHTTPServer

    keys = TokenKeys.generate("k1")
    svc = _service(system, runtime, clock, keys, FakeMonotonic())
    server = IngestHTTPServer(lambda e, c: svc.handle(parse_lambda_event(e)).to_lambda(), port=0).start()
    alerts: list[Any] = []
    client = AgentClient(agent_id="demo-agent-00", token=mint_token(keys, "demo-agent-00"), endpoints=[server.url],
                         spool=tmp_path / "spool", backoff=BackoffPolicy(base_s=0, max_s=0, max_attempts=2),
                         parked_retry_s=3600, on_alert=alerts.append, sleep=lambda _s: None)
    try:
        ident = BatchIdentity.create("demo-agent-00", "boot-00-0001", 0, 19)
        client.enqueue(ident, make_frame(ident))
        assert client.run_once().accepted == 1
        client.enqueue(ident, make_frame(ident, variant=0.5))  # the same identity, different samples
        assert client.run_once().newly_parked == 1
        (parked,) = client.parked()
        qkey = parked.response["quarantine_key"]
        index_quarantine(system.work_context(policy=FAST), qkey)  # what the index pump does in the demo

        report = SimpleNamespace(conflict={"quarantine_key": qkey}, violations=[])
        out = run_conflict_phase(report, system, client)
        assert out["ok"] and report.violations == [], out
        assert out["retry_before_resolution"] == ["kept_parked"] and out["retry_after_resolution"] == ["dropped"]
        assert client.parked() == [] and [a.kind for a in alerts][-1] == "dropped"
        assert summary_row(report)[1] == "yes / yes / yes"
    finally:
        client.close()
        server.stop()
