"""Issue 26, "One schedule for the reconciler shards": one EventBridge schedule fans out a delayed message
per shard to the shards queue, which runs each shard (docs/protocol.md §12 R8).

Properties: a fan-out of N shards sends N messages, each delayed in [0, jitter), in ceil(N / 10)
SendMessageBatch requests (failed entries sent again, the unsent named); a message naming no shard is
dropped, not retried; a shard delivered twice, or run twice at once (real threads), stays correct; a
dead shard message is no blocker and no status cause; end to end on the local runtime, under IAM, the
schedule's run reaches every shard as the reconcile role, and fails naming sqs:SendMessage without it.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest
from conftest import FAST, T0_NS
from test_iam_enforced import _reprovision, _without
from test_reconcile import H0
from test_reconcile_shards import accept_indexed, by_range, checkpoints_at, plan_of_entries, sharded_system
from walk_support import set_last_modified

from lightmetrics.admin.blocker_actions import sweep_dlqs
from lightmetrics.admin.status import system_status
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import queue_depths
from lightmetrics.deployment.settings import Settings
from lightmetrics.derived.reconcile_fanout import SEND_BATCH, FanoutError, fan_out, shard_message
from lightmetrics.derived.reconcile_state import read_shard_checkpoints
from lightmetrics.local.function_host import LambdaContext
from lightmetrics.local.pump import lambda_sqs_event
from lightmetrics.protocol.errors import ConfigError


def _shards_queue(system: Any) -> dict[str, str]:
    return system.made["shard_queues"]["reconcile-shards"]


def _messages(sqs: Any, url: str) -> int:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesDelayed"])


# ------------------------------------------------------------------------------------ the fan-out


@pytest.mark.parametrize("shards", [1, 10, 11, 256])
def test_a_fanout_sends_every_shard_once_delayed_within_the_jitter_ten_to_a_request(runtime, clock, shards):  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 1)
    try:
        counter = RequestCounter()
        sqs = counter.attach(system.principal_session("reconcile").client("sqs"))  # as the reconcile role
        url = _shards_queue(system)["url"]
        sent_at = time.monotonic()
        with counter.operation("fanout") as op:
            report = fan_out(sqs, url, shards=shards, jitter_s=20, fanout_ns=clock.now_ns(), rng=random.Random(shards))
        assert dict(op.by_api) == {"sqs.SendMessageBatch": math.ceil(shards / SEND_BATCH)}
        assert report.sent == shards and report.requests == math.ceil(shards / SEND_BATCH)
        assert len(report.delays) == shards and all(0 <= d < 20 for d in report.delays)
        if shards == 256:  # spread, not all in one second
            assert len(set(report.delays)) == 20
        assert report.delays == fan_out(_Recording(), "u", shards=shards, jitter_s=20, fanout_ns=0,
                                        rng=random.Random(shards)).delays  # the injected source decides
        assert _messages(sqs, url) == shards
        received: Counter[int] = Counter()
        while True:  # a message is visible once its delay passed, not before
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not got:
                break
            received.update(json.loads(m["Body"])["shard"] for m in got)
            # stamped with the fan-out's time: a late redelivery is known stale (R8)
            assert {json.loads(m["Body"])["fanout_ns"] for m in got} == {clock.now_ns()}
        waited = time.monotonic() - sent_at
        assert set(received.values()) <= {1} and {i for i, d in enumerate(report.delays) if d == 0} <= set(received)
        assert all(report.delays[i] <= waited + 1 for i in received), (waited, received)
    finally:
        system.stop()


class _Recording:
    """An SQS client that answers the entries whose ids are in ``fail`` (per call, in order) as failed."""

    def __init__(self, *fail: tuple[set[str], bool]) -> None:
        self.fail, self.calls = list(fail), []  # type: ignore[var-annotated]

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
        self.calls.append([e["Id"] for e in Entries])
        failing, sender = self.fail.pop(0) if self.fail else (set(), False)
        return {"Successful": [{"Id": e["Id"]} for e in Entries if e["Id"] not in failing],
                "Failed": [{"Id": i, "Code": "Throttled" if not sender else "Bad", "SenderFault": sender}
                           for i in sorted(failing) if i in {e["Id"] for e in Entries}]}


def test_jitter_zero_sends_no_delay_and_failed_entries_are_sent_again() -> None:
    sqs = _Recording(({"3", "7"}, False))  # the first batch: two entries throttled, then sent
    report = fan_out(sqs, "u", shards=12, jitter_s=0, fanout_ns=0)
    assert report.delays == [0] * 12 and report.sent == 12
    assert sqs.calls == [[str(i) for i in range(10)], ["3", "7"], ["10", "11"]]


def test_shards_never_sent_are_named_after_every_batch_was_tried() -> None:
    sqs = _Recording(({"1"}, False), ({"1"}, False), ({"1"}, False), ({"12"}, True))
    with pytest.raises(FanoutError, match=r"2 of 13 shard messages not sent.*'1': 'Throttled'.*'12': 'Bad'"):
        fan_out(sqs, "u", shards=13, jitter_s=5, fanout_ns=0)
    assert sqs.calls == [[str(i) for i in range(10)], ["1"], ["1"], ["10", "11", "12"]]  # a sender fault: once


def test_the_jitter_is_validated_against_sqs_and_the_schedule() -> None:
    assert Settings.from_env({"LM_BUCKET": "b-1"}).reconcile_jitter_s == 60
    for good in ("0", "299"):
        assert Settings.from_env({"LM_BUCKET": "b-1", "LM_RECONCILE_JITTER_S": good}).reconcile_jitter_s == int(good)
    for bad in ("-1", "300", "901"):  # the schedule is rate(5 minutes)
        with pytest.raises(ConfigError, match="LM_RECONCILE_JITTER_S.*0 to 299 seconds"):
            Settings.from_env({"LM_BUCKET": "b-1", "LM_RECONCILE_JITTER_S": bad})


def test_a_scheduled_run_of_several_shards_without_the_shards_queue_is_a_configuration_error() -> None:
    # Shard 0 alone would run and the others never, with nothing failing: refused, naming the setting.
    from lightmetrics.lambda_shell.reconcile_handler import Shards, reconcile_handler

    settings = Settings.from_env({"LM_BUCKET": "b-1", "LM_RECONCILE_SHARDS": "2"})
    assert settings.reconcile_shards_queue_url is None
    handler = reconcile_handler(build=lambda _metrics: Shards(settings, None, None))
    with pytest.raises(ConfigError, match="LM_RECONCILE_SHARDS is 2.*LM_RECONCILE_SHARDS_QUEUE_URL is not set"):
        handler({"source": "aws.events", "detail-type": "Scheduled Event"}, LambdaContext("reconcile"))


# ------------------------------------------------------------------------------------ shard messages


def _deliver(handler: Any, system: Any, *bodies: str) -> dict[str, Any]:
    event = lambda_sqs_event([{"MessageId": f"m{i}", "ReceiptHandle": f"r{i}", "Body": b}
                              for i, b in enumerate(bodies)], _shards_queue(system)["arn"])
    return dict(handler(event, LambdaContext("reconcile")))


def test_a_message_naming_no_shard_is_dropped_with_a_log_not_retried(runtime, clock, caplog):  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 2)
    try:
        handler = system.reconcile_function()
        with caplog.at_level(logging.ERROR, logger="lightmetrics.derived.reconcile_fanout"):
            for body in (shard_message(2, fanout_ns=1), json.dumps({"shard": "1"}), "not json", json.dumps([1]),
                         json.dumps({"shard": 1, "fanout_ns": "1"})):
                assert _deliver(handler, system, body) == {"batchItemFailures": []}, body  # acknowledged
        assert "shard must be a whole number from 0 to 1 (LM_RECONCILE_SHARDS = 2), got 2" in caplog.text
        assert caplog.text.count("dropped, not retried") == 5
        table = system.work_context().table
        assert read_shard_checkpoints(table, 2).checkpoints == (None, None)  # nothing ran
        assert _deliver(handler, system, shard_message(1, fanout_ns=None)) == {"batchItemFailures": []}
        assert read_shard_checkpoints(table, 2).checkpoints[1] is not None
    finally:
        system.stop()


def test_a_shard_message_is_stale_once_a_run_begun_after_its_fanout_finished_and_only_then(  # type: ignore[no-untyped-def]
        runtime, clock, capsys, caplog, monkeypatch):
    """A late redelivery (a visibility timeout, a throttled function) is dropped once its shard
    finished a run begun after the message's fan-out: acknowledged, logged, counted, nothing run (one
    GetItem). Not by age: a message older than the schedule's period whose shard has not run since
    still runs (a backlog longer than the period must not starve the shard), and so does a message
    of the old format, and the retry of a run that failed before finishing."""
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")  # the stale count is an EMF metric
    system = sharded_system(runtime, clock, 2)
    try:
        handler = system.reconcile_function()
        table = system.work_context().table
        period_s = 300
        late = shard_message(1, fanout_ns=clock.now_ns())
        clock.advance(seconds=4 * period_s)  # older than a period, no run of shard 1 since: it runs
        assert _deliver(handler, system, late) == {"batchItemFailures": []}
        ran = read_shard_checkpoints(table, 2).checkpoints[1]
        assert ran is not None and ran.finished_ns == clock.now_ns()
        capsys.readouterr()

        counter = RequestCounter()
        counter.attach(handler._state().built[1].table.client)  # the run's control-table client
        clock.advance(seconds=60)
        with counter.operation("stale") as op:
            assert _deliver(handler, system, late) == {"batchItemFailures": []}  # delivered again: served
        assert dict(op.by_api) == {"dynamodb.GetItem": 1}
        assert read_shard_checkpoints(table, 2).checkpoints[1] == ran  # not run again
        out = capsys.readouterr().out
        assert "reconcile shard message stale, dropped" in caplog.text
        assert '"ReconcilerStaleShardMessages":[1' in out.replace(" ", ""), out

        for body in (shard_message(1, fanout_ns=clock.now_ns()), shard_message(1, fanout_ns=None)):
            clock.advance(seconds=60)  # the next fan-out's message, and one sent before fanout_ns was
            assert _deliver(handler, system, body) == {"batchItemFailures": []}
            assert read_shard_checkpoints(table, 2).checkpoints[1].finished_ns == clock.now_ns(), body

        # a run that fails before its final save finishes nothing: the message's retry runs
        retried = shard_message(1, fanout_ns=clock.now_ns())
        real_run = handler._state().built[1].run

        def fail(*_a: Any, **_k: Any) -> Any:
            raise RuntimeError("injected")

        handler._state().built[1].run = fail  # type: ignore[method-assign]
        clock.advance(seconds=60)
        with pytest.raises(Exception, match="All records failed processing"):
            _deliver(handler, system, retried)
        handler._state().built[1].run = real_run  # type: ignore[method-assign]
        clock.advance(seconds=60)
        assert _deliver(handler, system, retried) == {"batchItemFailures": []}
        assert read_shard_checkpoints(table, 2).checkpoints[1].finished_ns == clock.now_ns()
    finally:
        system.stop()


def test_a_failed_shard_run_is_retried_by_sqs_and_its_dead_letter_is_no_blocker(runtime, clock):  # type: ignore[no-untyped-def]
    """The run's error fails the one-record batch (the failed invocation is the alarm; SQS redelivers);
    a message that exhausted its receives waits in the shards DLQ, which the sweeper does not turn
    into a blocker and ``lmctl status`` does not count: the shard's own checkpoint says it failed."""
    system = sharded_system(runtime, clock, 2)
    try:
        handler = system.reconcile_function()
        broken = system.reconciler(shard=1)

        def fail(*_a: Any, **_k: Any) -> Any:
            raise RuntimeError("injected")

        handler._state().built[1] = broken  # the container's shard 1, whose run fails
        broken.run = fail  # type: ignore[method-assign]
        with pytest.raises(Exception, match="All records failed processing"):
            _deliver(handler, system, shard_message(1, fanout_ns=clock.now_ns()))
        q = _shards_queue(system)
        sqs = runtime.boto3_client("sqs")
        sqs.send_message(QueueUrl=q["dlq_url"], MessageBody=shard_message(1, fanout_ns=0))  # a dead shard message
        ctx = system.work_context(session=system.principal_session("sweep-dlq"))
        made = sweep_dlqs(ctx)
        assert q["dlq_url"] not in system.settings.queue_urls.values() and sum(made.values()) == 0
        assert ctx.blockers.list() == [] and _messages(sqs, q["dlq_url"]) == 1
        status = system_status(system.work_context(), system.settings, queue_depths(lambda: sqs))
        assert not any("reconcile-shards" in c for c in status["causes"]), status["causes"]
    finally:
        system.stop()


