"""Least privilege proven by use (issue 28): the local runtime's moto enforces IAM, and every function, state
machine task and job runs as the principal the stack's role would be, with exactly the role's statements
(lightmetrics.operator_tools.policies, the one source CDK builds the roles from too).

These tests keep enforcement from being silently off: a principal is refused what its policy does not
grant, and taking one statement away from one role fails the path that needs it with ``AccessDenied``
naming the action.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import FAST, ident
from test_walk import accept_all, make_system, run_walk

from lightmetrics.derived.indexing import index_accepted
from lightmetrics.derived.walk.errors import InvalidWalkInput
from lightmetrics.local.iam_enforcement import enforced
from lightmetrics.local.principals import (
    POLICY_NAME,
    function_role_name,
    local_policy_arns,
    provision_principals,
    role_name,
)
from lightmetrics.local.system import LocalSystem
from lightmetrics.operator_tools.policies import PolicyArns, Statement, function_principal, principals


def _arns(system: LocalSystem) -> PolicyArns:
    return local_policy_arns(system.made, namespace=system.prefix, name_prefix=system.queue_name_prefix)


def _reprovision(system: LocalSystem, overrides: dict[str, list[Statement]] | None = None) -> None:
    provision_principals(system.runtime.boto3_client, system.spec, _arns(system), name_prefix=system.queue_name_prefix,
                         ops_bucket=system.made["bucket_arn"], overrides=overrides)


def _without(system: LocalSystem, principal: str, action: str, sid: str | None = None) -> dict[str, list[Statement]]:
    """``principal``'s statements with the one granting ``action`` called ``sid`` (None: the one without
    a Sid, not the event source mapping's) taken away."""
    statements = principals(_arns(system), system.spec, ops_bucket=system.made["bucket_arn"], with_triggers=True)
    kept = [s for s in statements[principal] if action not in s["Action"] or s.get("Sid") != sid]
    assert len(kept) == len(statements[principal]) - 1, f"{principal} has no one statement granting {action}"
    return {principal: kept}


def test_the_runtime_enforces_iam_and_each_role_has_exactly_the_stacks_statements(runtime: Any, clock: Any) -> None:
    assert enforced()
    system = make_system(runtime, clock)
    try:
        iam = runtime.boto3_client("iam")
        wanted = principals(_arns(system), system.spec, ops_bucket=system.made["bucket_arn"], with_triggers=True)
        assert set(system.made["roles"]) == set(wanted)
        for principal, statements in wanted.items():
            got = iam.get_role_policy(RoleName=role_name(principal, system.queue_name_prefix), PolicyName=POLICY_NAME)
            document = got["PolicyDocument"]
            document = json.loads(document) if isinstance(document, str) else document
            assert document["Statement"] == statements, principal
        for fn in system.spec.functions:  # each function runs as its role
            role = function_role_name(system.function_name(fn.name))
            assert role == role_name(function_principal(fn), system.queue_name_prefix), fn.name
        assert {"gc", "pipeline-job", "sm-bootstrap-walk", "sm-reap", "fn-reap-retention"} <= set(wanted)
        assert "fn-reap-gc" not in wanted  # GC runs as the GC role, apart from retention's
    finally:
        system.stop()


def test_a_principal_is_refused_what_its_role_does_not_grant(runtime: Any, clock: Any) -> None:
    system = make_system(runtime, clock)
    try:
        s3 = system.principal_session("index-accepted").client("s3")
        with pytest.raises(ClientError) as refused:
            s3.put_object(Bucket=system.bucket, Key="raw-blobs/v1/" + "0" * 64, Body=b"x", IfNoneMatch="*")
        assert refused.value.response["Error"]["Code"] == "AccessDenied"
        assert "s3:PutObject" in str(refused.value) and "assumed-role/" in str(refused.value)
        ddb = system.principal_session("ingest").client("dynamodb")  # ingest only reads the table
        with pytest.raises(ClientError) as refused:
            ddb.put_item(TableName=system.table, Item={"pk": {"S": "x"}, "sk": {"S": "y"}})
        assert refused.value.response["Error"]["Code"] == "AccessDeniedException"
        assert "dynamodb:PutItem" in str(refused.value)
        with pytest.raises(ClientError) as refused:  # an unknown key is no principal at all
            runtime.boto3_client("s3", aws_access_key_id="AKIA" + uuid.uuid4().hex[:16].upper(),
                                 aws_secret_access_key="x").list_buckets()
        assert refused.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    finally:
        system.stop()


