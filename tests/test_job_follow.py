"""The one follow loop of the walk's and the reap's controls (:meth:`lightmetrics.jobs.control.JobControl.follow`),
on the inline executions adapter: the executions say when a run ended, its checkpoint (what the job's
control reads) what it recorded and where it continued."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lightmetrics.harness.testing.memory import memory_system
from lightmetrics.harness.testing.memory.executions import InlineExecutions
from lightmetrics.jobs import control as job_control
from lightmetrics.jobs.control import JobControl, Observed
from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.clock import FrozenClock

RUNNING, FINISHED, FAILED = JobStatus.RUNNING, JobStatus.FINISHED, JobStatus.FAILED


Progress = Callable[[], Observed[dict[str, Any]]]


def _control(script: list[tuple[Observed[dict[str, Any]], dict[str, str]]]) -> tuple[JobControl, Progress, list[str]]:
    """A control whose checkpoint reads follow ``script``: each step is what the checkpoint says and
    the executions that end (arn -> status) once it was read; the last step repeats."""
    executions = InlineExecutions()
    for arn in ("inline:execution:a", "inline:execution:b"):
        executions.start("sm", arn.rsplit(":", 1)[1], {})
    control = JobControl(memory_system(clock=FrozenClock(0)).ctx, executions, "sm", "walk", sleep=lambda s: None)
    reads: list[str] = []

    def progress() -> Observed[dict[str, Any]]:
        observed, ended = script[min(len(reads), len(script) - 1)]
        reads.append(str(observed.status))
        for arn, status in ended.items():
            executions.end(arn, status)
        return observed

    return control, progress, reads


def test_a_run_is_followed_into_the_execution_it_continued_in_until_it_finishes() -> None:
    a, b = "inline:execution:a", "inline:execution:b"
    control, progress, _ = _control([
        (Observed({"n": 1}, RUNNING), {}),
        (Observed({"n": 2}, RUNNING, successor=b), {a: "SUCCEEDED"}),
        (Observed({"n": 2}, RUNNING, successor=b), {}),
        (Observed({"n": 3}, FINISHED, successor=b), {b: "SUCCEEDED"}),
    ])
    shown: list[dict[str, Any]] = []
    run = control.follow(a, progress=progress, on_progress=shown.append)
    assert (run.status, run.executions, run.detail, run.report) == ("finished", [a, b], "", {"n": 3})
    assert shown == [{"n": 1}, {"n": 2}, {"n": 3}]  # each report once, when it changed


def test_a_failed_run_says_what_it_recorded_and_a_refused_one_what_its_execution_said() -> None:
    a = "inline:execution:a"
    control, progress, _ = _control([(Observed({"n": 1}, RUNNING), {}),
                           (Observed({"n": 1}, FAILED, error="RuntimeError: boom"), {a: "FAILED"})])
    run = control.follow(a, progress=progress)
    assert (run.status, run.detail) == ("failed", "RuntimeError: boom")
    # a run that never wrote the checkpoint (another run holds the lease, whose summary says finished)
    control, progress, _ = _control([(Observed({"n": 0}, FINISHED), {a: "FAILED"})])
    run = control.follow(a, progress=progress)
    assert (run.status, run.detail) == ("failed", f"execution {a} FAILED")


def test_a_replaced_checkpoint_a_lost_handover_and_a_timeout_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    a = "inline:execution:a"
    control, progress, _ = _control([(Observed({"epoch": 4}, RUNNING, replaced="a newer walk replaced it"), {})])
    run = control.follow(a, progress=progress)
    assert (run.status, run.detail) == ("failed", "a newer walk replaced it")
    monkeypatch.setattr(job_control, "HANDOVER_S", -1.0)
    control, progress, _ = _control([(Observed({"n": 1}, RUNNING, successor=a), {a: "SUCCEEDED"})])
    run = control.follow(a, progress=progress)
    assert (run.status, run.detail) == ("failed", f"{a} ended without a successor")
    control, progress, reads = _control([(Observed({"n": 1}, RUNNING), {})])
    run = control.follow(a, progress=progress, timeout_s=-1)
    assert (run.status, run.detail, len(reads)) == ("failed", "timed out following the walk", 1)
