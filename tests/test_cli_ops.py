"""lmctl blockers / status / reconcile as an operator runs them (subprocesses, exit codes), signing as the
operators' role (issue 28: the runbook's commands pass under its policy, IAM enforced)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from conftest import FAST, consume_all, ident, make_frame
from test_cli import LMCTL
from test_event_path import s3_record

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.admin.blocker_actions import sweep_dlqs
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.event_path import process_sqs_record
from lightmetrics.derived.indexing import KIND_ACCEPTED
from lightmetrics.local.system import LocalSystem


@pytest.fixture
def system(runtime):  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:10]
    return LocalSystem(runtime, bucket=f"lm-ops-{tag}", table=f"lm-ops-{tag}", secret_name=f"lm-ops/{tag}",
                       queue_name_prefix=f"ops{tag}-").provision()


def lmctl(system, *args: str) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    env = {**os.environ, **system.operator_environment(), "LM_OPERATOR": "test-operator"}
    r = subprocess.run(LMCTL + list(args) + ["--json"], capture_output=True, text=True, env=env, timeout=120)
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        return r.returncode, {"stderr": r.stderr}


def test_blocker_lifecycle_through_the_cli(system, runtime):  # type: ignore[no-untyped-def]
    ctx = system.work_context(policy=FAST)
    missing = [ctx.codec.accepted(ident(n)) for n in (1, 2, 3)]
    for key in missing:  # events for records that are not there (yet): invariant blockers
        process_sqs_record(ctx, s3_record(system.bucket, key), kind=KIND_ACCEPTED, bucket=system.bucket,
                           queue="index-accepted")
    code, listed = lmctl(system, "blockers", "list")
    assert code == 1 and listed["open"] == 3
    keys = sorted(b["work_key"] for b in listed["blockers"])
    assert keys == sorted(f"{KIND_ACCEPTED}:{k}" for k in missing)

    code, still = lmctl(system, "blockers", "retry", keys[0])
    assert code == 1 and still["status"] == "open"  # the record is still missing
    actx = accept_context(system.settings, client=runtime.boto3_client("s3"), policy=FAST)
    accept_batch(actx, ident(1), make_frame(ident(1)))
    code, fixed = lmctl(system, "blockers", "retry", keys[0])
    assert code == 0 and fixed["status"] == "resolved"

    code, out = lmctl(system, "blockers", "skip", keys[1], "--reason", "identity retired by hand")
    assert code == 0 and out["status"] == "skipped"
    code, out = lmctl(system, "blockers", "resume", keys[2])
    assert code == 0 and out["status"] == "resumed" and "re-enqueued" in out["detail"]
    code, out = lmctl(system, "blockers", "resume", "index-accepted:nope")
    assert code == 2 and "no blocker" in out["reason"]

    code, listed = lmctl(system, "blockers", "list")
    assert code == 0 and listed["open"] == 0
    code, everything = lmctl(system, "blockers", "list", "--all")
    audit = {b["work_key"]: b["audit"][-1] for b in everything["blockers"]}
    assert audit[keys[1]]["who"] == "test-operator" and audit[keys[1]]["reason"] == "identity retired by hand"


def test_skip_requires_a_reason(system):  # type: ignore[no-untyped-def]
    env = {**os.environ, **system.operator_environment()}
    r = subprocess.run(LMCTL + ["blockers", "skip", "x:y"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "--reason" in r.stderr


def test_status_redrive_and_reconcile(system, runtime):  # type: ignore[no-untyped-def]
    sqs = runtime.boto3_client("sqs")
    urls = system.settings.queue_urls
    consume_all(sqs, urls["index-accepted"])  # the s3:TestEvent of provisioning
    body = s3_record(system.bucket, system.work_context().codec.accepted(ident(4)))["body"]
    sqs.send_message(QueueUrl=urls["index-accepted-dlq"], MessageBody=body)
    code, status = lmctl(system, "status")
    assert code == 1 and status["queues"]["index-accepted-dlq"] == 1 and status["ok"] is False
    sweep_dlqs(system.work_context(session=system.principal_session("sweep-dlq")))  # the scheduled sweeper, as its role
    code, out = lmctl(system, "blockers", "redrive")
    assert code == 0 and [r["action"] for r in out["redriven"]] == ["redrive"]
    code, status = lmctl(system, "status")
    assert status["queues"]["index-accepted-dlq"] == 0 and status["open_blockers"] == 0
    assert status["queues"]["index-accepted"] == 1  # back on its queue
    code, report = lmctl(system, "reconcile")
    assert code == 0 and report["entries"] == 0 and report["checkpoint_after"]
    code, status = lmctl(system, "status")
    assert status["reconciler"]["checkpoint"] == report["checkpoint_after"]


def test_blockers_list_prints_the_whole_reason(system):  # type: ignore[no-untyped-def]
    """Issue 17: no identifier is cut: a blocker's reason (which names its object key) is printed whole."""
    ctx = system.work_context(policy=FAST)
    key = ctx.codec.accepted(ident(7, agent="agent-" + "x" * 90))
    process_sqs_record(ctx, s3_record(system.bucket, key), kind=KIND_ACCEPTED, bucket=system.bucket,
                       queue="index-accepted")
    _, listed = lmctl(system, "blockers", "list")
    reason = listed["blockers"][0]["reason"]
    assert len(reason) > 120 and key in reason
    env = {**os.environ, **system.operator_environment()}
    r = subprocess.run(LMCTL + ["blockers", "list", "--output", "wide"], capture_output=True, text=True, env=env,
                       timeout=120)  # issue 27 item 4: the default table fits 100 columns; wide has it whole
    assert r.returncode == 1 and reason in r.stdout, r.stdout


