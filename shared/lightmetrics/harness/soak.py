"""``lmctl soak``: everything at once, under faults, for a bounded time — then the books must balance.

What runs together against the embedded runtime (moto in its own process):

* collectors (OS processes) whose S3 clients inject a steady rate of faults — 409 on the record
  create, 503 SlowDown on the blob, timeouts whose request *did* land on both, 500 on reads,
  timeouts on HEADs — and that are SIGKILLed and restarted on a schedule (a real crash
  wherever it falls, between any two steps of an accept);
* agents, each an :class:`~lightmetrics.client.AgentClient` with a durable spool, producing
  batches at a steady pace, failing over between collectors, and now and then submitting other
  bytes for an identity already acknowledged (an identity conflict: parked, never lost);
* the indexers behind the event pump, which loses every Nth S3 event and delivers every Mth SQS
  message twice; the reconciler and the DLQ sweeper on their schedules;
* bootstrap walks — scoped to one agent at a time during the load (a full walk's cost grows with
  history), a full one at the end — and GC reaps (``dry_run`` off) through the Step Functions
  interpreter.

When the time is up the producers stop, the killer stops and every collector is brought back,
the agents drain their spools, the queues drain, then one reconcile and one walk run. The
verdict, each item a list of violations:

* ``lmctl verify --strict`` over the bucket;
* the ledger (:mod:`lightmetrics.harness.ledger`): every batch an agent saw acknowledged has exactly one
  record with its hash and an existing blob; nothing produced is missing from both the bucket's
  acknowledgements and the agent's spool (pending or parked);
* every accepted batch has its derived entries.

The soak stops by itself (``minutes`` plus a bounded settle phase) and exits 1 on any violation.

Example:
    >>> report = run_soak(SoakPlan(minutes=0.5))             # doctest: +SKIP
    >>> report.ok, report.counters["acknowledged"]          # doctest: +SKIP
    (True, 812)
"""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightmetrics.acceptance.auth import TokenKeys, mint_token
from lightmetrics.aws.s3_store import S3ObjectStore, s3_client_config
from lightmetrics.protocol.frame import Sample, encode_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec

BUCKET, TABLE, SECRET = "lightmetrics-soak", "lightmetrics-soak-control", "lightmetrics/soak-tokens"
_NS = 1_000_000_000


@dataclass(frozen=True)
class SoakPlan:
    """How hard to push. Rates are "every Nth" (deterministic), not probabilities."""

    minutes: float
    agents: int = 4
    collectors: int = 3
    batch_pause_s: float = 0.05  # between two batches of one agent
    samples_per_batch: int = 8
    conflict_every: int = 97  # every Nth batch of an agent is followed by other bytes for an earlier identity
    kill_every_s: float = 12.0
    restart_after_s: float = 1.5
    walk_every_s: float = 25.0
    gc_every_s: float = 45.0
    reconcile_every_s: float = 8.0
    drop_event_every: int = 37
    duplicate_delivery_every: int = 11
    s3_fault_every: int = 19  # base period of the collectors' injected S3 faults
    gc_grace_s: int = 12  # longer than the longest accept here (client timeout 10 s)
    retry_horizon_s: int = 60
    settle_timeout_s: float = 240.0
    seed: int = 7

    def __post_init__(self) -> None:
        if not 0 < self.minutes <= 24 * 60:
            raise ValueError("minutes must be > 0 and at most one day")
        if self.agents < 1 or self.collectors < 2:
            raise ValueError("a soak needs at least 1 agent and 2 collectors (failover)")