def test_two_runs_of_one_shard_at_once_and_a_duplicate_delivery_are_safe(runtime, clock):  # type: ignore[no-untyped-def]
    """Four real threads run shard 1 at once, as two deliveries of its message (or a slow run and the
    next fan-out's) would: none fails, the lost entry is repaired once, no blocker opens, the hour
    closes and the checkpoint holds; then the same message delivered twice more changes nothing."""
    system = sharded_system(runtime, clock, 3)
    try:
        results = accept_indexed(system, clock, "race", 12)
        plan = plan_of_entries(system, H0, 3)
        ranges = by_range(system, plan, H0, results)
        ctx = system.work_context(policy=FAST)
        victim = next(r for r in results if r.manifest_key in ranges[1])
        lost = ctx.codec.raw_blobs_by_time(H0, victim.frame_sha256)
        runtime.boto3_client("s3").delete_object(Bucket=system.bucket, Key=lost)
        set_last_modified(system.bucket, victim.blob_key, T0_NS)
        clock.advance(seconds=3600 + 900)
        checkpoints_at(system, H0, clock.now_ns())

        start, reports, errors = threading.Barrier(4), [], []

        def run() -> None:
            rec = system.reconciler(system.work_context(policy=FAST), shard=1)  # its own container
            start.wait()
            try:
                reports.append(rec.run())
            except Exception as exc:  # noqa: BLE001 (collected, asserted below)
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == [] and len(reports) == 4
        for report in reports:
            assert set(report.outcomes) <= {"NOOP_RESOLVED", "DONE"}, report.to_json()
        assert sum(r.outcomes.get("DONE", 0) for r in reports) >= 1
        assert ctx.store.head(lost) is not None and ctx.blockers.list() == []
        assert system.reconciler(shard=1).checkpoint().hour == H0 + 1
        handler = system.reconcile_function()
        twice = shard_message(1, fanout_ns=clock.now_ns())
        assert _deliver(handler, system, twice, twice) == {"batchItemFailures": []}
        assert system.reconciler(shard=1).checkpoint().hour == H0 + 1 and ctx.blockers.list() == []
    finally:
        system.stop()


