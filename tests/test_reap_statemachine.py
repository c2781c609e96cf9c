"""The reap on moto's Step Functions interpreter: infra/statemachines/reap.asl.json with its Lambda
tasks run by the runtime's function host (issue 6, items 1 and 5), and ``lmctl reap``.

The system's clock runs a little ahead of the wall clock (an OffsetClock), so blobs written now are
past the retry horizon, while the real Wait states (GC grace 1 s, tombstone wait 1 s) still elapse.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import FAST, ident, make_frame
from reap_support import OLD_NS

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.derived.walk import INDEXES, set_watermark
from lightmetrics.harness.testing.faults import FaultInjector, FaultRule
from lightmetrics.local.system import LocalSystem
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.clock import FrozenClock, OffsetClock
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps import Reaper

_NS = 1_000_000_000


def _cli():  # type: ignore[no-untyped-def]
    from lightmetrics.cli.main import cli

    return cli


def _system(runtime: Any, gc_grace_s: int) -> LocalSystem:
    tag = uuid.uuid4().hex[:10]
    s = LocalSystem(runtime, bucket=f"lm-rp-{tag}", table=f"lm-rp-{tag}", secret_name=f"lm-rp/{tag}",
                    queue_name_prefix=f"rp{tag}-", clock=OffsetClock(120 * _NS),
                    overrides={"retry_horizon_s": 60, "gc_grace_s": gc_grace_s, "retention_s": 86400}).provision()
    s.notifications(False)
    return s


@pytest.fixture
def system(runtime):  # type: ignore[no-untyped-def]
    s = _system(runtime, gc_grace_s=1)
    yield s
    s.stop()


@pytest.fixture
def slow_grace_system(runtime):  # type: ignore[no-untyped-def]
    # A grace long enough that the reap is still waiting when the next command starts, even on a
    # busy CI machine (with 1 s, CI once saw the reap finish before `status --follow` began).
    s = _system(runtime, gc_grace_s=8)
    yield s
    s.stop()


def plant(system: LocalSystem, runtime: Any) -> tuple[list[Any], str]:
    """Two batches accepted in an old hour (indexed), one orphan (the accept stopped after step 4)."""
    ctx = system.work_context()
    old = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=FrozenClock(OLD_NS), policy=FAST)
    results = []
    for n in range(2):
        r = accept_batch(old, ident(n), make_frame(ident(n)))
        index_accepted(ctx, r.manifest_key)
        index_raw_blob(ctx, r.blob_key)
        results.append(r)
    broken = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=FrozenClock(OLD_NS), policy=FAST)
    FaultInjector(broken.store.client).add(FaultRule(fault="down", operation="PutObject",  # type: ignore[attr-defined]
                                                     key_contains="accepted/v1/", times=-1))
    orphan = accept_batch(broken, ident(7), make_frame(ident(7), 0.5))
    index_raw_blob(ctx, orphan.blob_key)
    now = system.clock.now_ns()
    for index in INDEXES:  # as a clean full walk would (the demo runs a real one)
        set_watermark(ctx.table, index, now - 3600 * _NS, epoch=1, now_ns=now)
    return results, orphan.blob_key or ""


def test_gc_then_retention_through_the_state_machine(system: LocalSystem, runtime: Any) -> None:
    results, orphan = plant(system, runtime)
    env = system.operator_environment()
    runner = CliRunner()
    r = runner.invoke(_cli(), ["reap", "gc", "--wait", "--json"], env=env)  # a dry run unless --execute
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["dry_run"] is True and out["report"]["deletable"] == 1 and out["report"]["purged"] == 0
    ctx = system.work_context()
    assert ctx.store.head(orphan) is not None

    r = runner.invoke(_cli(), ["reap", "gc", "--execute", "--wait", "--json"], env=env)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)["report"]
    assert (report["examined"], report["marked"], report["purged"], report["restored"]) == (3, 1, 1, 0)
    assert report["kept"] == {"referenced": 2}
    assert ctx.store.head(orphan) is None

    hour = str(UtcHour.of_unix_ns(OLD_NS))
    r = runner.invoke(_cli(), ["reap", "retention", "--hour", hour, "--execute", "--tombstone-wait-s", "1", "--wait",
                               "--json"], env=env)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)["report"]
    assert report["hours_reaped"] == [hour] and report["purged"] == 2
    assert "reap: " in r.stderr and "pages, examined" in r.stderr  # --wait shows progress on stderr (issue 17)
    assert all(ctx.store.head(x.blob_key) is None and ctx.store.get(x.manifest_key) for x in results)
    assert verify(ctx, strict=True).ok

    r = runner.invoke(_cli(), ["reap", "status", "--json"], env=env)
    assert r.exit_code == 0 and json.loads(r.stdout)["reap"]["status"] == "finished"


def test_two_reaps_at_once_the_second_is_refused(system: LocalSystem, runtime: Any) -> None:
    held = Reaper(system.work_context(), system.settings).begin(
        {"input": {"mode": "gc", "dry_run": True}, "execution_arn": "held-by-another-run"})
    env = system.operator_environment()
    r = CliRunner().invoke(_cli(), ["reap", "gc", "--execute", "--json"], env=env)
    assert r.exit_code == 5, r.output
    r = CliRunner().invoke(_cli(), ["reap", "status", "--json"], env=env)
    assert json.loads(r.stdout)["lease"]["held"] is True
    # The state machine refuses too (a console start does not go through the CLI's check).
    sfn = runtime.boto3_client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=system.state_machine_arn("reap"),
                              input=json.dumps({"mode": "gc", "dry_run": False}))["executionArn"]
    control = system.reap_control()
    followed = control.follow(arn, poll_s=0.05, timeout_s=60)
    assert followed.status == "failed"
    assert sfn.describe_execution(executionArn=arn).get("error") == "LeaseHeld"
    assert held["reap"]["epoch"] == 1


def test_console_input_without_dry_run_is_refused(system: LocalSystem, runtime: Any) -> None:
    sfn = runtime.boto3_client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=system.state_machine_arn("reap"),
                              input=json.dumps({"mode": "gc"}))["executionArn"]
    followed = system.reap_control().follow(arn, poll_s=0.05, timeout_s=60)
    assert followed.status == "failed"
    assert sfn.describe_execution(executionArn=arn).get("error") == "ReapNotStarted"


def test_a_reap_continues_into_new_executions_on_the_state_machine(system: LocalSystem, runtime: Any) -> None:
    """Rule G-B2 on moto's interpreter: the Continue state starts the next execution under the same
    lease and epoch; the report is the one a single execution gives, and the lease is released once."""
    _, orphan = plant(system, runtime)
    control = system.reap_control()
    arn = control.start(mode="gc", dry_run=False, page_size=1, max_tasks_per_execution=1)
    followed = control.follow(arn, poll_s=0.05, timeout_s=120)
    assert followed.status == "finished", followed.detail
    report = followed.report.to_json()
    assert (report["examined"], report["marked"], report["purged"], report["restored"]) == (3, 1, 1, 0)
    assert report["executions"] >= 3 and report["kept"] == {"referenced": 2}
    sfn = runtime.boto3_client("stepfunctions")
    runs = sfn.list_executions(stateMachineArn=system.state_machine_arn("reap"))["executions"]
    assert len(runs) == report["executions"] and all(r["status"] == "SUCCEEDED" for r in runs)
    assert system.work_context().store.head(orphan) is None and control.lease_live() is None


def test_a_refused_start_says_why_in_the_tasks_own_words(system: LocalSystem) -> None:
    """Issue 17: Begin refuses an hour that has not expired; lmctl prints Begin's own message from
    the execution history, not only the catching state's "invalid input"."""
    hour = str(UtcHour.of_unix_ns(system.clock.now_ns()))
    r = CliRunner().invoke(_cli(), ["reap", "retention", "--hour", hour, "--execute", "--json"],
                           env=system.operator_environment())
    assert r.exit_code == 2, r.output
    reason = json.loads(r.stdout)["reason"]
    assert f"{hour} is not older than LM_RETENTION_S" in reason and "InvalidReapInput" in reason, reason


