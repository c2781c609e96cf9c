"""The event path: S3 notifications -> SQS -> indexers, with the outcome contract (docs/protocol.md §10, §11)."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from conftest import FAST, T0_NS, consume_all, ident, make_frame

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.admin.blocker_actions import redrive, resume, retry, skip, sweep_dlqs
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.event_path import process_sqs_record
from lightmetrics.derived.indexing import KIND_ACCEPTED, KIND_QUARANTINE, KIND_RAW_BLOB, index_accepted, index_raw_blob
from lightmetrics.harness.testing.faults import FaultInjector, FaultRule
from lightmetrics.local.pump import lambda_sqs_event
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.work.outcome import Outcome


@pytest.fixture
def system(runtime, clock):  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:10]
    sys_ = LocalSystem(runtime, bucket=f"lm-ev-{tag}", table=f"lm-ev-{tag}", secret_name=f"lm-ev/{tag}",
                       queue_name_prefix=f"{tag}-", clock=clock,
                       overrides={"retry_budget_count": 3, "settle_s": 600, "reconcile_lookback_s": 7200})
    sys_.provision()
    yield sys_
    sys_.stop()


@pytest.fixture
def counter() -> RequestCounter:
    return RequestCounter()


@pytest.fixture
def wctx(system, counter, metrics):  # type: ignore[no-untyped-def]
    return system.work_context(counter=counter, metrics=metrics, policy=FAST)


@pytest.fixture
def actx(system, runtime, clock):  # type: ignore[no-untyped-def]
    return accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)


def keys(runtime, bucket: str, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    out = runtime.boto3_client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for o in out.get("Contents", [])]


def s3_record(bucket: str, key: str, name: str = "ObjectCreated:Put") -> dict:
    from urllib.parse import quote_plus

    body = {"Records": [{"eventName": name, "s3": {"bucket": {"name": bucket}, "object": {"key": quote_plus(key)}}}]}
    return {"messageId": uuid.uuid4().hex, "body": json.dumps(body), "attributes": {"ApproximateReceiveCount": "1"}}


def derived(runtime, bucket):  # type: ignore[no-untyped-def]
    return {p: keys(runtime, bucket, p) for p in
            ("accepted-by-time/", "accepted-by-blob/", "raw-blobs-by-time/", "quarantine-by-blob/")}


# --------------------------------------------------------------------------------------- parsing
def test_test_event_is_noop(wctx, system):  # type: ignore[no-untyped-def]
    rec = {"messageId": "m", "body": json.dumps({"Event": "s3:TestEvent", "Bucket": system.bucket})}
    [r] = process_sqs_record(wctx, rec, kind=KIND_ACCEPTED, bucket=system.bucket)
    assert r.outcome is Outcome.NOOP_RESOLVED and wctx.blockers.list() == []


@pytest.mark.parametrize("body, why", [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"hello": 1}', "no Records"),
    ('{"Records": [{"eventName": "ObjectCreated:Put", "s3": {}}]}', "without bucket/key"),
])
def test_garbage_messages_become_blockers_with_their_payload(wctx, system, body, why):  # type: ignore[no-untyped-def]
    [r] = process_sqs_record(wctx, {"messageId": "m1", "body": body}, kind=KIND_ACCEPTED, bucket=system.bucket,
                             queue="index-accepted")
    assert r.outcome is Outcome.BLOCKED and r.acknowledged
    [b] = wctx.blockers.list()
    assert b.kind == "event-parse" and why in b.reason and b.payload == {"queue": "index-accepted", "body": body}


def test_keys_outside_the_layout_wrong_queue_or_bucket_are_blocked(wctx, system):  # type: ignore[no-untyped-def]
    cases = [
        (system.bucket, "accepted/v1/garbage.json", "not in the layout"),
        (system.bucket, wctx.codec.raw_blob("ab" * 32), "does not belong on the index-accepted queue"),
        ("someone-elses-bucket", wctx.codec.accepted(ident(1)), "this indexer serves"),
    ]
    for bucket, key, why in cases:
        [r] = process_sqs_record(wctx, s3_record(bucket, key), kind=KIND_ACCEPTED, bucket=system.bucket)
        assert r.outcome is Outcome.BLOCKED, key
        assert why in wctx.blockers.get(r.work_key).reason


def test_url_encoded_keys_are_decoded(wctx, actx, system, runtime):  # type: ignore[no-untyped-def]
    i = ident(2, agent="agent with space")
    accept_batch(actx, i, make_frame(i))
    rec = s3_record(system.bucket, actx.codec.accepted(i))
    assert "%3D" in rec["body"] and "%2F" in rec["body"]  # as moto and S3 encode keys
    [r] = process_sqs_record(wctx, rec, kind=KIND_ACCEPTED, bucket=system.bucket)
    assert r.outcome is Outcome.DONE
    assert len(keys(runtime, system.bucket, "accepted-by-time/")) == 1


# ------------------------------------------------------------------------------ indexing + costs
def test_pump_indexes_every_accepted_blob_and_conflict(system, actx, runtime):  # type: ignore[no-untyped-def]
    system.start()
    for n in range(5):
        accept_batch(actx, ident(n), make_frame(ident(n)))
    accept_batch(actx, ident(0), make_frame(ident(0), variant=5.0))  # a conflict
    assert system.drain(timeout_s=60)
    d = derived(runtime, system.bucket)
    hour = UtcHour.of_unix_ns(T0_NS)
    assert sorted(d["accepted-by-time/"]) == sorted(actx.codec.accepted_by_time(hour, ident(n)) for n in range(5))
    assert len(d["accepted-by-blob/"]) == 5
    assert len(d["raw-blobs-by-time/"]) == 6  # the conflicting blob is indexed too (an orphan candidate)
    assert len(d["quarantine-by-blob/"]) == 1
    assert system.pump.delivered >= 12


def test_exact_cost_of_indexing_one_manifest_and_one_blob(wctx, actx, counter):  # type: ignore[no-untyped-def]
    i = ident(3)
    r = accept_batch(actx, i, make_frame(i))
    hour = UtcHour.of_unix_ns(T0_NS)
    from lightmetrics.derived.indexing import tombstones

    blob_hour = UtcHour(int(wctx.store.head(r.blob_key).last_modified_unix_s) // 3600 * 3600)
    for h in (hour, blob_hour):  # warm the per-hour cache, as in steady state
        tombstones(wctx).is_tombstoned("raw", h)
    with counter.operation("index-manifest") as m:
        assert index_accepted(wctx, r.manifest_key) is Outcome.DONE
    with counter.operation("index-blob") as b:
        assert index_raw_blob(wctx, r.blob_key) is Outcome.DONE
    with counter.operation("index-again") as again:
        assert index_accepted(wctx, r.manifest_key) is Outcome.NOOP_RESOLVED
    assert dict(m.by_api) == {"s3.GetObject": 1, "s3.PutObject": 2}
    assert dict(b.by_api) == {"s3.HeadObject": 1, "s3.PutObject": 1}
    assert again.total == 3  # idempotent: the PUTs answer 412, nothing new is written


def test_records_of_one_batch_are_processed_concurrently(system, actx, runtime):  # type: ignore[no-untyped-def]
    """A batch of 10 must overlap its S3 requests (2 round trips, not 20)."""
    manifests = [accept_batch(actx, ident(n), make_frame(ident(n))).manifest_key for n in range(10)]
    in_flight, peak, lock = [0], [0], threading.Lock()

    def slow(**_kw):  # type: ignore[no-untyped-def]
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.05)
        with lock:
            in_flight[0] -= 1

    ctx = system.work_context(policy=FAST)
    ctx.store.client.meta.events.register("before-send.s3", slow)
    handler = system.routes()[0].handler
    handler.reset()
    event = lambda_sqs_event([{"MessageId": f"m{k}", "ReceiptHandle": "r", "Body": s3_record(system.bucket, key)["body"]}
                              for k, key in enumerate(manifests)], "arn:aws:sqs:us-east-1:123456789012:q")
    from lightmetrics.lambda_shell.sqs_batch import sqs_index_handler
    from lightmetrics.local.function_host import LambdaContext

    h = sqs_index_handler(kind=KIND_ACCEPTED, queue="index-accepted", settings_factory=lambda: system.settings,
                          work_context_factory=lambda s, **kw: ctx)
    assert h(event, LambdaContext("index-accepted")) == {"batchItemFailures": []}
    assert peak[0] >= 8


def test_retry_later_records_are_partial_batch_failures(system, actx, runtime):  # type: ignore[no-untyped-def]
    good = accept_batch(actx, ident(1), make_frame(ident(1))).manifest_key
    bad = accept_batch(actx, ident(2), make_frame(ident(2))).manifest_key
    ctx = system.work_context(policy=FAST)
    FaultInjector(ctx.store.client).add(FaultRule(fault="503", operation="GetObject", key_contains=bad, times=-1))
    from lightmetrics.lambda_shell.sqs_batch import sqs_index_handler
    from lightmetrics.local.function_host import LambdaContext

    h = sqs_index_handler(kind=KIND_ACCEPTED, queue="index-accepted", settings_factory=lambda: system.settings,
                          work_context_factory=lambda s, **kw: ctx)
    event = lambda_sqs_event([{"MessageId": "good", "ReceiptHandle": "r", "Body": s3_record(system.bucket, good)["body"]},
                              {"MessageId": "bad", "ReceiptHandle": "r", "Body": s3_record(system.bucket, bad)["body"]}],
                             "arn:aws:sqs:us-east-1:123456789012:q")
    assert h(event, LambdaContext("index-accepted")) == {"batchItemFailures": [{"itemIdentifier": "bad"}]}
    assert ctx.budget.get(f"{KIND_ACCEPTED}:{bad}").count == 1


def test_same_event_twice_and_after_repair_is_idempotent(wctx, actx, system, runtime):  # type: ignore[no-untyped-def]
    r = accept_batch(actx, ident(4), make_frame(ident(4)))
    rec = s3_record(system.bucket, r.manifest_key)
    outcomes = [process_sqs_record(wctx, rec, kind=KIND_ACCEPTED, bucket=system.bucket)[0].outcome for _ in range(2)]
    assert outcomes == [Outcome.DONE, Outcome.NOOP_RESOLVED]
    before = derived(runtime, system.bucket)
    system.reconciler(wctx).run()
    [again] = process_sqs_record(wctx, rec, kind=KIND_ACCEPTED, bucket=system.bucket)
    assert again.outcome is Outcome.NOOP_RESOLVED
    after = derived(runtime, system.bucket)
    assert after["accepted-by-time/"] == before["accepted-by-time/"]


# ------------------------------------------------------------------------------ blockers, budget
def test_vanished_manifest_is_an_invariant_violation_blocker(wctx, system, metrics):  # type: ignore[no-untyped-def]
    key = wctx.codec.accepted(ident(9))
    [r] = process_sqs_record(wctx, s3_record(system.bucket, key), kind=KIND_ACCEPTED, bucket=system.bucket)
    assert r.outcome is Outcome.BLOCKED
    assert "vanished" in wctx.blockers.get(r.work_key).reason
    assert metrics.values["InvariantViolation"] == 1


def test_poisoned_manifest_is_blocked_and_listed(wctx, system, runtime):  # type: ignore[no-untyped-def]
    key = wctx.codec.accepted(ident(8))
    runtime.boto3_client("s3").put_object(Bucket=system.bucket, Key=key, Body=b'{"schema": "nope"}')
    [r] = process_sqs_record(wctx, s3_record(system.bucket, key), kind=KIND_ACCEPTED, bucket=system.bucket)
    assert r.outcome is Outcome.BLOCKED
    [b] = wctx.blockers.list()
    assert b.kind == KIND_ACCEPTED and b.object_key == key and "invalid-manifest" in b.reason


def test_retry_budget_promotes_to_blocker_and_success_clears_it(wctx, actx, system):  # type: ignore[no-untyped-def]
    r = accept_batch(actx, ident(5), make_frame(ident(5)))
    faults = FaultInjector(wctx.store.client)
    faults.add(FaultRule(fault="503", operation="PutObject", key_contains="accepted-by-", times=-1))
    rec = s3_record(system.bucket, r.manifest_key)
    seen = [process_sqs_record(wctx, rec, kind=KIND_ACCEPTED, bucket=system.bucket)[0].outcome for _ in range(3)]
    assert seen == [Outcome.RETRY_LATER, Outcome.RETRY_LATER, Outcome.BLOCKED]  # budget of 3
    [b] = wctx.blockers.list()
    assert "retry budget spent after 3" in b.reason and b.payload is not None
    # an operator retries after the fault is gone: resolved, budget cleared
    faults.clear()
    out = retry(wctx, b.work_key, who="alice")
    assert out.status == "resolved"
    assert wctx.blockers.list() == [] and wctx.budget.get(b.work_key) is None
    assert wctx.blockers.get(b.work_key).audit[-1]["who"] == "alice"


def test_blocker_not_durable_means_retry_later(wctx, actx, system):  # type: ignore[no-untyped-def]
    key = wctx.codec.accepted(ident(7))
    ddb_faults = FaultInjector(wctx.blockers.table.client)
    ddb_faults.add(FaultRule(fault="500", operation="UpdateItem", times=-1))
    [r] = process_sqs_record(wctx, s3_record(system.bucket, key), kind=KIND_ACCEPTED, bucket=system.bucket)
    assert r.outcome is Outcome.RETRY_LATER and "blocker not written" in r.detail


def test_operator_skip_and_resume_are_audited(wctx, system, runtime):  # type: ignore[no-untyped-def]
    for n in (1, 2):
        process_sqs_record(wctx, s3_record(system.bucket, wctx.codec.accepted(ident(n))), kind=KIND_ACCEPTED,
                           bucket=system.bucket, queue="index-accepted")
    first, second = sorted(b.work_key for b in wctx.blockers.list())
    skip(wctx, first, who="bob", reason="test identity, deleted by hand")
    b = wctx.blockers.get(first)
    assert b.status == "skipped" and b.audit[-1]["reason"] == "test identity, deleted by hand"
    with pytest.raises(Exception, match="needs a reason"):
        skip(wctx, second, who="bob", reason=" ")
    out = resume(wctx, second, who="carol")
    assert out.status == "resumed" and "re-enqueued on index-accepted" in out.detail
    sqs = runtime.boto3_client("sqs")
    msgs = sqs.receive_message(QueueUrl=system.settings.queue_urls["index-accepted"], MaxNumberOfMessages=10)
    assert any(wctx.codec.accepted(ident(2)).split("/")[-1] in m["Body"] for m in msgs.get("Messages", []))
    assert [b.work_key for b in wctx.blockers.list()] == []


def test_dlq_messages_become_blockers_and_redrive_puts_them_back(wctx, actx, system, runtime):  # type: ignore[no-untyped-def]
    r = accept_batch(actx, ident(6), make_frame(ident(6)))
    sqs = runtime.boto3_client("sqs")
    urls = system.settings.queue_urls
    body = s3_record(system.bucket, r.manifest_key)["body"]
    sqs.send_message(QueueUrl=urls["index-accepted-dlq"], MessageBody=body)
    made = sweep_dlqs(wctx)
    assert made["index-accepted-dlq"] == 1
    [b] = wctx.blockers.list()
    assert (b.kind, b.source, b.object_key) == ("dlq", "dlq", r.manifest_key)
    from lightmetrics.local.pump import queue_depth

    assert queue_depth(sqs, urls["index-accepted-dlq"]) == 0
    # drain the queue of the notifications the accept produced, then redrive
    consume_all(sqs, urls["index-accepted"])
    [out] = redrive(wctx, who="ops")
    assert out.action == "redrive" and out.status == "resumed"
    [m] = sqs.receive_message(QueueUrl=urls["index-accepted"], MaxNumberOfMessages=10)["Messages"]
    assert m["Body"] == body


def test_quarantine_indexing(wctx, actx, system, runtime):  # type: ignore[no-untyped-def]
    accept_batch(actx, ident(10), make_frame(ident(10)))
    c = accept_batch(actx, ident(10), make_frame(ident(10), variant=1.0))
    [r] = process_sqs_record(wctx, s3_record(system.bucket, c.quarantine_key), kind=KIND_QUARANTINE,
                             bucket=system.bucket)
    assert r.outcome is Outcome.DONE
    [k] = keys(runtime, system.bucket, "quarantine-by-blob/")
    assert k == wctx.codec.quarantine_by_blob(c.frame_sha256, ident(10))
    assert process_sqs_record(wctx, s3_record(system.bucket, c.blob_key), kind=KIND_RAW_BLOB,
                              bucket=system.bucket)[0].outcome is Outcome.DONE
