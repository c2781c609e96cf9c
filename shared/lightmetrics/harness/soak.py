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

import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightmetrics.acceptance.auth import TokenKeys, mint_token
from lightmetrics.aws.s3_store import S3ObjectStore, s3_client_config
from lightmetrics.harness.soak_agent import SoakAgent
from lightmetrics.harness.soak_chaos import SoakChaos, every
from lightmetrics.harness.soak_plan import SoakPlan, SoakReport, collector_faults
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec

__all__ = ["SoakPlan", "SoakReport", "collector_faults", "run_soak"]

BUCKET, TABLE, SECRET = "lightmetrics-soak", "lightmetrics-soak-control", "lightmetrics/soak-tokens"


@dataclass
class _SoakRun:
    """What the phases share: the system under test, the agents, and the threads to stop."""

    plan: SoakPlan
    report: SoakReport
    system: Any
    runtime: Any
    fleet: Any
    store: S3ObjectStore
    codec: KeyCodec
    chaos: SoakChaos
    agents: list[SoakAgent] = field(default_factory=list)
    stop_chaos: threading.Event = field(default_factory=threading.Event)
    stop_producers: threading.Event = field(default_factory=threading.Event)
    stop_senders: threading.Event = field(default_factory=threading.Event)
    producers: list[threading.Thread] = field(default_factory=list)
    senders: list[threading.Thread] = field(default_factory=list)
    chaos_threads: list[threading.Thread] = field(default_factory=list)

    def stop_all(self) -> None:
        self.stop_producers.set()
        self.stop_chaos.set()
        self.stop_senders.set()


def run_soak(plan: SoakPlan, *, port: int = 0, show_progress: bool = True) -> SoakReport:
    from lightmetrics.local.collectors import CollectorFleet, collector_environment
    from lightmetrics.local.server import RemoteRuntime
    from lightmetrics.local.system import LocalSystem

    report = SoakReport(plan)
    started = time.monotonic()
    overrides = {"gc_grace_s": plan.gc_grace_s, "retry_horizon_s": plan.retry_horizon_s}
    hosted = {"LM_BUCKET": BUCKET, "LM_TABLE": TABLE, "LM_AUTH_SECRET_ID": SECRET, "LM_PREFIX": "",
              "LM_GC_GRACE_S": str(plan.gc_grace_s), "LM_RETRY_HORIZON_S": str(plan.retry_horizon_s)}
    runtime = RemoteRuntime.spawn(port=port, env=hosted)
    system = LocalSystem(runtime, bucket=BUCKET, table=TABLE, secret_name=SECRET, overrides=overrides)
    fleet: CollectorFleet | None = None
    run: _SoakRun | None = None
    try:
        system.provision()
        keys = TokenKeys.parse(system.made["secret_value"])
        env = collector_environment(system)
        fleet = CollectorFleet(plan.collectors, env,
                               {i: {"LM_FAULTS": json.dumps(collector_faults(plan, i))} for i in range(plan.collectors)})
        store = S3ObjectStore(runtime.boto3_client("s3", config=s3_client_config()), BUCKET)
        system.start(reconcile_every_s=plan.reconcile_every_s, sweep_every_s=plan.reconcile_every_s * 2,
                     drop=every(plan.drop_event_every), duplicate=every(plan.duplicate_delivery_every))
        run = _SoakRun(plan, report, system, runtime, fleet, store, KeyCodec(system.prefix),
                       SoakChaos(plan, report, system, fleet))
        with tempfile.TemporaryDirectory(prefix="lm-soak-") as workdir:
            _start(run, keys, Path(workdir))
            _soak(run, show_progress)
            _settle(run)
            _verdict(run)
            for a in run.agents:
                a.client.close()
    finally:
        if run is not None:
            run.stop_all()
        system.stop()
        if fleet is not None:
            report.counters["collector kills (total)"] = fleet.kills
            fleet.stop()
        runtime.stop()
    report.seconds = time.monotonic() - started
    return report


