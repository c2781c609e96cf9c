"""``lmctl demo``: the whole acceptance plane on one machine, under the faults it is built for.

What runs: the embedded runtime (moto as S3/DynamoDB/Secrets Manager), three collectors as
separate OS processes each serving the real ingest handler over HTTP, and simulated agents
(threads) that send batches concurrently. On purpose:

* agents resend some batches to a second collector (must answer ``duplicate``);
* one agent submits different content for an identity already accepted (must answer 409 with
  its quarantine manifest);
* one collector stalls right after a raw-blob PUT has landed (fault injected at its S3 client)
  and is then killed with SIGKILL — a real crash between step 4 and step 5; its agents fail
  over and the batch is accepted elsewhere.

Then the ledger check: every batch an agent saw acknowledged has exactly one acceptance record
with the same hash and an existing blob. Then the derived state: the indexers drain the event
queues, the reconciler repairs a lost event and the poisoned record is a blocker. Last, the walk:
a sample of derived entries is deleted behind the system's back, a full bootstrap walk runs through
the Step Functions interpreter (its Lambda tasks in the runtime's process, continuing across
executions), and ``lmctl verify`` must pass. Any violation makes the demo exit 1.
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
from urllib.parse import unquote_plus

from lightmetrics.acceptance.auth import TokenKeys, mint_token
from lightmetrics.aws.s3_store import S3ObjectStore, s3_client_config
from lightmetrics.cli.output import err_console, grid
from lightmetrics.harness.ledger import check_acknowledged, missing_derived, missing_derived_lines
from lightmetrics.local.collectors import CollectorFleet, collector_environment
from lightmetrics.protocol.frame import Sample, encode_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.protocol.manifests import AcceptedBatchManifest

BUCKET, TABLE, SECRET = "lightmetrics-demo", "lightmetrics-demo-control", "lightmetrics/ingest-tokens"


@dataclass(frozen=True)
class DemoScale:
    agents: int
    batches_per_agent: int
    samples_per_batch: int = 20
    resend_every: int = 7  # every Nth batch is also sent to a second collector
    collectors: int = 3
    kill_after_blob_puts: int = 40  # the victim stalls after this many blob PUTs, then is killed

    @property
    def batches(self) -> int:
        return self.agents * self.batches_per_agent


#: What the demo breaks on purpose; each is checked in the report.
PLANTED_FAULTS = ("The demo plants faults on purpose, each checked in the report: a collector is killed mid-accept "
                  "(its agents fail over); an agent sends other content for an accepted batch (a conflict an "
                  "operator resolves); an acceptance record is poisoned (its indexer logs 'blocked', and the "
                  "operator skips it); an S3 event is dropped (the reconciler repairs it); derived entries are "
                  "deleted behind the system's back (verify finds them, the walk restores them); orphan blobs "
                  "and an expired hour are reaped.")
SCALES = {"quick": DemoScale(agents=10, batches_per_agent=25), "small": DemoScale(agents=10, batches_per_agent=100),
          "full": DemoScale(agents=10, batches_per_agent=300)}


@dataclass
class Ack:
    identity: BatchIdentity
    sha256: str
    duplicate: bool


@dataclass
class DemoReport:
    scale: DemoScale
    answers: Counter[str] = field(default_factory=Counter)
    failovers: int = 0
    acks: list[Ack] = field(default_factory=list)
    conflict: dict[str, Any] = field(default_factory=dict)
    killed: dict[str, Any] = field(default_factory=dict)
    s3_requests: int = 0
    seconds: float = 0.0
    verified: int = 0
    violations: list[str] = field(default_factory=list)
    index_s3_requests: int = 0
    indexed_objects: int = 0
    derived: dict[str, Any] = field(default_factory=dict)
    dropped_event: dict[str, Any] = field(default_factory=dict)
    poisoned: dict[str, Any] = field(default_factory=dict)
    blockers: list[dict[str, Any]] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    walk: dict[str, Any] = field(default_factory=dict)
    verify: dict[str, Any] = field(default_factory=dict)
    reaps: dict[str, Any] = field(default_factory=dict)  # issue 6: lightmetrics.harness.demo_reaps

    @property
    def accepted(self) -> int:
        return self.answers["accepted"]

    @property
    def ok(self) -> bool:
        return (
            not self.violations
            and self.verified == len({a.identity for a in self.acks})
            and self.conflict.get("ok", False)
            and self.killed.get("killed", False)
            and self.derived.get("complete", False)
            and self.dropped_event.get("repaired", False)
            and self.poisoned.get("listed", False)
            and self.walk.get("ok", False)
            and self.verify.get("ok", False)
            and self.reaps.get("ok", False)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "collectors": self.scale.collectors,
            "agents": self.scale.agents,
            "batches": self.scale.batches,
            "answers": dict(self.answers),
            "accepted": self.accepted,
            "duplicates": self.answers["duplicate"],
            "identity_conflicts": self.answers["identity_conflict"],
            "unavailable_503": self.answers["unavailable"],
            "failovers": self.failovers,
            "acknowledged_identities": len({a.identity for a in self.acks}),
            "verified": self.verified,
            "violations": self.violations,
            "conflict": self.conflict,
            "killed_collector": self.killed,
            "s3_requests": self.s3_requests,
            "s3_requests_per_accepted_batch": round(self.s3_requests / self.accepted, 3) if self.accepted else None,
            "indexed_objects": self.indexed_objects,
            "index_s3_requests": self.index_s3_requests,
            "s3_requests_per_indexed_object": round(self.index_s3_requests / self.indexed_objects, 3)
            if self.indexed_objects else None,
            "derived": self.derived,
            "dropped_event": self.dropped_event,
            "poisoned": self.poisoned,
            "open_blockers": self.blockers,
            "walk": self.walk,
            "verify": self.verify,
            "reaps": self.reaps,
            "seconds": round(self.seconds, 1),
            "phase_seconds": {k: round(v, 1) for k, v in self.phases.items()},
        }

    def print(self, console: Any) -> None:
        from lightmetrics.harness.demo_conflicts import summary_row
        from lightmetrics.harness.demo_reaps import summary_rows as reap_rows

        d = self.to_json()
        rows = [
            ("collectors (processes)", d["collectors"]),
            ("agents", d["agents"]),
            ("batches", d["batches"]),
            ("accepted", d["accepted"]),
            ("duplicates", d["duplicates"]),
            ("identity conflicts", d["identity_conflicts"]),
            ("503 unavailable", d["unavailable_503"]),
            ("failovers (collector unreachable)", d["failovers"]),
            ("collector killed mid-accept", "yes" if self.killed.get("killed") else "NO"),
            ("S3 requests (ingest)", d["s3_requests"]),
            ("S3 requests per accepted batch", d["s3_requests_per_accepted_batch"]),
            ("acknowledged identities verified", f"{d['verified']}/{d['acknowledged_identities']}"),
            ("objects indexed (event pump)", d["indexed_objects"]),
            ("S3 requests per indexed object", d["s3_requests_per_indexed_object"]),
            ("derived entries complete", "yes" if self.derived.get("complete") else "NO"),
            ("dropped event repaired by reconciler", "yes" if self.dropped_event.get("repaired") else "NO"),
            ("poisoned record in blockers list", "yes" if self.poisoned.get("listed") else "NO"),
            ("derived entries deleted / restored by the walk",
             f"{self.walk.get('deleted', 0)} / {self.walk.get('restored', 0)}"),
            ("walk (Step Functions): executions, keys, repairs",
             f"{len(self.walk.get('executions', []))}, {self.walk.get('keys', 0)}, {self.walk.get('repairs', 0)}"),
            ("walk keys/s; S3 requests per walked key",
             f"{self.walk.get('keys_per_s')}; {self.walk.get('s3_requests_per_key')}"),
            # "acknowledged" above is an agent's 200; here it is a finding an operator skipped
            ("lmctl verify (strict)", ("clean" if self.verify.get("ok") else
                                       f"{len(self.verify.get('violations', []))} violations")
             + f", {len(self.verify.get('acknowledged', []))} skipped by the operator (the poisoned record)"),
            summary_row(self),
            *reap_rows(self),
            ("violations", len(self.violations)),
            ("seconds", d["seconds"]),
        ]
        console.print(grid("lightmetrics demo", ["what", "#"], rows))
        for v in self.violations[:20]:
            console.print(f"[red]violation:[/] {v}")
        console.print("[bold green]OK[/]" if self.ok else "[bold red]FAILED[/]")


def _samples(agent: int, batch: int, n: int, base_ns: int, variant: float = 0.0) -> list[Sample]:
    rng = random.Random(agent * 1_000_003 + batch)
    return [
        Sample(
            metric=("cpu.usage" if i % 2 == 0 else "mem.rss"),
            labels={"host": f"host-{agent:02d}", "core": str(i % 4)},
            ts_unix_ns=base_ns + (batch * n + i) * 1_000_000_000,
            value=round(rng.uniform(0, 100), 3) + variant,
        )
        for i in range(n)
    ]


def _victim_faults(scale: DemoScale, marker: Path) -> dict[str, str]:
    """The victim collector stalls right after a raw-blob PUT landed (then it is killed)."""
    rule = {"fault": "stall_after_landing", "operation": "PutObject", "key_contains": "raw-blobs/v1/",
            "after": scale.kill_after_blob_puts, "times": 1, "stall_s": 120, "marker_file": str(marker)}
    return {"LM_FAULTS": json.dumps([rule])}


def _kill_victim_when_stalled(fleet: CollectorFleet, victim: int, marker: Path, stop: threading.Event,
                              report: DemoReport) -> None:
    while not stop.is_set():
        if marker.exists():
            key = marker.read_text()
            fleet.kill(victim)  # SIGKILL: no cleanup, no response
            report.killed = {
                "killed": True,
                "collector": f"collector-{victim + 1}",
                "signal": "SIGKILL",
                "stalled_after": "raw blob PUT landed, before the acceptance record",
                "blob_key": key.split("/", 4)[-1] if key else "",
            }
            return
        time.sleep(0.02)


class _Agent:
    """A simulated agent: encodes its batches, spools them and drains the spool with the agent
    client (:class:`lightmetrics.client.AgentClient`), which fails over across the collectors,
    backs off on 503 and parks conflicts. ``client`` stays usable after the accept phase (its
    parked batches, ``retry_parked()``)."""

    def __init__(self, n: int, token: str, scale: DemoScale, endpoints: list[str], report: DemoReport,
                 spool_root: Path) -> None:
        from lightmetrics.client import AgentClient, BackoffPolicy

        self.n, self.scale, self.report = n, scale, report
        self.agent_id, self.boot_id = f"demo-agent-{n:02d}", f"boot-{n:02d}-0001"
        self.lock = threading.Lock()
        self.alerts: list[Any] = []
        self.client = AgentClient(
            agent_id=self.agent_id,
            token=token,
            endpoints=endpoints,
            spool=spool_root / self.agent_id,
            # demo pace: short waits, and many attempts so a collector killed mid-run is ridden out
            backoff=BackoffPolicy(base_s=0.05, max_s=1.0, max_attempts=60, honor_retry_after=False),
            parked_retry_s=3600.0,
            request_timeout_s=30.0,
            on_alert=self.alerts.append,
            rng=random.Random(n),
        )

    def identity(self, batch: int) -> BatchIdentity:
        per = self.scale.samples_per_batch
        return BatchIdentity.create(self.agent_id, self.boot_id, batch * per, batch * per + per - 1)

    def frame(self, batch: int, base_ns: int, variant: float = 0.0) -> bytes:
        samples = _samples(self.n, batch, self.scale.samples_per_batch, base_ns, variant)
        return encode_frame(self.identity(batch), samples, compress=batch % 2 == 0)

    def send(self, ident: BatchIdentity, body: bytes, start: int) -> dict[str, Any]:
        """Spool ``body`` and drain the spool, starting at collector ``start``; the batch's last answer."""
        self.client.endpoint_index = start % len(self.client.endpoints)
        self.client.enqueue(ident, body)
        drained = self.client.drain(timeout_s=300)
        with self.lock:
            self.report.answers.update(drained.answers)
            self.report.failovers += drained.failovers
        mine = [o for o in drained.outcomes if o.identity == ident]
        if not mine or mine[-1].action == "unavailable":
            raise RuntimeError(f"{ident}: no collector answered ({drained.to_json()})")
        return mine[-1].body

    def run(self, base_ns: int, tick: Any) -> None:
        for batch in range(self.scale.batches_per_agent):
            ident, body = self.identity(batch), self.frame(batch, base_ns)
            first = (self.n + batch) % self.scale.collectors
            answer = self.send(ident, body, first)
            self._record(ident, body, answer)
            if batch % self.scale.resend_every == 0:
                # at-least-once delivery: the same bytes again, to another collector
                self._record(ident, body, self.send(ident, body, first + 1))
            tick()

    def _record(self, ident: BatchIdentity, body: bytes, answer: dict[str, Any]) -> None:
        if answer.get("status") in ("accepted", "duplicate"):
            sha = hashlib.sha256(body).hexdigest()
            if answer.get("frame_sha256") != sha:
                self.report.violations.append(f"{ident}: answer hash {answer.get('frame_sha256')} != sent {sha}")
            with self.lock:
                self.report.acks.append(Ack(ident, sha, answer["status"] == "duplicate"))
        else:
            self.report.violations.append(f"{ident}: unexpected answer {answer}")