def test_memoized_policy_decisions_are_motos_own(runtime: Any, clock: Any) -> None:
    """The access checks' memo (policy document, action, resource) -> decision gives exactly what moto's
    evaluation gives, on the stack's real policies and an explicit Deny, for requests allowed, refused for
    want of a grant and refused by a Deny; and the checks do go through it (a repeated request is a hit)."""
    from moto.iam.access_control import PermissionResult

    from lightmetrics.local.iam_enforcement import _MOTO_POLICY, policy_decision

    system = make_system(runtime, clock)
    try:
        wanted = principals(_arns(system), system.spec, ops_bucket=system.made["bucket_arn"], with_triggers=True)
        documents = [json.dumps({"Version": "2012-10-17", "Statement": st}) for st in wanted.values() if st]
        deny = {"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": f"{system.made['bucket_arn']}/accepted/*"}
        documents.append(json.dumps({"Version": "2012-10-17", "Statement": [*wanted["gc"], deny]}))
        actions = {a for st in wanted.values() for s in st for a in ([s["Action"]] if isinstance(s["Action"], str)
                                                                     else s["Action"])} | {"iam:CreateUser"}
        resources = [f"{system.made['bucket_arn']}/{k}" for k in ("accepted/v1/x.json", "raw-blobs/v1/ab", "other")]
        resources += [system.made["bucket_arn"], system.made["table_arn"], "*"]
        seen = set()
        for document in documents:
            for action in sorted(actions):
                for resource in resources:
                    expected = _MOTO_POLICY["class"](document).is_action_permitted(action, resource)
                    assert policy_decision(document, action, resource) == expected, (action, resource)
                    assert policy_decision(document, action, resource) == expected  # from the memo
                    seen.add(expected)
        assert seen == {PermissionResult.PERMITTED, PermissionResult.NEUTRAL, PermissionResult.DENIED}
        s3 = system.principal_session("index-accepted").client("s3")
        hits = policy_decision.cache_info().hits
        for _ in range(2):
            assert s3.list_objects_v2(Bucket=system.bucket, Prefix="accepted/")["KeyCount"] == 0
        assert policy_decision.cache_info().hits > hits
    finally:
        system.stop()


def test_one_statement_taken_away_fails_the_path_that_needs_it(runtime: Any, clock: Any) -> None:
    """The reconciler reads queue depths (sqs:GetQueueAttributes); the indexer writes its entries
    (s3:PutObject); the walk's first task reads and takes its lease (its role's one statement, on the
    table) — each fails, naming the action, once its role loses that one statement, and works again
    when it is back."""
    system = make_system(runtime, clock)
    try:
        results = accept_all(system, runtime, clock, [ident(n) for n in range(2)])
        _reprovision(system, _without(system, "fn-reconcile", "sqs:GetQueueAttributes"))
        with pytest.raises(Exception, match="not authorized to perform: sqs:GetQueueAttributes"):
            system.reconcile_every_shard()

        _reprovision(system, _without(system, "fn-index-accepted", "s3:PutObject"))
        ctx = system.work_context(policy=FAST, session=system.principal_session("index-accepted"))
        with pytest.raises(Exception, match="not authorized to perform: s3:PutObject"):
            index_accepted(ctx, results[0].manifest_key)

        _reprovision(system, _without(system, "fn-walk-begin", "dynamodb:PutItem"))  # its one statement
        with pytest.raises(InvalidWalkInput, match="walk-begin is not authorized to perform: dynamodb:GetItem"):
            run_walk(system, page_size=4)  # the task, run by the Step Functions interpreter, is refused

        _reprovision(system)  # every statement back: the same paths work
        system.reconcile_every_shard()
        index_accepted(ctx, results[0].manifest_key)
        assert run_walk(system, page_size=4).status == "finished"
    finally:
        system.stop()