def collector_faults(plan: SoakPlan, i: int) -> list[dict[str, Any]]:
    """Collector i's ``LM_FAULTS``: a steady rate of each S3 fault kind, offset per collector."""
    n = plan.s3_fault_every
    return [
        {"fault": "409", "operation": "PutObject", "key_contains": "accepted/v1/", "every": n, "after": i, "times": -1},
        {"fault": "503", "operation": "PutObject", "key_contains": "raw-blobs/v1/", "every": n + 2, "after": i,
         "times": -1},
        {"fault": "timeout_after_landing", "operation": "PutObject", "key_contains": "accepted/v1/",
         "every": 2 * n + 1, "after": i, "times": -1},
        {"fault": "timeout_after_landing", "operation": "PutObject", "key_contains": "raw-blobs/v1/",
         "every": 2 * n + 3, "after": i, "times": -1},
        {"fault": "500", "operation": "GetObject", "every": n - 2, "after": i, "times": -1},
        {"fault": "timeout", "operation": "HeadObject", "every": n - 4, "after": i, "times": -1},
    ]


@dataclass
class SoakReport:
    plan: SoakPlan
    counters: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    verify: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    walks: list[dict[str, Any]] = field(default_factory=list)
    reaps: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # background-loop errors (not violations by themselves)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations and bool(self.verify.get("ok"))

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "minutes": self.plan.minutes, "counters": dict(sorted(self.counters.items())),
                "violations": self.violations[:50], "violation_count": len(self.violations),
                "verify": self.verify, "walks": self.walks, "reaps": self.reaps, "errors": self.errors[:20],
                "phase_seconds": {k: round(v, 1) for k, v in self.phases.items()}, "seconds": round(self.seconds, 1)}


def _every(n: int) -> Any:
    """A thread-safe predicate true on every nth call (the pump's drop/duplicate knobs)."""
    lock, seen = threading.Lock(), [0]

    def pick(_body: str) -> bool:
        with lock:
            seen[0] += 1
            return seen[0] % n == 0

    return pick


