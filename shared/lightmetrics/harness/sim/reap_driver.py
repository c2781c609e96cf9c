"""Reap executions as infra/statemachines/reap.asl.json runs them, in Python, one task a turn.

Begin, Continue and Finish are retried on ``ReapTransient`` and on a dead Lambda; ``LeaseHeld`` or
any other error at Begin ends the execution unstarted (the next schedule begins again). Gc and
Retention tasks (and a Ranges visit's range tasks) are retried on any error but ``LeaseLost`` and
``InvalidReapInput``, 6 times, the clock moving by the Retry's backoff; then the Catch runs Abort
(``end`` with ``failed``). A dead Lambda is re-run with the same input. A Gc or Retention attempt may
meet a Lambda service error while its function runs on: the Retry starts the task again while the
first invocation, a twin actor (:func:`spawn_twin`), runs to its end beside it. A task's ``wait`` moves the
world's clock.

Three checks belong to the driver: a reap that is not a dry run finishes with no ``marks#`` item
left (G-I8: it settles a failed reap's marks before it ends); a dry run's execution sends no delete (``actor.dry_run`` is what
the store proxy checks; the lease check, :mod:`~lightmetrics.harness.sim.lease_check`, is told which
execution's lease the actor runs under), and an execution that ended without a crash leaves the reap lease to no
one but a running execution (a lost answer must not be read as someone else's take, §11.1).
"""

from __future__ import annotations

import threading
from typing import Any

from lightmetrics.harness.sim.reap_world import marks_left
from lightmetrics.harness.sim.scheduler import Actor, SimCrash
from lightmetrics.harness.sim.world import World
from lightmetrics.harness.testing.memory.executions import InlineExecutions
from lightmetrics.reaps import Reaper
from lightmetrics.reaps.params import LEASE_PK
from lightmetrics.work import leases

TASK_RETRIES, CONTROL_RETRIES, ABORT_RETRIES = 6, 5, 3
#: chance that a Gc or Retention attempt meets a Lambda service error while its function runs on
TWIN_RATE = 0.03
_NEVER_RETRIED = ("LeaseLost", "InvalidReapInput")
_CONTROL_RETRIED = ("ReapTransient",)
#: errors no fault can explain: a task raising one is a bug the simulation reports
BUG_ERRORS = ("DryRunWrite", "AssertionError", "TypeError", "AttributeError", "NameError", "KeyError")


class Execution:
    """One execution's tasks on one Reaper; ``crashed``: a Lambda of it died (its lease may outlive it)."""

    def __init__(self, world: World, actor: Actor, reaper: Reaper, clock: Any) -> None:
        self.world, self.actor, self.reaper, self.clock = world, actor, reaper, clock
        self.crashed = False
        self.errors: list[str] = []  # the error names its tasks raised
        self.ended = False  # its End task (finished or failed) answered

    def task(self, step: str, event: dict[str, Any], *, control: bool = False) -> dict[str, Any] | None:
        """The task with its Retry; None when its errors outlasted it (the Catch decides)."""
        retries = CONTROL_RETRIES if control else TASK_RETRIES
        for attempt in range(retries + 1):
            self.actor.crashed = False
            if not control and self.world.faults.enabled and self.world.rng.random() < TWIN_RATE:
                # Lambda.ServiceException while the function runs: the invocation goes on, the Retry
                # starts another beside it (docs/protocol.md §13 L2, L3)
                spawn_twin(self.world, self.actor, step, event)
                self.clock.advance(2 * 2 ** attempt)
                continue
            try:
                return getattr(self.reaper, step)(event)  # type: ignore[no-any-return]
            except SimCrash:
                self.crashed = True
                continue
            except Exception as exc:  # noqa: BLE001 - the state machine's Retry and Catch
                name = type(exc).__name__
                self.errors.append(name)
                self.world.scheduler.note(f"task {step} failed {name}: {exc}")
                if name in BUG_ERRORS:
                    self.world.scheduler.flag(f"reap task {step} raised {name}: {exc}")
                if name in _NEVER_RETRIED or (control and name not in _CONTROL_RETRIED):
                    return None
                self.clock.advance(2 * 2 ** attempt)
        return None

    def abort(self, reap: dict[str, Any]) -> None:
        for _ in range(ABORT_RETRIES + 1):
            if self.task("end", {"reap": reap, "outcome": "failed", "error": {"Error": "TaskFailed"}}, control=True):
                self.ended = True
                return

    def drive(self, out: dict[str, Any]) -> None:
        """From Begin's answer to the end of the reap (through Continue's executions)."""
        for _ in range(2000):
            nxt = out["next"]
            if nxt == "finish":
                self.ended = self.task("end", {"reap": out["reap"], "outcome": "finished"}, control=True) is not None
                left = [] if out["reap"].get("dry_run") else marks_left(self.world)
                if self.ended and left:  # G-I8: the one way a reap ends is with no marks# item left
                    self.world.scheduler.flag(f"reap epoch {out['reap']['epoch']} finished with marks left: {left[:3]}")
                return None
            if nxt == "continue":
                started = self.task("cont", {"reap": out["reap"]}, control=True)
                if started is None:
                    return self.abort(out["reap"])
                arn = started["next_execution"]
                begun = self.task("begin", {"input": self.reaper.executions.inputs[arn], "execution_arn": arn}, control=True)
                if begun is None:
                    return None
                out = begun
                continue
            if nxt == "ranges":
                for item in out["ranges"]:
                    event = {"reap": out["reap"], "job": out["range_job"], "range": item}
                    if self.task(item["task"], event) is None:
                        return self.abort(out["reap"])
                nxt = "retention"
            elif nxt == "wait":
                self.clock.advance(out["wait_s"])
                nxt = out["after"]
            got = self.task(nxt, {"reap": out["reap"]})
            if got is None:
                return self.abort(out["reap"])
            out = got
        return None


