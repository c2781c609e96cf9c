"""The operators' principal (issue 28): ``lmctl`` against the local runtime signs as the operators' role, whose
policy is the stack's ``OperatorPolicy`` (lightmetrics.operator_tools.policies.operator_statements), with IAM
enforced. The runbook's commands pass; what an operator may not do is refused, naming the action.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError
from click.testing import CliRunner
from conftest import ident, make_frame
from test_walk import accept_all, make_system

from lightmetrics.operator_tools.policies import OPERATOR_PRINCIPAL


def _cli() -> Any:
    from lightmetrics.cli.main import cli

    return cli


def _lmctl(env: dict[str, str], *args: str) -> Any:
    return CliRunner().invoke(_cli(), [*args, "--json"], env={**env, "LM_OPERATOR": "test-operator"})


def test_lmctl_runs_as_the_operators_role(runtime: Any, clock: Any) -> None:
    system = make_system(runtime, clock)
    try:
        env = system.operator_environment()
        assert env["AWS_ACCESS_KEY_ID"] != "testing" and env["AWS_SESSION_TOKEN"]
        sts = system.role_session(OPERATOR_PRINCIPAL).client("sts")
        assert f"assumed-role/{system.queue_name_prefix}lm-operator/" in sts.get_caller_identity()["Arn"]
    finally:
        system.stop()


def test_the_runbooks_commands_pass_as_the_operator(runtime: Any, clock: Any) -> None:
    """Walk start and status, verify, show, blockers and conflicts lists, status, a token minted: each
    reads or starts what the operators' policy grants, under enforcement."""
    system = make_system(runtime, clock)
    try:
        idents = [ident(n, agent="op-agent") for n in range(3)]
        accept_all(system, runtime, clock, idents)
        env = system.operator_environment()
        r = _lmctl(env, "walk", "start", "--wait")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["status"] == "finished"
        for args in (("walk", "status"), ("verify",), ("blockers", "list"), ("conflicts", "list"),
                     ("agent-token", "--agent-id", "op-agent"),
                     ("show", "--agent-id", idents[0].agent_id, "--boot-id", idents[0].boot_id,
                      "--seq-start", str(idents[0].seq_start), "--seq-end", str(idents[0].seq_end))):
            r = _lmctl(env, *args)
            assert r.exit_code == 0, (args, r.output)
            assert "AccessDenied" not in r.output, (args, r.output)
    finally:
        system.stop()


def test_what_an_operator_may_not_do_is_refused(runtime: Any, clock: Any, tmp_path: Any) -> None:
    """``lmctl accept`` writes an acceptance record and a blob: an operator may not (only ingest
    does); nor may it delete any object."""
    system = make_system(runtime, clock)
    try:
        (result,) = accept_all(system, runtime, clock, [ident(1, agent="op-agent")])
        i = ident(2, agent="op-agent")
        frame = tmp_path / "f.lmf"
        frame.write_bytes(make_frame(i))
        r = _lmctl(system.operator_environment(), "accept", "--agent-id", i.agent_id, "--boot-id", i.boot_id,
                   "--seq-start", str(i.seq_start), "--seq-end", str(i.seq_end), "--frame", str(frame))
        assert r.exit_code != 0, r.output
        assert "not authorized to perform: s3:PutObject" in r.output, r.output
        r = _lmctl(system.environment(), "accept", "--agent-id", i.agent_id, "--boot-id", i.boot_id,
                   "--seq-start", str(i.seq_start), "--seq-end", str(i.seq_end), "--frame", str(frame))
        assert r.exit_code == 0, r.output  # the deployer may: it is the operator's policy that refuses

        s3 = system.role_session(OPERATOR_PRINCIPAL).client("s3")
        assert s3.get_object(Bucket=system.bucket, Key=result.manifest_key)["Body"].read()  # it reads ...
        with pytest.raises(ClientError, match="not authorized to perform: s3:DeleteObject"):
            s3.delete_object(Bucket=system.bucket, Key=result.manifest_key)  # ... and deletes nothing
    finally:
        system.stop()