class _SoakAgent:
    """One agent: a producer thread spooling batches and a sender thread draining the spool."""

    def __init__(self, n: int, plan: SoakPlan, token: str, endpoints: list[str], spool: Path,
                 report: SoakReport, lock: threading.Lock) -> None:
        from lightmetrics.client import AgentClient

        self.n, self.plan, self.report, self.lock = n, plan, report, lock
        self.agent_id, self.boot_id = f"soak-agent-{n:02d}", f"boot-{n:02d}"
        self.produced: dict[BatchIdentity, str] = {}  # identity -> sha of the bytes spooled first
        self.alerts: list[Any] = []
        self.token = token
        self.client = AgentClient(agent_id=self.agent_id, token=token, endpoints=endpoints, spool=spool,
                                  parked_retry_s=5.0, request_timeout_s=10.0, on_alert=self.alerts.append,
                                  rng=random.Random(plan.seed * 1000 + n))
        self.client.endpoint_index = n % len(endpoints)
        self.rng = random.Random(plan.seed * 7919 + n)
        self.seq = 0
        self.outcomes: list[Any] = []

    def frame(self, ident: BatchIdentity, variant: float = 0.0) -> bytes:
        base = time.time_ns()
        samples = [Sample(metric="soak.value", labels={"agent": self.agent_id, "i": str(i)},
                          ts_unix_ns=base + i, value=self.rng.uniform(0, 100) + variant)
                   for i in range(ident.seq_end - ident.seq_start + 1)]
        return encode_frame(ident, samples, compress=self.rng.random() < 0.5)

    def produce(self, stop: threading.Event) -> None:
        per = self.plan.samples_per_batch
        batch = 0
        while not stop.is_set():
            ident = BatchIdentity.create(self.agent_id, self.boot_id, self.seq, self.seq + per - 1)
            self.seq += per
            body = self.frame(ident)
            self.client.enqueue(ident, body)
            self.produced[ident] = hashlib.sha256(body).hexdigest()
            batch += 1
            if batch % self.plan.conflict_every == 0:
                self._conflict()
            stop.wait(self.plan.batch_pause_s)

    def _conflict(self) -> None:
        """Other bytes for an identity produced earlier and already sent (acknowledged, usually)."""
        done = [o.identity for o in list(self.outcomes) if o.action in ("accepted", "duplicate")]
        if not done:
            return
        ident = self.rng.choice(done)
        spool_dir = Path(tempfile.mkdtemp(prefix="lm-soak-conflict-"))
        try:
            # Another client instance on a scratch spool: the agent's own spool refuses other bytes
            # for an identity it holds, and a real conflict is a *different* submitter anyway.
            from lightmetrics.client import AgentClient

            other = AgentClient(agent_id=self.agent_id, token=self.token,
                                endpoints=[e.url for e in self.client.endpoints], spool=spool_dir,
                                request_timeout_s=10.0, on_alert=self.alerts.append)
            other.enqueue(ident, self.frame(ident, variant=0.5))
            out = other.drain(timeout_s=30)
            with self.lock:
                self.report.counters["conflicts submitted"] += 1
                self.report.counters["conflicts parked"] += out.newly_parked
            other.close()
        finally:
            for p in sorted(spool_dir.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
            spool_dir.rmdir()

    def send(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                out = self.client.run_once()
            except Exception as exc:  # an agent that stops is a finding, not a crash of the soak
                with self.lock:
                    self.report.errors.append(f"{self.agent_id}: {type(exc).__name__}: {exc}")
                stop.wait(1.0)
                continue
            self._count(out)
            if not out.outcomes:
                stop.wait(0.1)

    def _count(self, out: Any) -> None:
        self.outcomes.extend(out.outcomes)
        with self.lock:
            for o in out.outcomes:
                self.report.counters[f"client {o.action}"] += 1
            self.report.counters["client failovers"] += out.failovers
            self.report.counters["client network errors"] += out.network_errors
            self.report.counters["client timeouts"] += out.timeouts
            for word, k in out.answers.items():
                self.report.counters[f"answer {word}"] += k

    def drain(self, timeout_s: float) -> bool:
        out = self.client.drain(timeout_s=timeout_s, poll_s=0.2)
        self._count(out)
        return out.pending == 0


def _periodic(stop: threading.Event, every_s: float, job: Any, first_after_s: float) -> threading.Thread:
    def loop() -> None:
        if stop.wait(first_after_s):
            return
        while True:
            job()
            if stop.wait(every_s):
                return

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def run_soak(plan: SoakPlan, *, port: int = 0, show_progress: bool = True) -> SoakReport:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from lightmetrics.derived.verify import verify
    from lightmetrics.derived.walk import LeaseHeld as WalkLeaseHeld
    from lightmetrics.harness.ledger import check_acknowledged, missing_derived, missing_derived_lines
    from lightmetrics.local.collectors import CollectorFleet, collector_environment
    from lightmetrics.local.server import RemoteRuntime
    from lightmetrics.local.system import LocalSystem
    from lightmetrics.reaps import LeaseHeld as ReapLeaseHeld

    report = SoakReport(plan)
    started = time.monotonic()
    overrides = {"gc_grace_s": plan.gc_grace_s, "retry_horizon_s": plan.retry_horizon_s}
    hosted = {"LM_BUCKET": BUCKET, "LM_TABLE": TABLE, "LM_AUTH_SECRET_ID": SECRET, "LM_PREFIX": "",
              "LM_GC_GRACE_S": str(plan.gc_grace_s), "LM_RETRY_HORIZON_S": str(plan.retry_horizon_s)}
    runtime = RemoteRuntime.spawn(port=port, env=hosted)
    system = LocalSystem(runtime, bucket=BUCKET, table=TABLE, secret_name=SECRET, overrides=overrides)
    fleet: CollectorFleet | None = None
    lock = threading.Lock()
    stop_chaos, stop_producers, stop_senders = threading.Event(), threading.Event(), threading.Event()
    producers: list[threading.Thread] = []
    senders: list[threading.Thread] = []
    chaos: list[threading.Thread] = []
    try:
        system.provision()
        keys = TokenKeys.parse(system.made["secret_value"])
        env = collector_environment(system)
        fleet = CollectorFleet(plan.collectors, env,
                               {i: {"LM_FAULTS": json.dumps(collector_faults(plan, i))} for i in range(plan.collectors)})
        codec = KeyCodec(system.prefix)
        store = S3ObjectStore(runtime.boto3_client("s3", config=s3_client_config()), BUCKET)
        system.start(reconcile_every_s=plan.reconcile_every_s, sweep_every_s=plan.reconcile_every_s * 2,
                     drop=_every(plan.drop_event_every), duplicate=_every(plan.duplicate_delivery_every))
        rng = random.Random(plan.seed)

        with tempfile.TemporaryDirectory(prefix="lm-soak-") as workdir:
            agents = [_SoakAgent(i, plan, mint_token(keys, f"soak-agent-{i:02d}"), fleet.endpoints(),
                                 Path(workdir) / f"agent-{i:02d}", report, lock) for i in range(plan.agents)]
            for a in agents:
                for target, ev, group in ((a.produce, stop_producers, producers), (a.send, stop_senders, senders)):
                    t = threading.Thread(target=target, args=(ev,), daemon=True)
                    t.start()
                    group.append(t)

            def kill_one() -> None:
                assert fleet is not None
                alive = fleet.alive()
                if len(alive) < 2:
                    return
                victim = rng.choice(alive)
                fleet.kill(victim)
                report.counters["collectors killed (SIGKILL)"] += 1
                time.sleep(plan.restart_after_s)
                try:
                    fleet.restart(victim)
                    report.counters["collectors restarted"] += 1
                except Exception as exc:
                    report.errors.append(f"restart of collector-{victim + 1}: {exc}")

            def walk_once(agent: str | None = None) -> dict[str, Any] | None:
                control = system.walk_control(system.work_context(component="walk"))
                try:
                    started_walk = control.start(agent=agent, page_size=200, parallelism=4)
                except WalkLeaseHeld:
                    report.counters["walks refused (lease held)"] += 1
                    return None
                result = control.follow(started_walk, poll_s=0.3, timeout_s=plan.settle_timeout_s)
                entry = {"scope": agent or "all", "status": result.status, "keys": result.summary.get("keys", 0),
                         "repairs": result.summary.get("repairs", 0), "executions": len(result.executions),
                         "detail": result.detail}
                report.walks.append(entry)
                report.counters[f"walks {result.status}"] += 1
                return entry

            def gc_once() -> None:
                control = system.reap_control(system.work_context(component="reap"))
                try:
                    arn = control.start(mode="gc", dry_run=False)
                except ReapLeaseHeld:
                    report.counters["reaps refused (lease held)"] += 1
                    return
                result = control.follow(arn, poll_s=0.5, timeout_s=plan.settle_timeout_s)
                counts = {k: result.report.get(k) for k in ("examined", "marked", "purged", "restored")}
                report.reaps.append({"mode": "gc", "status": result.status, **counts, "detail": result.detail})
                report.counters[f"gc reaps {result.status}"] += 1
                for k, v in counts.items():
                    report.counters[f"gc {k}"] += int(v or 0)

            def guarded(name: str, job: Any) -> Any:
                def run() -> None:
                    try:
                        job()
                    except Exception as exc:
                        report.errors.append(f"{name}: {type(exc).__name__}: {exc}")

                return run

            chaos.append(_periodic(stop_chaos, plan.kill_every_s, guarded("killer", kill_one), plan.kill_every_s / 2))
            walk_agents = iter(a.agent_id for _ in range(10**6) for a in agents)
            chaos.append(_periodic(stop_chaos, plan.walk_every_s, guarded("walk", lambda: walk_once(next(walk_agents))),
                                   plan.walk_every_s / 2))
            chaos.append(_periodic(stop_chaos, plan.gc_every_s, guarded("gc", gc_once), plan.gc_every_s / 2))

            mark = time.monotonic()
            total = plan.minutes * 60
            with Progress(TextColumn("[bold]soaking"), BarColumn(), TextColumn("{task.fields[acks]} acknowledged"),
                          TimeElapsedColumn(), disable=not show_progress) as progress:
                task = progress.add_task("soak", total=total, acks=0)
                while (elapsed := time.monotonic() - mark) < total:
                    time.sleep(min(1.0, total - elapsed))
                    progress.update(task, completed=time.monotonic() - mark,
                                    acks=report.counters["client accepted"] + report.counters["client duplicate"])
            report.phases["soak"] = time.monotonic() - mark

            # -- settle: no new work, no more kills; every collector back; spools drained
            mark = time.monotonic()
            stop_producers.set()
            stop_chaos.set()
            for t in producers + chaos:  # a walk or reap in flight finishes first
                t.join(timeout=plan.settle_timeout_s)
            stop_senders.set()
            for t in senders:
                t.join(timeout=plan.settle_timeout_s)
            for i in range(len(fleet)):
                if fleet.urls[i] is None:
                    fleet.restart(i)
            for a in agents:
                if not a.drain(timeout_s=plan.settle_timeout_s):
                    report.violations.append(f"{a.agent_id}: spool not drained within {plan.settle_timeout_s} s")
            report.phases["agents drain"] = time.monotonic() - mark
            mark = time.monotonic()
            if not system.drain(timeout_s=plan.settle_timeout_s):
                report.violations.append("the index queues did not drain")
            assert system.pump is not None
            report.counters["S3 events dropped"] = len(system.pump.dropped)
            report.counters["SQS deliveries duplicated"] = system.pump.duplicated
            report.counters["objects indexed"] = system.pump.delivered
            system.stop()
            rec = system.reconciler(system.work_context(component="reconcile")).run()
            report.counters["final reconcile repairs"] = int(rec.to_json()["outcomes"].get("DONE", 0))
            final_walk = walk_once()
            if not final_walk or final_walk["status"] != "finished":
                report.violations.append(f"the final walk did not finish: {final_walk}")
            report.phases["reconcile + walk"] = time.monotonic() - mark

            # -- the verdict
            mark = time.monotonic()
            checked = verify(system.work_context(), strict=True)
            report.verify = {"ok": checked.ok, "counts": checked.counts, "violation_counts": checked.violation_counts(),
                             "violations": [v.to_json() for v in checked.violations[:20]],
                             "acknowledged": len(checked.acknowledged)}
            for v in checked.violations[:20]:
                report.violations.append(f"verify: {v.rule}: {v.detail}")
            acked: dict[BatchIdentity, set[str]] = {}
            for a in agents:
                for o in a.outcomes:
                    if o.action in ("accepted", "duplicate"):
                        acked.setdefault(o.identity, set()).add(o.frame_sha256)
            ledger = check_acknowledged(store, codec, acked)
            report.violations += ledger.violations
            report.counters["acknowledged identities"] = len(acked)
            report.counters["ledger verified (record + blob)"] = ledger.verified
            for a in agents:
                held = {b.identity for b in a.client.pending()} | {p.identity for p in a.client.parked()}
                lost = [i for i in a.produced if i not in acked and i not in held]
                for ident in lost[:10]:
                    report.violations.append(f"{ident}: produced, never acknowledged, and not in the spool")
                report.counters["produced"] += len(a.produced)
                report.counters["still spooled or parked"] += len(held)
                report.counters["alerts (parked/dropped)"] += len(a.alerts)
                for ident, sha in a.produced.items():
                    if ident in acked and acked[ident] != {sha}:
                        report.violations.append(f"{ident}: acknowledged {acked[ident]} but the spool held {sha}")
            missing = missing_derived(store, codec, ledger.manifests)
            report.violations += missing_derived_lines(missing)
            report.counters["S3 requests (all components)"] = runtime.request_count("s3")
            report.phases["verdict"] = time.monotonic() - mark
            for a in agents:
                a.client.close()
    finally:
        stop_producers.set()
        stop_chaos.set()
        stop_senders.set()
        system.stop()
        if fleet is not None:
            report.counters["collector kills (total)"] = fleet.kills
            fleet.stop()
        runtime.stop()
    report.seconds = time.monotonic() - started
    return report