# ------------------------------------------------------------------------------------ end to end, under IAM


def test_one_schedule_runs_every_shard_as_the_reconcile_role_and_needs_send_message(runtime, clock):  # type: ignore[no-untyped-def]
    system = sharded_system(runtime, clock, 3, reconcile_jitter_s=2)
    try:
        system.start(reconcile_every_s=3600)
        _reprovision(system, _without(system, "fn-reconcile", "sqs:SendMessage"))
        with pytest.raises(Exception, match="not authorized to perform: sqs:SendMessage"):
            system.scheduler.run_now("reconcile")
        _reprovision(system)
        report = system.scheduler.run_now("reconcile")
        assert (report["fanout"], report["sent"], report["requests"]) == (True, 3, 1) and report["max_delay_s"] < 2
        assert system.drain(timeout_s=60)
        table = system.work_context().table
        assert all(cp is not None for cp in read_shard_checkpoints(table, 3).checkpoints)
        assert system.pump.delivered == 3
    finally:
        system.stop()


def test_a_run_that_saved_its_failure_does_not_make_its_own_retry_stale(runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """A run that ends in a failure it saves (``finished_ns`` written with ``failure``: ranges no
    shard owns, R8) finished nothing: its message's redelivery runs again — and fails again, so it
    reaches the shards DLQ and its alarm — instead of being acknowledged as served by the very run
    that failed."""
    from lightmetrics.derived.reconcile_fanout import ShardMessage
    from lightmetrics.derived.reconcile_state import UnownedRangesError

    system = sharded_system(runtime, clock, 2)
    try:
        accept_indexed(system, clock, "over", 9)
        plan_of_entries(system, H0, 3)
        clock.advance(seconds=3600 + 900)
        checkpoints_at(system, H0, clock.now_ns())
        message = ShardMessage(1, clock.now_ns())
        clock.advance(seconds=5)
        with pytest.raises(UnownedRangesError):
            system.reconciler(shard=1).run(message=message)
        failed = system.reconciler(shard=1).checkpoint()
        assert failed is not None and failed.failure and failed.finished_ns > message.fanout_ns
        clock.advance(seconds=60)
        with pytest.raises(UnownedRangesError):  # run again, not dropped as stale
            system.reconciler(shard=1).run(message=message)
    finally:
        system.stop()