def _verify(report: DemoReport, store: S3ObjectStore, codec: KeyCodec) -> dict[BatchIdentity, AcceptedBatchManifest]:
    """The ledger check (:func:`lightmetrics.harness.ledger.check_acknowledged`) over the demo's acks."""
    acked: dict[BatchIdentity, set[str]] = {}
    for ack in report.acks:
        acked.setdefault(ack.identity, set()).add(ack.sha256)
    check = check_acknowledged(store, codec, acked)
    report.violations += check.violations
    report.verified += check.verified
    return check.manifests


def _deliberate_conflict(agent: _Agent, base_ns: int, store: S3ObjectStore, report: DemoReport) -> None:
    ident = agent.identity(0)
    body = agent.frame(0, base_ns, variant=0.5)  # same identity, different content
    answer = agent.send(ident, body, 0)
    qkey = answer.get("quarantine_key")
    evidence = store.get(qkey) if qkey else None
    # The agent client parks it: kept with a sidecar, outside the normal order, and alerts.
    parked = [p for p in agent.client.parked() if p.identity == ident]
    alerted = [a for a in agent.alerts if a.kind == "parked" and a.identity == ident]
    report.conflict = {
        "identity": str(ident),
        "status": answer.get("status"),
        "quarantine_key": qkey,
        "evidence_present": evidence is not None,
        "resolution": answer.get("resolution"),
        "parked": [p.to_json() for p in parked],
        "parked_bytes_identical": bool(parked) and parked[0].read_bytes() == body,
        "alerts": len(alerted),
        "ok": answer.get("status") == "identity_conflict" and evidence is not None
        and len(parked) == 1 and parked[0].read_bytes() == body and len(alerted) == 1,
    }