def test_the_rollup_runs_as_the_pipeline_job_role(runtime: Any, clock: Any, spark: Any) -> None:
    """The Spark job (driver and executors) signs as the pipeline job role: a rollup commits under it, and
    fails naming s3:PutObject once the role loses its one grant to create rollups."""
    from dataclasses import replace

    from pipeline_support import H0, accept_indexed, access_for, make_system, varied_samples

    from lightmetrics.protocol.identity import BatchIdentity
    from lightmetrics_pipeline.rollup.job import RollupJob

    system = make_system(runtime, clock)
    try:
        accept_indexed(system, runtime, clock, BatchIdentity.create("agent-iam", "boot-1", 0, 99), varied_samples(1))
        job_session = system.role_session("pipeline-job")
        creds = job_session.credentials
        access = replace(access_for(system, runtime, "pipeline-rollup"), access_key=creds["aws_access_key_id"],
                         secret_key=creds["aws_secret_access_key"], session_token=creds["aws_session_token"])
        table = system.work_context(session=job_session).table
        _reprovision(system, _without(system, "pipeline-job", "s3:PutObject", "CreateRollupsAndAudits"))
        with pytest.raises(Exception, match="not authorized to perform: s3:PutObject"):
            RollupJob(spark, access, table=table, clock=clock, owner="iam").run([H0], first_open=H0.next())
        _reprovision(system)
        report = RollupJob(spark, access, table=table, clock=clock, owner="iam").run([H0], first_open=H0.next())
        assert report.hours[0].status == "committed", report.hours[0]
    finally:
        system.stop()


def test_lmctl_runs_the_pipeline_jobs_as_the_job_role_locally(runtime: Any, clock: Any, spark: Any,
                                                             monkeypatch: Any) -> None:
    """``lmctl pipeline audit`` pointed at the local runtime runs as the pipeline job role (as EMR Serverless
    runs it), not as the caller: with the deployer's credentials in the environment — allowed everything —
    it is refused the inventory once the job role loses its one grant to read it, and reads it again
    when the grant is back (the audit's own tests run it to the end as the job role)."""
    from click.testing import CliRunner

    from lightmetrics.cli.main import cli

    system = make_system(runtime, clock)
    try:
        accept_all(system, runtime, clock, [ident(n) for n in range(2)])
        for name, value in system.environment().items():
            monkeypatch.setenv(name, value)
        runner = CliRunner()
        assert runner.invoke(cli, ["inventory", "snapshot", "--json"]).exit_code == 0
        _reprovision(system, _without(system, "pipeline-job", "s3:GetObject", "ReadInventory"))
        out = runner.invoke(cli, ["pipeline", "audit", "--run-id", "iam-run", "--json"])
        assert out.exit_code != 0
        refusal = out.output + repr(out.exception)
        assert "pipeline-job" in refusal and "not authorized to perform: s3:GetObject" in refusal, refusal
        assert "inventory/" in refusal, refusal
    finally:
        system.stop()


def test_a_function_session_never_falls_back_to_the_deployer(runtime: Any, clock: Any) -> None:
    """A system provisioned with roles gives a function's session its role's credentials or refuses: a
    name that is no function of the spec, or a function whose role is gone, must not run as the deployer
    (allowed everything), which would turn enforcement silently off for that path."""
    system = make_system(runtime, clock)
    try:
        with pytest.raises(LookupError, match="reconciler"):
            system.principal_session("reconciler")  # a typo of "reconcile": no such function
        iam = runtime.boto3_client("iam")
        name = role_name("fn-sweep-dlq", system.queue_name_prefix)
        iam.delete_role_policy(RoleName=name, PolicyName=POLICY_NAME)
        iam.delete_role(RoleName=name)
        with pytest.raises(LookupError, match="sweep-dlq"):
            system.principal_session("sweep-dlq")
        assert system.principal_session("reconcile").credentials["aws_session_token"]  # the others still have theirs
        with pytest.raises(LookupError, match="pipeline-jobs"):
            system.role_session("pipeline-jobs")  # a typo of "pipeline-job": no such role
    finally:
        system.stop()