def _start(run: _SoakRun, keys: TokenKeys, workdir: Path) -> None:
    """Every agent's producer and sender threads, then the chaos jobs."""
    plan = run.plan
    lock = threading.Lock()
    run.agents = [SoakAgent(i, plan, mint_token(keys, f"soak-agent-{i:02d}"), run.fleet.endpoints(),
                            workdir / f"agent-{i:02d}", run.report, lock) for i in range(plan.agents)]
    for a in run.agents:
        for target, ev, group in ((a.produce, run.stop_producers, run.producers),
                                  (a.send, run.stop_senders, run.senders)):
            t = threading.Thread(target=target, args=(ev,), daemon=True)
            t.start()
            group.append(t)
    run.chaos_threads = run.chaos.start(run.stop_chaos, [a.agent_id for a in run.agents])


def _soak(run: _SoakRun, show_progress: bool) -> None:
    """Let it all run for ``plan.minutes``, with a progress bar of acknowledged batches."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    report = run.report
    mark = time.monotonic()
    total = run.plan.minutes * 60
    with Progress(TextColumn("[bold]soaking"), BarColumn(), TextColumn("{task.fields[acks]} acknowledged"),
                  TimeElapsedColumn(), disable=not show_progress) as progress:
        task = progress.add_task("soak", total=total, acks=0)
        while (elapsed := time.monotonic() - mark) < total:
            time.sleep(min(1.0, total - elapsed))
            progress.update(task, completed=time.monotonic() - mark,
                            acks=report.counters["client accepted"] + report.counters["client duplicate"])
    report.phases["soak"] = time.monotonic() - mark


def _settle(run: _SoakRun) -> None:
    """No new work, no more kills; every collector back; spools and queues drained; one reconcile
    and one full walk."""
    plan, report, system, fleet = run.plan, run.report, run.system, run.fleet
    mark = time.monotonic()
    run.stop_producers.set()
    run.stop_chaos.set()
    for t in run.producers + run.chaos_threads:  # a walk or reap in flight finishes first
        t.join(timeout=plan.settle_timeout_s)
    run.stop_senders.set()
    for t in run.senders:
        t.join(timeout=plan.settle_timeout_s)
    for i in range(len(fleet)):
        if fleet.urls[i] is None:
            fleet.restart(i)
    for a in run.agents:
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
    final_walk = run.chaos.walk_once()
    if not final_walk or final_walk["status"] != "finished":
        report.violations.append(f"the final walk did not finish: {final_walk}")
    report.phases["reconcile + walk"] = time.monotonic() - mark


def _verdict(run: _SoakRun) -> None:
    """Strict verify, the ledger, nothing produced lost, every accepted batch's derived entries."""
    from lightmetrics.harness.ledger import check_acknowledged, missing_derived, missing_derived_lines
    from lightmetrics.operator_tools.verify import verify

    report = run.report
    mark = time.monotonic()
    checked = verify(run.system.work_context(), strict=True)
    report.verify = {"ok": checked.ok, "counts": checked.counts, "violation_counts": checked.violation_counts(),
                     "violations": [v.to_json() for v in checked.violations[:20]],
                     "acknowledged": len(checked.acknowledged)}
    for v in checked.violations[:20]:
        report.violations.append(f"verify: {v.rule}: {v.detail}")
    acked: dict[BatchIdentity, set[str]] = {}
    for a in run.agents:
        for o in a.outcomes:
            if o.action in ("accepted", "duplicate"):
                acked.setdefault(o.identity, set()).add(o.frame_sha256)
    ledger = check_acknowledged(run.store, run.codec, acked)
    report.violations += ledger.violations
    report.counters["acknowledged identities"] = len(acked)
    report.counters["ledger verified (record + blob)"] = ledger.verified
    _check_nothing_lost(run, acked)
    missing = missing_derived(run.store, run.codec, ledger.manifests)
    report.violations += missing_derived_lines(missing)
    report.counters["S3 requests (all components)"] = run.runtime.request_count("s3")
    report.phases["verdict"] = time.monotonic() - mark


def _check_nothing_lost(run: _SoakRun, acked: dict[BatchIdentity, set[str]]) -> None:
    """Every batch produced is acknowledged (with the bytes first spooled) or still in its spool."""
    report = run.report
    for a in run.agents:
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