def _drop_first_raw_blob_event(dropped: list[str]) -> Any:
    """The pump's chaos knob: lose the first raw-blob notification (a lost S3 event)."""

    def drop(body: str) -> bool:
        if dropped or "raw-blobs%2Fv1" not in body:
            return False
        dropped.append(unquote_plus(json.loads(body)["Records"][0]["s3"]["object"]["key"]))
        return True

    return drop


def _check_derived(report: DemoReport, store: S3ObjectStore, codec: KeyCodec, manifests: dict[BatchIdentity, Any]) -> None:
    """Every accepted batch has all its derived entries (three LISTs, not a request per batch)."""
    missing = missing_derived(store, codec, manifests)
    report.derived = {"batches": len(manifests), "missing": dict(missing), "complete": not missing}
    report.violations += missing_derived_lines(missing)


#: how many entries of each accepted-* index the walk phase deletes
WALK_SAMPLE = 20


def _walk_phase(report: DemoReport, system: Any, runtime: Any, store: S3ObjectStore, codec: KeyCodec,
                poison_key: str, show_progress: bool) -> None:
    """Delete a sample of derived entries, walk through Step Functions, then ``lmctl verify``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from lightmetrics.derived.verify import verify
    from lightmetrics.ops.blocker_actions import skip

    rng = random.Random(5)
    deleted: list[str] = []
    for prefix in ("accepted-by-time/v1/", "accepted-by-blob/v1/"):
        keys = sorted(store.list_keys(codec.prefix + prefix, limit=10**7))
        for key in rng.sample(keys, min(WALK_SAMPLE, len(keys))):
            store.delete(key)  # versioned: a delete marker
            deleted.append(key)
    ctx = system.work_context()
    # The poisoned record is a blocker; the operator skips it (audited, with a reason), so the
    # walk counts it as skipped instead of blocking on it again, and verify acknowledges it.
    for b in ctx.blockers.list():
        if b.object_key == poison_key:
            skip(ctx, b.work_key, who="demo", reason="deliberately poisoned by the demo; kept as evidence")

    control = system.walk_control(ctx)
    requests_before = runtime.request_count("s3", "walk")
    t0 = time.monotonic()
    # Full: entries deleted behind the system's back hide behind a present accepted-by-time entry
    # (a default walk checks only that one, docs/walks.md); verify reports them, a full walk repairs them.
    started = control.start(full=True, page_size=50, parallelism=4, max_rounds=2)  # spans executions at every scale
    with Progress(TextColumn("[bold]walking"), BarColumn(), MofNCompleteColumn(), TextColumn("partitions"),
                  TimeElapsedColumn(), disable=not show_progress, console=err_console) as progress:
        task = progress.add_task("walk", total=None)

        def update(summary: dict[str, Any]) -> None:
            progress.update(task, total=summary.get("partitions_found") if summary.get("enumeration_complete") else None,
                            completed=summary.get("partitions_done") or 0)

        result = control.follow(started, on_progress=update, poll_s=0.2, timeout_s=300)
    seconds = time.monotonic() - t0
    s3_requests = runtime.request_count("s3", "walk") - requests_before
    histories = [control.history(arn) for arn in result.executions]
    present = set(store.list_keys(codec.prefix + "accepted-by-time/v1/", limit=10**7)) | set(
        store.list_keys(codec.prefix + "accepted-by-blob/v1/", limit=10**7))
    summary = result.summary
    report.walk = {
        "status": result.status,
        "detail": result.detail,
        "epoch": started.epoch,
        "executions": result.executions,
        "history_events_per_execution": [len(h) for h in histories],
        "lambda_tasks_scheduled": sum(1 for h in histories for e in h if e["type"] == "LambdaFunctionScheduled"),
        "deleted": len(deleted),
        "restored": sum(1 for k in deleted if k in present),
        "keys": summary.get("keys", 0),
        "pages": summary.get("pages", 0),
        "partitions": summary.get("partitions_done", 0),
        "repairs": summary.get("repairs", 0),
        "outcomes": summary.get("outcomes", {}),
        "watermark_withheld": summary.get("watermark_withheld"),
        "seconds": round(seconds, 2),
        "keys_per_s": round(summary.get("keys", 0) / seconds, 1) if seconds else None,
        "s3_requests": s3_requests,
        "s3_requests_per_key": round(s3_requests / summary["keys"], 2) if summary.get("keys") else None,
    }
    report.walk["ok"] = (result.status == "finished" and report.walk["restored"] == len(deleted)
                         and len(result.executions) >= 2)
    if not report.walk["ok"]:
        report.violations.append(f"the walk did not restore every deleted entry: {report.walk}")
    checked = verify(system.work_context(), strict=True)
    report.verify = {
        "ok": checked.ok,
        "counts": checked.counts,
        "violations": [v.to_json() for v in checked.violations[:20]],
        "violation_counts": checked.violation_counts(),
        "warnings": len(checked.warnings),
        "acknowledged": [a.to_json() for a in checked.acknowledged],
    }
    for v in checked.violations[:20]:
        report.violations.append(f"verify: {v.rule}: {v.detail}: {', '.join(v.keys)}")


def run_demo(scale: DemoScale, *, port: int = 0, show_progress: bool = True) -> DemoReport:
    from lightmetrics.composition.hosting import install
    from lightmetrics.local.hosting import host_from_env

    # This process drives a local runtime: it is a local host too (its reap inputs use the demo's
    # short waits, which only a local host may, docs/protocol.md §18 S4). Put back on return.
    previous_host = install(host_from_env({}))
    try:
        return _run_demo(scale, port=port, show_progress=show_progress)
    finally:
        install(previous_host)


def _run_demo(scale: DemoScale, *, port: int, show_progress: bool) -> DemoReport:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from lightmetrics.local.server import RemoteRuntime
    from lightmetrics.local.system import LocalSystem

    report = DemoReport(scale)
    started = time.monotonic()
    if show_progress:  # said first, so that the faults' own log lines surprise nobody
        err_console.print(PLANTED_FAULTS, markup=False)
    # moto gets a process (and a core) of its own; the state machines' Lambda tasks (the walk)
    # run in that process too, configured by these LM_* variables.
    hosted = {"LM_BUCKET": BUCKET, "LM_TABLE": TABLE, "LM_AUTH_SECRET_ID": SECRET, "LM_PREFIX": ""}
    from lightmetrics.harness.demo_reaps import HOSTED_ENV as REAP_ENV  # issue 6: reap tasks' horizon, grace, clock

    hosted.update(REAP_ENV)
    runtime = RemoteRuntime.spawn(port=port, env=hosted)
    system = LocalSystem(runtime, bucket=BUCKET, table=TABLE, secret_name=SECRET)
    collectors: CollectorFleet | None = None
    try:
        system.provision()
        keys = TokenKeys.parse(system.made["secret_value"])
        env = collector_environment(system)
        codec = KeyCodec(system.prefix)
        store = S3ObjectStore(runtime.boto3_client("s3", config=s3_client_config()), BUCKET)
        with tempfile.TemporaryDirectory(prefix="lm-demo-") as workdir:
            # -- 1. accept: collectors (processes) and agents (threads), one collector killed
            marker, victim = Path(workdir) / "victim-stalled", scale.collectors - 1
            collectors = CollectorFleet(scale.collectors, env, {victim: _victim_faults(scale, marker)})
            agents = [_Agent(i, mint_token(keys, f"demo-agent-{i:02d}"), scale, collectors.endpoints(), report,
                             Path(workdir) / "spools") for i in range(scale.agents)]
            base_ns = time.time_ns() - 3600 * 1_000_000_000
            stop = threading.Event()
            killer = threading.Thread(target=_kill_victim_when_stalled, args=(collectors, victim, marker, stop, report),
                                      daemon=True)
            killer.start()
            # The indexers consume notifications while agents send, as Lambda would. One raw-blob
            # event is lost on purpose; a poisoned record must end up as a blocker.
            poison_key = codec.accepted(BatchIdentity.create("demo-poison", "boot-0", 0, 0))
            store.client.put_object(Bucket=BUCKET, Key=poison_key, Body=b'{"schema": "not a manifest"}',
                                    IfNoneMatch="*")
            dropped: list[str] = []
            system.start(drop=_drop_first_raw_blob_event(dropped))
            mark = time.monotonic()
            with Progress(
                TextColumn("[bold]accepting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                disable=not show_progress, transient=False, console=err_console,
            ) as progress:
                task = progress.add_task("batches", total=scale.batches)
                lock = threading.Lock()

                def tick() -> None:
                    with lock:
                        progress.advance(task)

                threads = [threading.Thread(target=a.run, args=(base_ns, tick)) for a in agents]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            report.s3_requests = runtime.request_count("s3", "ingest")
            report.phases["accept"] = time.monotonic() - mark
            _deliberate_conflict(agents[0], base_ns, store, report)
            stop.set()
            mark = time.monotonic()
            manifests = _verify(report, store, codec)
            report.phases["ledger check"] = time.monotonic() - mark
            mark = time.monotonic()

            # -- 2. index: wait until the pump has delivered everything that was queued
            with Progress(TextColumn("[bold]indexing"), TimeElapsedColumn(), disable=not show_progress,
                          console=err_console) as progress:
                progress.add_task("drain", total=None)
                drained = system.drain(timeout_s=300)
            report.index_s3_requests = runtime.request_count("s3", "index")
            report.indexed_objects = system.pump.delivered if system.pump else 0
            system.stop()
            if not drained:
                report.violations.append("the index queues did not drain within 300 s")
            report.phases["index drain"] = time.monotonic() - mark
            mark = time.monotonic()
            from lightmetrics.harness.demo_conflicts import run_conflict_phase  # issue 8: list, resolve, agent drops

            run_conflict_phase(report, system, agents[0].client)
            report.phases["conflict resolution"] = time.monotonic() - mark
            mark = time.monotonic()

            # -- 3. reconcile: the lost event's entry is repaired; the poison stays a blocker
            ctx = system.work_context()
            lost_sha = codec.parse(dropped[0]).sha256 if dropped else ""

            def entry_present() -> bool:
                return any(codec.parse(k).sha256 == lost_sha for k in
                           store.list_keys(codec.prefix + "raw-blobs-by-time/v1/", limit=10**7))

            present_before = entry_present()
            rec = system.reconciler(ctx).run()
            present_after = entry_present()
            report.dropped_event = {"blob_key": dropped[0] if dropped else None, "entry_before_reconcile": present_before,
                                    "entry_after_reconcile": present_after,
                                    "repaired": bool(dropped) and not present_before and present_after,
                                    "reconcile": rec.to_json()}
            if not report.dropped_event["repaired"]:
                report.violations.append(f"the dropped event was not repaired: {report.dropped_event}")
            open_blockers = ctx.blockers.list()
            report.blockers = [b.to_json() for b in open_blockers]
            report.poisoned = {"key": poison_key, "listed": any(b.object_key == poison_key for b in open_blockers)}
            if not report.poisoned["listed"]:
                report.violations.append("the poisoned record is not in `lmctl blockers list`")
            report.phases["reconcile"] = time.monotonic() - mark
            mark = time.monotonic()

            # -- 4. walk: derived entries vanish; a bootstrap walk repairs them; verify passes
            _walk_phase(report, system, runtime, store, codec, poison_key, show_progress)
            report.phases["walk + verify"] = time.monotonic() - mark
            mark = time.monotonic()
            _check_derived(report, store, codec, manifests)
            report.phases["derived check"] = time.monotonic() - mark
            from lightmetrics.harness.demo_pipeline import (
                run_pipeline_phase,  # issue 7: inventory -> audit -> rollup -> query
            )

            run_pipeline_phase(system, runtime, report)
            mark = time.monotonic()
            from lightmetrics.harness.demo_reaps import run_reap_phase  # issue 6: orphans + expired hour, both reaps

            run_reap_phase(report, system, runtime, show_progress)
            report.phases["reaps + verify"] = time.monotonic() - mark
    finally:
        system.stop()
        if collectors is not None:
            collectors.stop()
        runtime.stop()
    report.seconds = time.monotonic() - started
    return report