def test_what_docs_say_moto_does_and_does_not_check(runtime: Any, clock: Any) -> None:
    """docs/deploy.md, "IAM enforced locally": a HEAD of a given version needs s3:GetObjectVersion here
    as on AWS; a condition moto does not evaluate (any but sts:ExternalId: it gives no other request
    context) is ignored, so the statement grants without it — locally wider than on AWS."""
    system = make_system(runtime, clock)
    try:
        (result,) = accept_all(system, runtime, clock, [ident(1)])
        deployer = runtime.boto3_client("s3")
        version = deployer.head_object(Bucket=system.bucket, Key=result.manifest_key)["VersionId"]
        ingest = system.principal_session("ingest").client("s3")  # reads records, not their versions
        assert ingest.head_object(Bucket=system.bucket, Key=result.manifest_key)["VersionId"] == version
        with pytest.raises(ClientError) as refused:
            ingest.head_object(Bucket=system.bucket, Key=result.manifest_key, VersionId=version)
        assert refused.value.response["Error"]["Code"] in ("403", "AccessDenied")
        with pytest.raises(ClientError, match="not authorized to perform: s3:GetObjectVersion"):
            ingest.get_object(Bucket=system.bucket, Key=result.manifest_key, VersionId=version)
        # the operators' table writes are limited to their partitions by dynamodb:LeadingKeys on AWS;
        # here the condition is not evaluated: a write elsewhere is allowed (the synth tests check the limit)
        ddb = system.role_session("operator").client("dynamodb")
        ddb.put_item(TableName=system.table, Item={"pk": {"S": "not-an-operator-partition"}, "sk": {"S": "x"}})
        # ... while an action the role has no statement for is refused
        with pytest.raises(ClientError, match="not authorized to perform: dynamodb:Scan"):
            ddb.scan(TableName=system.table)
    finally:
        system.stop()


def test_the_dlq_sweeper_runs_as_its_role(runtime: Any, clock: Any) -> None:
    """The DLQ sweeper (no other test runs it as its role: the demo does not sweep) turns a dead letter into
    a blocker under its role, and is refused naming sqs:ReceiveMessage once it loses its DLQ statement."""
    from test_event_path import s3_record

    from lightmetrics.admin.blocker_actions import sweep_dlqs

    system = make_system(runtime, clock)
    try:
        (result,) = accept_all(system, runtime, clock, [ident(3)])
        body = s3_record(system.bucket, result.manifest_key)["body"]
        runtime.boto3_client("sqs").send_message(QueueUrl=system.settings.queue_urls["index-accepted-dlq"],
                                                 MessageBody=body)
        sweeper = system.work_context(session=system.principal_session("sweep-dlq"))
        _reprovision(system, _without(system, "fn-sweep-dlq", "sqs:ReceiveMessage"))
        with pytest.raises(Exception, match="not authorized to perform: sqs:ReceiveMessage"):
            sweep_dlqs(sweeper)
        _reprovision(system)
        assert sweep_dlqs(sweeper)["index-accepted-dlq"] == 1
        assert [b.object_key for b in system.work_context().blockers.list()] == [result.manifest_key]
    finally:
        system.stop()


def test_lmctl_invoke_runs_a_function_as_its_role_locally(runtime: Any, clock: Any, monkeypatch: Any) -> None:
    """``lmctl invoke FUNCTION`` pointed at the local runtime runs the handler as the function's role, not as
    the caller: with the deployer's key in the environment a shard's run is refused the queue depths once
    the reconciler's role loses its one grant to read them, and the scheduled fan-out its sends once it
    loses sqs:SendMessage."""
    from click.testing import CliRunner

    from functions.reconcile import app as reconcile_app
    from lightmetrics.cli.main import cli

    system = make_system(runtime, clock)
    reconcile_app.reset()  # the handler's container is built for this system, as its role
    try:
        for name, value in system.environment().items():
            monkeypatch.setenv(name, value)
        for event, action in (("shard", "sqs:GetQueueAttributes"), ("scheduled", "sqs:SendMessage")):
            args = ["invoke", "reconcile", "--event", f"events/reconcile/{event}.json", "--json"]
            _reprovision(system, _without(system, "fn-reconcile", action))
            reconcile_app.reset()
            out = CliRunner().invoke(cli, args)
            refusal = out.output + repr(out.exception)
            assert out.exit_code != 0 and "fn-reconcile" in refusal, refusal
            assert f"not authorized to perform: {action}" in refusal, refusal
            _reprovision(system)
            out = CliRunner().invoke(cli, args)
            assert out.exit_code == 0, out.output + repr(out.exception)
    finally:
        reconcile_app.reset()
        system.stop()