def test_the_hint_after_a_start_names_a_command_that_follows(slow_grace_system: LocalSystem, runtime: Any) -> None:
    # Issue 27 item 7: `reap gc` said "follow with: lmctl reap status", which printed a snapshot;
    # `reap status --follow` now follows the running reap to its end, as `walk status --follow` does.
    system = slow_grace_system
    plant(system, runtime)
    env = {**system.operator_environment(), "COLUMNS": "200"}
    runner = CliRunner()
    r = runner.invoke(_cli(), ["reap", "gc", "--execute"], env=env)
    assert r.exit_code == 0, r.output
    assert r.stdout.rstrip().endswith("follow with: lmctl reap status --follow")
    followed = runner.invoke(_cli(), ["reap", "status", "--follow"], env=env)  # the grace (8 s) is still running
    assert followed.exit_code == 0, followed.output
    assert "reap finished" in followed.stdout and "reap: " in followed.stderr, followed.output
    assert json.loads(runner.invoke(_cli(), ["reap", "status", "--json"], env=env).stdout)["reap"]["purged"] == 1
    # Nothing running: --follow prints the last report, as plain status does.
    again = runner.invoke(_cli(), ["reap", "status", "--follow"], env=env)
    assert again.exit_code == 0 and "last reap" in again.stdout