def spawn_twin(world: World, actor: Actor, step: str, event: dict[str, Any]) -> None:
    """The replaced invocation, an actor of its own (its own Lambda clock) that runs the task once
    beside the execution; it is under the same lease as the execution that started it."""
    scheduler, holder = world.scheduler, world.store.watch.holders.get(actor.name)
    name = f"{actor.name.split('#')[0]}#twin{sum(a.name.startswith(actor.name + '#') for a in scheduler.actors)}"
    reaper = Reaper(world.work_context(world.clock_for()), world.system.settings, executions=InlineExecutions("sim"))
    dry_run = actor.dry_run

    def body(twin: Actor) -> None:
        twin.dry_run = dry_run
        if holder is not None:
            world.store.watch.hold(twin, {"owner": holder[0], "epoch": holder[1]})
        try:
            getattr(reaper, step)(event)
        except SimCrash:
            pass
        except Exception as exc:  # noqa: BLE001 - its answer goes nowhere: the execution moved on
            name = type(exc).__name__
            scheduler.note(f"twin task {step} failed {name}: {exc}")
            if name in BUG_ERRORS:
                scheduler.flag(f"reap task {step} (a twin) raised {name}: {exc}")

    scheduler.note(f"Lambda.ServiceException {step}: the invocation runs on as {name}")
    scheduler.spawn(name, body)
    twin = scheduler.actors[-1]
    twin.thread = threading.Thread(target=scheduler._main, args=(twin,), name=f"sim-{name}", daemon=True)
    twin.thread.start()


def reap(world: World, inputs: list[dict[str, Any]], *, delay: int = 0, begins: int = 6) -> Any:
    """Reap executions of ``inputs`` one after another (each begun again while another holds the lease)."""
    def body(actor: Actor) -> None:
        for _ in range(delay):
            world.scheduler.pause("Schedule")
        for inp in inputs:
            clock = world.clock_for()
            execution = Execution(world, actor, Reaper(world.work_context(clock), world.system.settings,
                                                       executions=InlineExecutions("sim")), clock)
            actor.dry_run = bool(inp.get("dry_run"))
            for n in range(begins):
                arn = f"sim-{actor.name}-{len(world.scheduler.trace)}-{n}"
                out = execution.task("begin", {"input": inp, "execution_arn": arn}, control=True)
                if out is not None:
                    world.store.watch.hold(actor, out["reap"])  # the lease check (harness/sim/lease_check.py)
                    execution.drive(out)
                    world.store.watch.hold(actor, None)
                _lease_left(world, execution, arn)
                if out is not None:
                    break
                world.scheduler.pause("Schedule")
            actor.dry_run = False
    return body


def _lease_left(world: World, execution: Execution, arn: str) -> None:
    """An execution whose End answered, or whose Begin said another holds the lease, holds no
    lease, unless a Lambda of it died (a dead one's lease expires; so does one a Begin that failed
    otherwise left)."""
    if execution.crashed or not (execution.ended or execution.errors[-1:] == ["LeaseHeld"]):
        return
    lease = leases.read(world.system.table, LEASE_PK)
    if lease is not None and lease.is_live(world.clock.now_ns()) and lease.execution == arn:
        world.scheduler.flag(f"the reap lease is held by execution {arn}, which ended without a crash: {lease}")


__all__ = ["BUG_ERRORS", "Execution", "reap"]
