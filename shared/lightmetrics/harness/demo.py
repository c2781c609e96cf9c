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

import json
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

from lightmetrics.acceptance.auth import TokenKeys, mint_token
from lightmetrics.aws.s3_store import S3ObjectStore, s3_client_config
from lightmetrics.cli.output import err_console
from lightmetrics.harness.demo_accept import DemoAgent, deliberate_conflict, kill_victim_when_stalled, victim_faults
from lightmetrics.harness.demo_report import SCALES, DemoReport, DemoScale
from lightmetrics.harness.demo_walk import run_walk_phase
from lightmetrics.harness.ledger import check_acknowledged, missing_derived, missing_derived_lines
from lightmetrics.local.collectors import CollectorFleet, collector_environment
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec, KeyKind
from lightmetrics.protocol.manifests import AcceptedBatchManifest

__all__ = ["PLANTED_FAULTS", "SCALES", "DemoReport", "DemoScale", "run_demo"]

BUCKET, TABLE, SECRET = "lightmetrics-demo", "lightmetrics-demo-control", "lightmetrics/ingest-tokens"

#: What the demo breaks on purpose; each is checked in the report.
PLANTED_FAULTS = ("The demo plants faults on purpose, each checked in the report: a collector is killed mid-accept "
                  "(its agents fail over); an agent sends other content for an accepted batch (a conflict an "
                  "operator resolves); an acceptance record is poisoned (its indexer logs 'blocked', and the "
                  "operator skips it); an S3 event is dropped (the reconciler repairs it); derived entries are "
                  "deleted behind the system's back (verify finds them, the walk restores them); orphan blobs "
                  "and an expired hour are reaped.")


@dataclass
class _DemoRun:
    """What the phases share: the report, the system under test, and what one phase leaves the next."""

    report: DemoReport
    system: Any
    runtime: Any
    store: S3ObjectStore
    codec: KeyCodec
    workdir: Path
    show_progress: bool
    collectors: CollectorFleet | None = None
    agents: list[DemoAgent] = field(default_factory=list)
    base_ns: int = 0
    poison_key: str = ""
    dropped: list[str] = field(default_factory=list)  # the raw-blob key whose S3 event was lost
    manifests: dict[BatchIdentity, AcceptedBatchManifest] = field(default_factory=dict)


@contextmanager
def _phase(report: DemoReport, name: str) -> Iterator[None]:
    mark = time.monotonic()
    yield
    report.phases[name] = time.monotonic() - mark


def run_demo(scale: DemoScale, *, port: int = 0, show_progress: bool = True) -> DemoReport:
    from lightmetrics.local.hosting import host_from_env
    from lightmetrics.protocol.hosting import install

    # This process drives a local runtime: it is a local host too (its reap inputs use the demo's
    # short waits, which only a local host may, docs/protocol.md §18 S4). Put back on return.
    previous_host = install(host_from_env({}))
    try:
        return _run_demo(scale, port=port, show_progress=show_progress)
    finally:
        install(previous_host)


def _run_demo(scale: DemoScale, *, port: int, show_progress: bool) -> DemoReport:
    from lightmetrics.harness.demo_reaps import HOSTED_ENV as REAP_ENV  # issue 6: reap tasks' horizon, grace, clock
    from lightmetrics.local.server import RemoteRuntime
    from lightmetrics.local.system import LocalSystem

    report = DemoReport(scale)
    started = time.monotonic()
    if show_progress:  # said first, so that the faults' own log lines surprise nobody
        err_console.print(PLANTED_FAULTS, markup=False)
    # moto gets a process (and a core) of its own; the state machines' Lambda tasks (the walk)
    # run in that process too, configured by these LM_* variables.
    hosted = {"LM_BUCKET": BUCKET, "LM_TABLE": TABLE, "LM_AUTH_SECRET_ID": SECRET, "LM_PREFIX": ""}
    hosted.update(REAP_ENV)
    runtime = RemoteRuntime.spawn(port=port, env=hosted)
    system = LocalSystem(runtime, bucket=BUCKET, table=TABLE, secret_name=SECRET)
    run: _DemoRun | None = None
    try:
        system.provision()
        store = S3ObjectStore(runtime.boto3_client("s3", config=s3_client_config()), BUCKET)
        with tempfile.TemporaryDirectory(prefix="lm-demo-") as workdir:
            run = _DemoRun(report, system, runtime, store, KeyCodec(system.prefix), Path(workdir), show_progress)
            _run_phases(run)
    finally:
        system.stop()
        if run is not None and run.collectors is not None:
            run.collectors.stop()
        runtime.stop()
    report.seconds = time.monotonic() - started
    return report


def _run_phases(run: _DemoRun) -> None:
    from lightmetrics.harness.demo_conflicts import run_conflict_phase  # issue 8: list, resolve, agent drops
    from lightmetrics.harness.demo_pipeline import run_pipeline_phase, start_spark_early  # issue 7
    from lightmetrics.harness.demo_reaps import run_reap_phase  # issue 6: orphans + expired hour, both reaps

    report = run.report
    _accept_phase(run)  # times itself: only the agents' sending counts as "accept"
    # The JVM starts now, beside the phases that mostly wait (queues, state machines); after the
    # accept phase, which keeps both cores busy (moto, three collectors, the agents).
    spark = start_spark_early()
    with _phase(report, "ledger check"):
        run.manifests = _ledger_check(report, run.store, run.codec)
    with _phase(report, "index drain"):
        _index_phase(run)
    with _phase(report, "conflict resolution"):
        run_conflict_phase(report, run.system, run.agents[0].client)
    with _phase(report, "reconcile"):
        _reconcile_phase(run)
    with _phase(report, "walk + verify"):
        run_walk_phase(report, run.system, run.runtime, run.store, run.codec, run.poison_key, run.show_progress)
    with _phase(report, "derived check"):
        _check_derived(report, run.store, run.codec, run.manifests)
    run_pipeline_phase(run.system, run.runtime, report, spark=spark)  # times itself: inventory -> audit -> rollup
    with _phase(report, "reaps + verify"):
        run_reap_phase(report, run.system, run.runtime, run.show_progress)