def test_blockers_table_fits_100_columns_with_short_ids_every_command_takes(system):  # type: ignore[no-untyped-def]
    """Issue 27 item 4: the table was ~320 characters wide. By default it fits 100 columns and its id
    column is a short id (a prefix of the work key's sha256) that retry/resume/skip take; a prefix of
    several is refused naming them, a miss suggests the closest; --output wide and --json are whole."""
    from lightmetrics.cli.short_ids import hex_token

    ctx = system.work_context(policy=FAST)
    keys = [ctx.codec.accepted(ident(50 + n, agent="agent-" + "y" * 80)) for n in range(3)]
    for key in keys:
        process_sqs_record(ctx, s3_record(system.bucket, key), kind=KIND_ACCEPTED, bucket=system.bucket,
                           queue="index-accepted")
    env = {**os.environ, **system.operator_environment(), "LM_OPERATOR": "test-operator"}

    def human(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(LMCTL + list(args), capture_output=True, text=True, env=env, timeout=120)

    code, as_json = lmctl(system, "blockers", "list")
    work_keys = sorted(b["work_key"] for b in as_json["blockers"])
    assert code == 1 and work_keys == sorted(f"{KIND_ACCEPTED}:{k}" for k in keys)  # --json: whole, as before
    table = human("blockers", "list")
    assert table.returncode == 1 and max(len(line) for line in table.stdout.splitlines()) <= 100, table.stdout
    ids = [line.split("│")[1].strip() for line in table.stdout.splitlines() if line.startswith("│ ")]
    assert len(ids) == 3 and all(sum(hex_token(w).startswith(i) for w in work_keys) == 1 for i in ids), ids
    short = {i: next(w for w in work_keys if hex_token(w).startswith(i)) for i in ids}
    wide = human("blockers", "list", "--output", "wide")
    assert all(w in wide.stdout for w in work_keys), wide.stdout
    first, second, third = sorted(short)
    r = human("blockers", "skip", first, "--reason", "retired")  # the id the table shows
    assert r.returncode == 0 and short[first] in r.stdout, r.stdout + r.stderr
    r = human("blockers", "skip", KIND_ACCEPTED, short[second].split(":", 1)[1], "--reason", "retired")  # KIND OBJECT
    assert r.returncode == 0 and short[second] in r.stdout, r.stdout + r.stderr
    r = human("blockers", "resume", f"{KIND_ACCEPTED}:")  # the start of several work keys: refused, named
    assert r.returncode == 2 and "several blockers start with" in r.stderr and all(w in r.stderr for w in work_keys)
    miss = third[:-1] + ("0" if third[-1] != "0" else "1") + "zz"
    r = human("blockers", "skip", short[third][:-2] + "x", "--reason", "retired")
    assert r.returncode == 2 and f"did you mean {short[third]}" in r.stderr, r.stderr
    r = human("blockers", "skip", miss, "--reason", "retired")
    assert r.returncode == 2 and "no blocker" in r.stderr, r.stderr
    code, out = lmctl(system, "blockers", "show", third)  # the whole blocker, by its short id
    assert code == 0 and out["work_key"] == short[third] and out["object_key"] in short[third], out
    r = human("blockers", "show", third)
    assert r.returncode == 0 and short[third] in r.stdout, r.stdout
    code, out = lmctl(system, "blockers", "skip", third, "--reason", "retired")
    assert code == 0 and out["work_key"] == short[third] and out["status"] == "skipped"


def test_blocker_commands_take_the_object_the_table_shows_and_suggest_the_match(system):  # type: ignore[no-untyped-def]
    # Issue 27 item 4: the table shows kind and object apart; `blockers skip <object>` answered
    # `no blocker` with no suggestion. The object alone now names its blocker, and a typo gets the match.
    ctx = system.work_context(policy=FAST)
    key = ctx.codec.accepted(ident(41))
    process_sqs_record(ctx, s3_record(system.bucket, key), kind=KIND_ACCEPTED, bucket=system.bucket,
                       queue="index-accepted")
    env = {**os.environ, **system.operator_environment(), "LM_OPERATOR": "test-operator", "COLUMNS": "400"}

    def human(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(LMCTL + list(args), capture_output=True, text=True, env=env, timeout=120)

    listed = human("blockers", "list", "--output", "wide")
    assert listed.returncode == 1 and key in listed.stdout
    assert "(WORK_KEY = kind:object, or the object alone when only one blocker is about it)" in listed.stdout
    typo = key[:-3] + key[-2:]  # one character dropped
    r = human("blockers", "skip", typo, "--reason", "retired")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (f"error: no blocker {typo!r} (WORK_KEY is kind:object, or the object alone); "
                                f"did you mean {KIND_ACCEPTED}:{key}?"), r.stderr
    r = human("blockers", "skip", key, "--reason", "retired")
    assert r.returncode == 0 and "skip: skipped" in r.stdout and f"{KIND_ACCEPTED}:{key}" in r.stdout, r.stdout
