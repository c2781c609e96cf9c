"""Issue 17: a state machine started from the console's default input either works or fails with a
message that says which field is wrong (never a bare "States.Runtime" or a hang)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from lightmetrics.local.system import LocalSystem

CONSOLE_DEFAULT = {"Comment": "Insert your JSON here"}


@pytest.fixture
def system(runtime):  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:10]
    s = LocalSystem(runtime, bucket=f"lm-cd-{tag}", table=f"lm-cd-{tag}", secret_name=f"lm-cd/{tag}",
                    queue_name_prefix=f"cd{tag}-").provision()
    s.notifications(False)
    yield s
    s.stop()


def test_console_default_input(system: LocalSystem, runtime: Any) -> None:
    sfn = runtime.boto3_client("stepfunctions")
    outcomes = {}
    for name, arn in sorted(system.settings.state_machine_arns.items()):
        run = sfn.start_execution(stateMachineArn=arn, input=json.dumps(CONSOLE_DEFAULT))["executionArn"]
        deadline = time.monotonic() + 60
        while (d := sfn.describe_execution(executionArn=run))["status"] == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.1)
        outcomes[name] = {k: d.get(k, "") for k in ("status", "error", "cause")}
    assert set(outcomes) == {"bootstrap-walk", "reap"}
    for name, out in outcomes.items():
        assert out["status"] == "FAILED" and out["error"] in ("WalkNotStarted", "ReapNotStarted"), (name, out)
        # The execution's own cause carries the Begin task's message naming the offending field.
        assert "did not start: " in out["cause"] and "unknown input fields ['Comment']" in out["cause"], (name, out)
    assert system.reap_control().lease_live() is None and not system.walk_control().lease(), "nothing was started"