def _accept_phase(run: _DemoRun) -> None:
    """Collectors (processes) and agents (threads), one collector killed mid-accept; then the conflict."""
    report, system, scale = run.report, run.system, run.report.scale
    keys = TokenKeys.parse(system.made["secret_value"])
    marker, victim = run.workdir / "victim-stalled", scale.collectors - 1
    run.collectors = CollectorFleet(scale.collectors, collector_environment(system),
                                    {victim: victim_faults(scale, marker)})
    run.agents = [DemoAgent(i, mint_token(keys, f"demo-agent-{i:02d}"), scale, run.collectors.endpoints(), report,
                            run.workdir / "spools") for i in range(scale.agents)]
    run.base_ns = time.time_ns() - 3600 * 1_000_000_000
    stop = threading.Event()
    killer = threading.Thread(target=kill_victim_when_stalled, args=(run.collectors, victim, marker, stop, report),
                              daemon=True)
    killer.start()
    # The indexers consume notifications while agents send, as Lambda would. One raw-blob
    # event is lost on purpose; a poisoned record must end up as a blocker.
    run.poison_key = run.codec.accepted(BatchIdentity.create("demo-poison", "boot-0", 0, 0))
    run.store.client.put_object(Bucket=BUCKET, Key=run.poison_key, Body=b'{"schema": "not a manifest"}',
                                IfNoneMatch="*")
    system.start(drop=_drop_first_raw_blob_event(run.dropped))
    with _phase(report, "accept"):
        _send_all(run)
    report.s3_requests = run.runtime.request_count("s3", "ingest")
    deliberate_conflict(run.agents[0], run.base_ns, run.store, report)
    stop.set()


def _send_all(run: _DemoRun) -> None:
    """Every agent sends its batches concurrently, with a progress bar of batches."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]accepting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        disable=not run.show_progress, transient=False, console=err_console,
    ) as progress:
        task = progress.add_task("batches", total=run.report.scale.batches)
        lock = threading.Lock()

        def tick() -> None:
            with lock:
                progress.advance(task)

        threads = [threading.Thread(target=a.run, args=(run.base_ns, tick)) for a in run.agents]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _ledger_check(report: DemoReport, store: S3ObjectStore,
                  codec: KeyCodec) -> dict[BatchIdentity, AcceptedBatchManifest]:
    """The ledger check (:func:`lightmetrics.harness.ledger.check_acknowledged`) over the demo's acks."""
    acked: dict[BatchIdentity, set[str]] = {}
    for ack in report.acks:
        acked.setdefault(ack.identity, set()).add(ack.sha256)
    check = check_acknowledged(store, codec, acked)
    report.violations += check.violations
    report.verified += check.verified
    return check.manifests


def _index_phase(run: _DemoRun) -> None:
    """Wait until the pump has delivered everything that was queued, then stop it."""
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]indexing"), TimeElapsedColumn(), disable=not run.show_progress,
                  console=err_console) as progress:
        progress.add_task("drain", total=None)
        drained = run.system.drain(timeout_s=300)
    run.report.index_s3_requests = run.runtime.request_count("s3", "index")
    run.report.indexed_objects = run.system.pump.delivered if run.system.pump else 0
    run.system.stop()
    if not drained:
        run.report.violations.append("the index queues did not drain within 300 s")


def _reconcile_phase(run: _DemoRun) -> None:
    """The lost event's entry is repaired by a reconcile pass; the poison stays a blocker."""
    report, store, codec, dropped = run.report, run.store, run.codec, run.dropped
    ctx = run.system.work_context(session=run.system.principal_session("reconcile"))  # as the reconciler's role
    lost_sha = codec.parse(dropped[0]).sha256 if dropped else ""

    def entry_present() -> bool:
        return any(codec.parse(k).sha256 == lost_sha for k in
                   store.list_keys(codec.root(KeyKind.RAW_BLOBS_BY_TIME), limit=10**7))

    present_before = entry_present()
    rec = run.system.reconciler(ctx).run()
    present_after = entry_present()
    report.dropped_event = {"blob_key": dropped[0] if dropped else None, "entry_before_reconcile": present_before,
                            "entry_after_reconcile": present_after,
                            "repaired": bool(dropped) and not present_before and present_after,
                            "reconcile": rec.to_json()}
    if not report.dropped_event["repaired"]:
        report.violations.append(f"the dropped event was not repaired: {report.dropped_event}")
    open_blockers = ctx.blockers.list()
    report.blockers = [b.to_json() for b in open_blockers]
    report.poisoned = {"key": run.poison_key, "listed": any(b.object_key == run.poison_key for b in open_blockers)}
    if not report.poisoned["listed"]:
        report.violations.append("the poisoned record is not in `lmctl blockers list`")


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
