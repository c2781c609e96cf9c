"""Issue 23, property 5: ``lmctl status`` is never ok while something is stuck.

Each test sets up one stuck state on the moto server — by running the job into it (a shard whose
plan leaves ranges unowned, a shard never run) or by writing the record the code reads (a failed
walk or reap, an unfinished retention hour) — and asks the real CLI: exit 1 and a cause naming
it, in the text output and in ``--json``. A healthy system exits 0 with no cause.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import consume_all

from lightmetrics.cli.main import cli
from lightmetrics.derived.hour_ranges import RangePlans
from lightmetrics.derived.walk.state import checkpoint_pk
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.clock import SystemClock
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps.params import CHECKPOINT_PK as REAP_PK
from lightmetrics.reaps.params import CHECKPOINT_SK as REAP_SK

_NS = 1_000_000_000
SHARDS = 2


@pytest.fixture
def system(runtime):  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:10]
    s = LocalSystem(runtime, bucket=f"lm-st-{tag}", table=f"lm-st-{tag}", secret_name=f"lm-st/{tag}",
                    queue_name_prefix=f"st{tag}-", overrides={"reconcile_shards": SHARDS, "reconcile_lookback_s": 3600}).provision()
    yield s
    s.stop()


def lmctl(system: LocalSystem, *args: str, as_json: bool = True) -> tuple[int, Any]:
    env = {**system.environment(), "LM_RECONCILE_SHARDS": str(SHARDS)}
    r = CliRunner().invoke(cli, list(args) + (["--json"] if as_json else []), env=env)
    if not as_json:
        return r.exit_code, r.stdout
    try:
        return r.exit_code, json.loads(r.stdout)
    except ValueError:
        return r.exit_code, {"output": r.output}


def status(system: LocalSystem) -> tuple[int, dict[str, Any], str]:
    """``lmctl status`` twice: its JSON (strict: one document) and its text."""
    code, out = lmctl(system, "status")
    text_code, text = lmctl(system, "status", as_json=False)
    assert text_code == code, (code, text_code, text)
    return code, out, text


def reconciled(system: LocalSystem) -> None:
    """Every shard runs once, as its schedule would, with nothing queued (the pump consumed the
    provisioning's test events), so it closes every hour that settled."""
    sqs = system.runtime.boto3_client("sqs")
    for url in system.queue_urls():
        consume_all(sqs, url)
    code, out = lmctl(system, "reconcile")
    assert code == 0, out


def assert_stuck(system: LocalSystem, *words: str) -> str:
    """Exit 1, and one cause (in --json and as a line of the text) holding every word."""
    code, out, text = status(system)
    assert code == 1 and out["ok"] is False, out
    causes = [c for c in out.get("causes", []) if all(w in c for w in words)]
    assert causes, f"no cause naming {words}: {out.get('causes')}"
    lines = [line for line in text.splitlines() if line.startswith("stuck: ") and all(w in line for w in words)]
    assert lines, text
    return causes[0]


def now_ns() -> int:
    return SystemClock().now_ns()


def test_status_is_ok_when_nothing_is_stuck(system):  # type: ignore[no-untyped-def]
    reconciled(system)
    code, out, text = status(system)
    assert code == 0 and out["ok"] is True and out["causes"] == [], out
    assert "stuck:" not in text and "ok: nothing is stuck" in text, text


def test_status_is_not_ok_while_a_configured_shard_has_never_run(system):  # type: ignore[no-untyped-def]
    code, out = lmctl(system, "reconcile", "--shard", "0")  # shard 1's schedule never fires
    assert code == 0, out
    assert_stuck(system, "shard 1", "never run")


def test_status_is_not_ok_while_a_shards_last_runs_failed(system):  # type: ignore[no-untyped-def]
    current = UtcHour.of_unix_ns(now_ns())
    # a plan of three ranges for two shards (by hand: `lmctl reconcile plan` refuses it): every run fails
    RangePlans(system.work_context().table).propose(("b", "m"), effective_from=current,
                                                    now_ns=current.start_ns - 2 * 3600 * _NS)
    for _ in range(2):
        code, out = lmctl(system, "reconcile")
        assert code == 1, out
    assert_stuck(system, "shard 0", "last run failed", "range 2 of 3 has no shard")
    assert_stuck(system, "shard 1", "last run failed")


def test_status_is_not_ok_while_the_checkpoint_lags_beyond_the_alarm(system):  # type: ignore[no-untyped-def]
    reconciled(system)
    now = now_ns()
    behind = UtcHour.of_unix_ns(now) + -6  # runs go on, but an hour 6 hours back never closes
    for shard in range(SHARDS):
        rec = system.reconciler(shard=shard)
        assert rec._save(behind, rec.checkpoint(), now)
    cause = assert_stuck(system, "lag", "shard 0")
    assert str(2 * 3600 + system.settings.settle_s) in cause  # the ReconcilerLag alarm's threshold


def test_status_is_not_ok_while_the_last_walk_failed(system):  # type: ignore[no-untyped-def]
    reconciled(system)
    system.work_context().table.put({"pk": checkpoint_pk(None), "sk": "current", "status": "failed", "epoch": 4,
                                     "scope": "all", "error": "WalkFailed: S3 unavailable for 20 minutes [page 7]",
                                     "failed_at_ns": now_ns()})
    assert_stuck(system, "walk", "failed", "S3 unavailable for 20 minutes [page 7]")


def test_status_is_not_ok_while_the_last_reap_failed(system):  # type: ignore[no-untyped-def]
    reconciled(system)
    system.work_context().table.put({"pk": REAP_PK, "sk": REAP_SK, "status": "failed", "mode": "gc", "epoch": 2,
                                     "error": "ReapFailed: DynamoDB throttled past the retries",
                                     "dry_run": False})
    assert_stuck(system, "reap", "gc", "failed", "DynamoDB throttled past the retries")


def test_status_is_not_ok_while_a_retention_hour_cannot_finish(system):  # type: ignore[no-untyped-def]
    reconciled(system)
    hour = str(UtcHour.of_unix_ns(now_ns()) + -24 * 40)
    table = system.work_context().table
    # the run tombstoned the hour but an entry's blocker keeps it from being reaped (R-I5, R-I6)
    table.put({"pk": "retention#raw", "sk": hour, "status": "tombstoned", "tombstoned_at_ns": now_ns(), "epoch": 1})
    reason = "blocked: 1 entries have an open reap-retention blocker (lmctl blockers list)"
    table.put({"pk": REAP_PK, "sk": REAP_SK, "status": "finished", "mode": "retention", "epoch": 1,
               "dry_run": False, "hours": [hour], "hour_index": 1, "hour_status": {hour: reason}})
    assert_stuck(system, "retention", hour, "blocked")


def test_status_is_not_ok_while_retention_skips_an_hour_the_watermark_does_not_cover(system):  # type: ignore[no-untyped-def]
    reconciled(system)
    hour = str(UtcHour.of_unix_ns(now_ns()) + -24 * 40)
    system.work_context().table.put({
        "pk": REAP_PK, "sk": REAP_SK, "status": "finished", "mode": "retention", "epoch": 1, "dry_run": False,
        "hours": [hour], "hour_index": 1, "hour_status": {hour: "skipped: watermark does not cover the hour"}})
    assert_stuck(system, "retention", hour, "watermark does not cover the hour")


def test_shard_0_counts_the_stuck_shards_for_the_alarm_without_extra_requests(system):  # type: ignore[no-untyped-def]
    """``ReconcilerShardsStuck`` (alarm ReconcilerStuck): shard 0 counts, from the items it reads for
    the lag anyway, the shards that never ran or failed their last run; a healthy set counts 0."""
    from conftest import RecordingMetrics

    from lightmetrics.aws.request_counter import RequestCounter
    from lightmetrics.derived.reconcile_state import UnownedRangesError

    def run(shard: int) -> tuple[float | None, dict[str, int]]:
        """One run of ``shard``: the ReconcilerShardsStuck it emitted (None: none) and its requests."""
        counter, metrics = RequestCounter(), RecordingMetrics()
        ctx = system.work_context(metrics=metrics, counter=counter)
        with counter.operation("reconcile") as op:
            try:
                system.reconciler(ctx, shard=shard).run()
            except UnownedRangesError:
                pass
        return metrics.values.get("ReconcilerShardsStuck"), dict(op.by_api)

    sqs = system.runtime.boto3_client("sqs")
    for url in system.queue_urls():
        consume_all(sqs, url)
    assert run(0)[0] == 1  # shard 1 never ran
    assert run(1)[0] is None  # only shard 0 counts
    stuck, requests = run(0)
    assert stuck == 0
    assert requests.get("GetItem", 0) <= 1 + SHARDS, requests  # its own item, then every shard's (for the lag too)
    current = UtcHour.of_unix_ns(now_ns())
    RangePlans(system.work_context().table).propose(("b", "m"), effective_from=current,
                                                    now_ns=current.start_ns - 2 * 3600 * _NS)
    run(1)
    assert run(0)[0] == 2  # both failed their last run: range 2 of 3 has no shard


def test_status_names_a_retention_hour_skipped_before_a_gc_replaced_the_reap_checkpoint(system):  # type: ignore[no-untyped-def]
    """The daily GC (04:00) replaces ``checkpoint#reap/current`` before retention (05:00) runs again:
    the hour the last retention run skipped is still named, from the outcome it left for status."""
    from reap_support import drive

    from lightmetrics.protocol.clock import FrozenClock
    from lightmetrics.reaps import Reaper

    reconciled(system)
    hour = str(UtcHour.of_unix_ns(now_ns()) + -24 * 400)  # expired; no watermark covers it
    clock = FrozenClock(now_ns())
    report = drive(Reaper(system.work_context(), system.settings),
                   {"mode": "retention", "dry_run": False, "hour": hour}, clock)
    assert report["hours_skipped"] == {hour: "skipped: watermark does not cover the hour"}, report
    assert_stuck(system, "retention", hour, "watermark does not cover the hour")
    report = drive(Reaper(system.work_context(), system.settings), {"mode": "gc", "dry_run": False}, clock)
    assert report["status"] == "finished", report
    assert_stuck(system, "retention", hour, "watermark does not cover the hour")


@pytest.mark.parametrize("job", ["reap", "walk"])
def test_status_is_not_ok_while_a_job_stopped_without_finishing(system, job):  # type: ignore[no-untyped-def]
    """StopExecution or a timeout ends an execution without its Abort task: the summary still says
    ``running`` and the lease lapses. Named once the lease expired more than the margin ago."""
    from lightmetrics.work import leases

    reconciled(system)
    table, now = system.work_context().table, now_ns()
    cp_pk = REAP_PK if job == "reap" else checkpoint_pk(None)
    table.put({"pk": cp_pk, "sk": "current", "status": "running", "mode": "gc", "epoch": 3, "dry_run": False,
               "scope": "all"})
    lease = {"pk": f"lease#{job}", "sk": "lease", "owner": "o", "epoch": 3, "lease_seconds": 900,
             "expires_at_ns": now + 60 * _NS}
    table.put(lease)
    code, out, _ = status(system)
    assert code == 0, out  # its lease is live: running, not stuck
    table.put({**lease, "expires_at_ns": now - (leases.STOPPED_MARGIN_S + 60) * _NS})
    cause = assert_stuck(system, job, "epoch 3", "stopped without finishing", "lease expired at")
    assert ("lmctl reap gc --execute --wait" if job == "reap" else "lmctl walk start --resume --wait") in cause


def test_status_reads_a_fixed_number_of_items(system):  # type: ignore[no-untyped-def]
    """Status is an operator's call, and its reads do not grow with history: a GetItem per shard,
    per watermark, the walk's and the reap's summaries and each retention scope's last outcome, a
    lease only while its job's summary says running; four Queries."""
    from lightmetrics.admin.status import system_status
    from lightmetrics.aws.request_counter import RequestCounter
    from lightmetrics.composition.services import queue_depths

    def requests() -> dict[str, int]:
        counter = RequestCounter()
        with counter.operation("status") as op:
            sqs = system.runtime.boto3_client("sqs")
            system_status(system.work_context(counter=counter), system.settings, queue_depths(lambda: sqs))
        return {api.split(".")[1]: n for api, n in op.by_api.items() if api in ("dynamodb.GetItem", "dynamodb.Query")}

    reconciled(system)
    assert requests() == {"GetItem": SHARDS + 4 + 2 + 2, "Query": 4}
    table = system.work_context().table
    table.put({"pk": REAP_PK, "sk": REAP_SK, "status": "running", "mode": "gc", "epoch": 1, "dry_run": False})
    table.put({"pk": checkpoint_pk(None), "sk": "current", "status": "running", "epoch": 1, "scope": "all"})
    assert requests() == {"GetItem": SHARDS + 4 + 2 + 2 + 2, "Query": 4}  # and both leases


def test_status_names_a_retention_run_that_failed_or_stopped_after_a_gc_replaced_its_checkpoint(system):  # type: ignore[no-untyped-def]
    """A retention run that failed before tombstoning anything, or stopped (its lease lapsed) and
    was replaced by the next GC's checkpoint, stays named until a retention run of its scope ends."""
    from reap_support import drive

    from lightmetrics.protocol.clock import FrozenClock
    from lightmetrics.reaps import Reaper

    reconciled(system)
    table, now = system.work_context().table, now_ns()
    table.put({"pk": REAP_PK, "sk": "retention-last#rollup", "scope": "rollup", "status": "failed", "epoch": 2,
               "hours": [], "hour_status": {}, "error": "States.Timeout"})
    table.put({"pk": REAP_PK, "sk": REAP_SK, "status": "running", "mode": "retention", "scope": "raw", "epoch": 3,
               "dry_run": False, "hours": [], "hour_index": 0, "hour_status": {}})
    table.put({"pk": "lease#reap", "sk": "lease", "owner": "o", "epoch": 3, "lease_seconds": 900,
               "expires_at_ns": now - 3600 * _NS})
    report = drive(Reaper(system.work_context(), system.settings), {"mode": "gc", "dry_run": False}, FrozenClock(now))
    assert report["status"] == "finished", report
    assert_stuck(system, "retention (rollup) epoch 2", "last run failed", "States.Timeout")
    assert_stuck(system, "retention (raw) epoch 3", "last run stopped")


def test_status_shows_the_shards_queue_and_its_dead_letters_and_calls_neither_stuck(system):  # type: ignore[no-untyped-def]
    """Issue 26: status shows the reconciler's shards queue under ``shard_queues`` — its messages (a
    fan-out's, still delayed by their jitter, count) and its DLQ's, found from its redrive policy in
    one more GetQueueAttributes — in ``--json`` and as a table of the text. Its dead letters hold no
    work (the next fan-out sends every shard again): no cause, the shards' checkpoints say (R9)."""
    import re

    from lightmetrics.admin.status import system_status
    from lightmetrics.aws.request_counter import RequestCounter
    from lightmetrics.composition.services import queue_depths
    from lightmetrics.derived.reconcile_fanout import shard_message

    reconciled(system)
    shards_queue = system.made["shard_queues"]["reconcile-shards"]
    sqs = system.runtime.boto3_client("sqs")
    sqs.send_message(QueueUrl=shards_queue["url"], MessageBody=shard_message(1, fanout_ns=now_ns()), DelaySeconds=900)
    for _ in range(2):
        sqs.send_message(QueueUrl=shards_queue["dlq_url"], MessageBody=shard_message(0, fanout_ns=0))
    code, out, text = status(system)
    assert out["shard_queues"] == {"reconcile-shards": {"messages": 1, "dead_letters": 2}}, out
    assert code == 0 and out["ok"] is True and out["causes"] == [], out
    assert "reconcile-shards-dlq" not in out["queues"], out["queues"]  # no index DLQ
    assert re.search(r"reconcile-shards\W+1\W+2\W", text), text

    counter = RequestCounter()
    counted = counter.attach(system.runtime.boto3_client("sqs"))
    with counter.operation("status") as op:
        system_status(system.work_context(), system.settings, queue_depths(lambda: counted))
    assert op.by_api["sqs.GetQueueAttributes"] == len(system.settings.queue_urls) + 2

    unset = system.settings.model_copy(update={"reconcile_shards_queue_url": None})  # no shards queue: nothing
    assert system_status(system.work_context(), unset, queue_depths(lambda: sqs))["shard_queues"] == {}
