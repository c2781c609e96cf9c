"""A walk key's success clears its retry budget, also across a resume (docs/protocol.md §11 O1a,
§13 W5): a key settled by its time entry never runs a unit, so the page must know that it failed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from conftest import FAST, ident
from test_reconcile_budget import FailingGets
from test_walk_checks import _NS, HOUR, accept_at, system  # noqa: F401  (the fixture)

from lightmetrics.derived.indexing import KIND_REPAIR, index_accepted
from lightmetrics.derived.walk import Walker, WalkRetryLater


def resume_to_the_end(system) -> None:  # type: ignore[no-untyped-def]
    """`walk start --resume` in a new process: every page once, with retry_count 0."""
    resumed = Walker(system.work_context(policy=FAST), system.settings)
    out = resumed.begin({"input": {"resume": True}, "execution_arn": "second", "state_machine_arn": "-"})
    for _ in range(10):
        out = resumed.plan({"walk": out["walk"]})
        if out["next"] != "pages":
            break
        for work in out["work"]:
            resumed.page({"walk": out["walk"], "item": work, "retry_count": 0})
    assert out["next"] == "finish", out


def test_a_resumed_walk_clears_the_budget_of_a_key_that_failed_before_it_was_settled_present(  # type: ignore[no-untyped-def]
        system, runtime):  # noqa: F811
    at = HOUR.start_ns + 600 * _NS
    accept_at(system, runtime, at, [ident(n, agent="a", boot="b") for n in range(2)])
    (lost,) = accept_at(system, runtime, at, [ident(7, agent="a", boot="b")], index=False)  # its events were lost
    ctx = system.work_context(policy=FAST)
    work_key = f"{KIND_REPAIR}:{lost.manifest_key}"

    # The first execution: the lost record's repair keeps failing (its GET times out) until Step
    # Functions gives up on the page and the walk fails.
    walker = Walker(dataclasses.replace(ctx, store=FailingGets(ctx.store, {lost.manifest_key})), system.settings)
    out = walker.plan(walker.begin({"input": {}, "execution_arn": "first", "state_machine_arn": "-"}))
    [item] = out["work"]
    for attempt in range(2):
        with pytest.raises(WalkRetryLater):
            walker.page({"walk": out["walk"], "item": item, "retry_count": attempt})
    walker.end({"walk": out["walk"], "outcome": "failed", "error": {"Error": "WalkRetryLater"}})
    assert ctx.budget.get(work_key).count == 2

    index_accepted(ctx, lost.manifest_key)  # meanwhile its time entry is created (the reconciler, an event)

    # `walk start --resume`, in a new process: the page runs with retry_count 0, and W5 finds the
    # time entry present — the key must still go through its unit, and its success clear the budget.
    resume_to_the_end(system)
    assert system.work_context().budget.get(work_key) is None


class TaskDied(BaseException):
    """The Lambda runtime ends the task: nothing in the task catches it."""


class DyingStore:
    """The work context's store: every request naming one of ``poison`` kills the task (a Lambda
    timeout, an out-of-memory: not an exception the page can handle)."""

    def __init__(self, store: Any, poison: set[str]) -> None:
        self._store, self._poison = store, poison

    def _check(self, key: str) -> None:
        if any(p in key for p in self._poison):
            raise TaskDied(f"the task died at a request for {key}")

    def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self._check(key)
        return self._store.get(key, *args, **kwargs)

    def head(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self._check(key)
        return self._store.head(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_a_page_whose_attempts_all_died_still_has_its_keys_repaired_in_full_on_resume(  # type: ignore[no-untyped-def]
        system, runtime):  # noqa: F811
    """The page's first attempt records a failure in a key's budget and then dies (no RETRY_LATER
    write); so does every retry. A resumed walk must still repair that key in full, so that its
    success clears the budget: the retried attempt says so before its work."""
    at = HOUR.start_ns + 600 * _NS
    (killer,) = accept_at(system, runtime, at, [ident(1, agent="a", boot="b")])
    (lost,) = accept_at(system, runtime, at, [ident(7, agent="a", boot="b")], index=False)
    ctx = system.work_context(policy=FAST)
    work_key = f"{KIND_REPAIR}:{lost.manifest_key}"
    killer_range = ctx.codec.parse(killer.manifest_key).identity.seq_range  # in its record's and entries' keys
    dying = DyingStore(FailingGets(ctx.store, {lost.manifest_key}), {killer_range})
    walker = Walker(dataclasses.replace(ctx, store=dying), system.settings)
    out = walker.plan(walker.begin({"input": {}, "execution_arn": "first", "state_machine_arn": "-"}))
    [item] = out["work"]
    for attempt in range(3):  # the first attempt and Step Functions' retries: each one dies
        with pytest.raises(TaskDied):
            walker.page({"walk": out["walk"], "item": item, "retry_count": attempt})
    walker.end({"walk": out["walk"], "outcome": "failed", "error": {"Error": "States.Timeout"}})
    assert ctx.budget.get(work_key) is not None  # the lost record's unit failed at least once

    index_accepted(ctx, lost.manifest_key)  # meanwhile its time entry is created
    resume_to_the_end(system)
    assert system.work_context().budget.get(work_key) is None
