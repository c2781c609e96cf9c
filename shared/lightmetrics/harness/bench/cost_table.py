"""``lmctl bench cost-table``: the cost contract of docs/protocol.md §8, measured with the request counter at
several history depths (default 10 / 1,000 / 10,000 accepted batches in the probe's own partition).

History is seeded through the real accept algorithm on an uncounted client with no injected
latency (parallel: :func:`lightmetrics.harness.bench.workload.seed_history`); the probes then run on a
counted client. Counts are requests (HTTP attempts, by API), not time, so they are exact and
must be equal at every depth.

The background jobs are measured whole, through their public entry points: a walk or a reap
execution on the runtime's Step Functions interpreter (its tasks' S3 and DynamoDB clients counted,
its states entered and Lambda tasks read from the execution history: :func:`measure_walk`,
:func:`measure_reap`), a reconciler run (:func:`measure_reconcile`). tests/test_cost_measured.py
compares each total with :func:`lightmetrics.operator_tools.cost_workload.job_requests` of the units the run did.

Example:
    >>> costs = measure_operation_costs(system, raw_s3, depths=(10, 100))      # doctest: +SKIP
    >>> costs["operations"]["accept.new"]["10"]                                 # doctest: +SKIP
    {'total': 2, 'by_api': {'s3.PutObject': 2}}
    >>> measure_reap(system, mode="gc", dry_run=False, source="scan")          # doctest: +SKIP
    {'dynamodb.GetItem': 5, ..., 's3.HeadObject': 8, 'sfn.transitions': 8, 'lambda.Invoke': 4}
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from lightmetrics.acceptance.accept import AcceptStatus, accept_batch
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.aws.s3_store import s3_client_config
from lightmetrics.aws.step_functions import execution_history
from lightmetrics.composition.services import accept_context, work_context
from lightmetrics.derived.indexing import index_accepted, index_raw_blob, repair_accepted, tombstones
from lightmetrics.harness.bench.workload import batch_frames, seed_history
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.retry import RetryPolicy

DEPTHS = (10, 1000, 10_000)
OPERATIONS = ("accept.new", "accept.duplicate", "accept.conflict", "accept.conflict_again",
              "index.accepted_manifest", "index.raw_blob", "walk.repair_per_key")
#: the cost contract's targets (docs/protocol.md §8), for the printed table
TARGETS = {
    "accept.new": "2 requests, 2 sequential round trips",
    "accept.duplicate": "4 requests",
    "accept.conflict": "at most 6 requests",
    "accept.conflict_again": "at most 6 requests",
    "index.accepted_manifest": "1 GET + 2 conditional PUTs (tombstone check cached)",
    "index.raw_blob": "1 HEAD + 1 conditional PUT",
    "walk.repair_per_key": "proportional to listed keys",
}
AGENT, BOOT = "cost-probe", "boot-1"


def measure_operation_costs(system: LocalSystem, raw_s3: Any, depths: tuple[int, ...] = DEPTHS) -> dict[str, Any]:
    """Requests per operation at each history depth; history grows in one partition between depths."""
    settings = system.settings
    assert settings is not None
    counter = RequestCounter()
    client = system.runtime.boto3_client("s3", config=s3_client_config(component="bench-cost"))
    counter.attach(client)
    policy = RetryPolicy(max_attempts=4, base_delay_s=0.01)
    actx = accept_context(settings, client=client, policy=policy)
    wctx = work_context(settings, session=_session(system), client=client, counter=counter, policy=policy)
    ops: dict[str, dict[str, dict[str, Any]]] = {op: {} for op in OPERATIONS}
    seeding = []
    have = 0
    for depth in sorted(depths):
        if depth > have:
            seeding.append({"depth": depth, **seed_history(settings, raw_s3,
                                                           batch_frames(AGENT, BOOT, depth - have, start=have))})
            have = depth
        (probe, frame), = batch_frames(AGENT, BOOT, 1, start=10_000_000 + depth)
        (_, other), = batch_frames(AGENT, BOOT, 1, start=10_000_000 + depth, variant=0.5)
        (hist, _), = batch_frames(AGENT, BOOT, 1, start=depth - 1)
        # A live indexer has checked this hour's tombstone already (one HEAD per hour per process).
        tombstones(wctx).is_tombstoned("raw", UtcHour.of_unix_ns(time.time_ns()))

        def run(name: str, fn: Any, expect: Any = None) -> None:
            with counter.operation(name) as op:
                out = fn()
            if expect is not None and out is not expect:
                raise RuntimeError(f"{name} at depth {depth}: {out} (expected {expect})")
            ops[name][str(depth)] = {"total": op.total, "by_api": dict(sorted(op.by_api.items()))}

        run("accept.new", lambda: accept_batch(actx, probe, frame).status, AcceptStatus.ACCEPTED)
        run("accept.duplicate", lambda: accept_batch(actx, probe, frame).status, AcceptStatus.DUPLICATE)
        run("accept.conflict", lambda: accept_batch(actx, probe, other).status, AcceptStatus.IDENTITY_CONFLICT)
        run("accept.conflict_again", lambda: accept_batch(actx, probe, other).status, AcceptStatus.IDENTITY_CONFLICT)
        manifest_key = actx.codec.accepted(probe)
        run("index.accepted_manifest", lambda: index_accepted(wctx, manifest_key))
        run("index.raw_blob", lambda: index_raw_blob(wctx, wctx.codec.raw_blob(hashlib.sha256(frame).hexdigest())))
        run("walk.repair_per_key", lambda: repair_accepted(wctx, actx.codec.accepted(hist)))
    flat = {op: len({v["total"] for v in by_depth.values()}) == 1 for op, by_depth in ops.items()}
    return {"depths": list(sorted(depths)), "operations": ops, "flat": flat, "seeding": seeding,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _session(system: LocalSystem) -> Any:
    from lightmetrics.local.system import RuntimeSession

    return RuntimeSession(system.runtime)


def rows(costs: dict[str, Any]) -> list[tuple[str, ...]]:
    """Printable rows: operation, target, total at each depth, by API at the deepest."""
    out = []
    deepest = str(costs["depths"][-1])
    for op, by_depth in costs["operations"].items():
        totals = [str(by_depth[str(d)]["total"]) for d in costs["depths"]]
        apis = ", ".join(f"{k.split('.', 1)[1]} {v}" for k, v in by_depth[deepest]["by_api"].items())
        out.append((op, TARGETS[op], *totals, apis, "yes" if costs["flat"][op] else "NO"))
    return out


# --- background jobs, whole runs ------------------------------------------------------------------------
def execution_counts(sfn: Any, execution_arns: list[str]) -> dict[str, int]:
    """States entered (``sfn.transitions``, what Step Functions Standard bills) and Lambda task
    invocations (``lambda.Invoke``) of these executions, from their histories.

    A walk or reap is "finished" once its end task records it, a moment before the execution enters
    its final Succeed state: wait for every execution to end first, or that last state goes uncounted."""
    entered = tasks = 0
    for arn in execution_arns:
        deadline = time.monotonic() + 60
        while sfn.describe_execution(executionArn=arn)["status"] == "RUNNING":
            if time.monotonic() > deadline:
                raise RuntimeError(f"execution {arn} still running 60 s after its job finished")
            time.sleep(0.05)
        for event in execution_history(sfn, arn):
            entered += event["type"].endswith("StateEntered")
            tasks += event["type"] == "TaskStateEntered"
    return {"sfn.transitions": entered, "lambda.Invoke": tasks}


def _counted_tasks(system: LocalSystem) -> RequestCounter:
    """Host the state machines' tasks again with a fresh context whose S3 and DynamoDB clients
    are counted (and a fresh tombstone cache: nothing carried over from an earlier run)."""
    counter = RequestCounter()
    system.register_task_functions(counter=counter)
    return counter


def measure_walk(system: LocalSystem, *, timeout_s: float = 300.0, **start: Any) -> dict[str, int]:
    """Requests by API, transitions and task invocations of one full walk (``WalkControl.start``
    arguments), across all its executions."""
    counter = _counted_tasks(system)
    control = system.walk_control()
    followed = control.follow(control.start(**start), poll_s=0.05, timeout_s=timeout_s)
    if followed.status != "finished":
        raise RuntimeError(f"the measured walk did not finish: {followed.status} {followed.detail}")
    # The executions first: execution_counts waits for them to end, so the End task's last
    # requests (after the checkpoint says finished) are counted too.
    executions = execution_counts(system.runtime.boto3_client("stepfunctions"), followed.executions)
    return {**dict(sorted(counter.totals.items())), **executions}


def measure_reap(system: LocalSystem, *, timeout_s: float = 300.0, **inp: Any) -> dict[str, int]:
    """Requests by API, transitions and task invocations of one reap execution (``ReapControl.start``
    input: mode, dry_run, ...)."""
    counter = _counted_tasks(system)
    control = system.reap_control()
    arn = control.start(**inp)
    followed = control.follow(arn, poll_s=0.05, timeout_s=timeout_s)
    if followed.status != "finished":
        raise RuntimeError(f"the measured reap did not finish: {followed.status} {followed.detail}")
    executions = execution_counts(system.runtime.boto3_client("stepfunctions"), [arn])  # waits for its end
    return {**dict(sorted(counter.totals.items())), **executions}


def measure_reconcile(system: LocalSystem, **context: Any) -> tuple[dict[str, int], Any]:
    """Requests by API of one reconciler run on a fresh counted context, and its report."""
    counter = RequestCounter()
    report = system.reconciler(system.work_context(counter=counter, **context)).run()
    return dict(sorted(counter.totals.items())), report
