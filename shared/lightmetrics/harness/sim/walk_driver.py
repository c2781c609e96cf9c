"""Walk executions as infra/statemachines/bootstrap_walk.asl.json runs them, in Python, one task a turn.

Begin is retried on ``WalkTransient`` and a dead Lambda (5 times); ``LeaseHeld`` or any other error
ends the execution unstarted. Plan, Continue and Finish: ``LeaseLost`` is never retried, transient
errors 5 times, then the Catch runs Abort (``end`` with ``failed``, 3 retries). A Page is retried on
``WalkRetryLater`` (6 times) and transient errors (3 times), each retry with the state's
``RetryCount`` in its input (``$$.State.RetryCount``: a retried page repairs its keys in full, O1a),
the same input otherwise; the Map's Catch runs Abort. Continue starts the next execution (same lease,
epoch and owner), which this driver runs from its Begin, as Step Functions would. A task's Retry
moves the world's clock by its backoff.

The driver's check: an execution whose End answered holds no walk lease after it (rule L2).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from lightmetrics.derived.walk import LEASE_PK, Walker, WalkError
from lightmetrics.harness.sim.reap_driver import BUG_ERRORS
from lightmetrics.harness.sim.scheduler import Actor, SimCrash
from lightmetrics.harness.sim.world import World
from lightmetrics.harness.testing.memory.executions import InlineExecutions
from lightmetrics.work import leases
from lightmetrics.work.leases import LeaseError
from lightmetrics.work.units import TRANSIENT

MACHINE = "arn:aws:states:sim:0:stateMachine:bootstrap-walk"
_TRANSIENT = "transient"  # WalkTransient and the Lambda.* errors share the Retry entry
#: each task's Retry: error -> MaxAttempts (missing: not retried)
BEGIN = {_TRANSIENT: 5}
CONTROL = {"LeaseLost": 0, _TRANSIENT: 5}
PAGE = {"LeaseLost": 0, "WalkRetryLater": 6, _TRANSIENT: 3}
ABORT = {"*": 3}


class WalkExecution:
    """The tasks of one walk (across its executions) on one Walker (a warm container's)."""

    def __init__(self, world: World, actor: Actor, walker: Walker, clock: Any, executions: InlineExecutions) -> None:
        self.world, self.actor, self.walker, self.clock, self.executions = world, actor, walker, clock, executions
        self.ended = False
        self.crashed = False
        self.owner = ""

    def task(self, step: str, event: dict[str, Any], retry: dict[str, int], *, page: bool = False
             ) -> tuple[dict[str, Any] | None, str]:
        """The task under its Retry: (its answer, "") or (None, the error the Catch sees)."""
        tries: Counter[str] = Counter()
        count = 0
        while True:
            self.actor.crashed = False
            try:
                sent = {**event, "retry_count": count} if page else event
                return getattr(self.walker, step)(sent), ""
            except SimCrash:
                self.crashed = True
                name, bucket = "Lambda.ServiceException", _TRANSIENT  # a dead Lambda, retried with the same input
            except (WalkError, LeaseError) as exc:
                name = type(exc).__name__
                bucket = _TRANSIENT if name == "WalkTransient" else name
            except TRANSIENT as exc:  # the Lambda shell's mapping (lambda_shell.task_handler)
                name, bucket = f"WalkTransient({type(exc).__name__})", _TRANSIENT
            except Exception as exc:  # noqa: BLE001 - the state machine's Catch
                name = bucket = type(exc).__name__
                if name in BUG_ERRORS:
                    self.world.scheduler.flag(f"walk task {step} raised {name}: {exc}")
            self.world.scheduler.note(f"walk task {step} failed {name}")
            limit = retry.get(bucket, retry.get("*", 0))
            if tries[bucket] >= limit:
                return None, name
            tries[bucket] += 1
            count += 1
            self.clock.advance(2 * 2 ** (tries[bucket] - 1))

    def abort(self, walk: dict[str, Any], error: str) -> None:
        out, _ = self.task("end", {"walk": walk, "outcome": "failed", "error": {"Error": error}}, ABORT)
        self.ended = out is not None

    def run(self, inp: dict[str, Any], arn: str) -> str:
        """One walk from ``inp``'s Begin to its end (through Continue's executions); how it ended."""
        for _ in range(500):
            begun, error = self.task("begin", {"input": inp, "execution_arn": arn, "state_machine_arn": MACHINE},
                                     BEGIN)
            if begun is None:
                return f"not started: {error}"
            walk = begun["walk"]
            self.owner = str(walk["owner"])
            nxt = self._rounds(walk)
            if not nxt.startswith("continue "):
                return nxt
            arn = nxt.split(" ", 1)[1]
            inp = self.executions.inputs[arn]
        return "too many executions"

    def _rounds(self, walk: dict[str, Any]) -> str:
        for _ in range(2000):
            plan, error = self.task("plan", {"walk": walk}, CONTROL)
            if plan is None:
                self.abort(walk, error)
                return f"failed: plan {error}"
            walk = plan["walk"]
            if plan["next"] == "finish":
                out, error = self.task("end", {"walk": walk, "outcome": "finished"}, CONTROL)
                if out is None:
                    self.abort(walk, error)
                    return f"failed: finish {error}"
                self.ended = True
                return "finished"
            if plan["next"] == "continue":
                out, error = self.task("cont", {"walk": walk}, CONTROL)
                if out is None:
                    self.abort(walk, error)
                    return f"failed: continue {error}"
                return f"continue {out['next_execution']}"
            work = list(plan["work"])
            self.world.rng.shuffle(work)  # the Map's iterations run in any order
            for item in work:
                page, error = self.task("page", {"walk": walk, "item": item}, PAGE, page=True)
                if page is None:
                    self.abort(walk, error)
                    return f"failed: page {error}"
        return "too many rounds"


def walk(world: World, inputs: list[dict[str, Any]], *, delay: int = 0, outcomes: list[str] | None = None) -> Any:
    """Walks of ``inputs`` one after another (an operator's ``lmctl walk start``); each one's end in ``outcomes``."""
    def body(actor: Actor) -> None:
        for _ in range(delay):
            world.scheduler.pause("Schedule")
        clock = world.clock_for()
        executions = InlineExecutions("sim")
        walker = Walker(world.work_context(clock), world.system.settings, executions=executions)
        for n, inp in enumerate(inputs):
            execution = WalkExecution(world, actor, walker, clock, executions)
            arn = f"sim:execution:walk-{actor.name}-{n}"
            ended = execution.run(inp, arn)
            world.scheduler.note(f"walk {ended}")
            if outcomes is not None:
                outcomes.append(ended)
            if execution.ended and not execution.crashed:  # a dead task's lease only expires
                lease = leases.read(world.system.table, LEASE_PK)
                if lease is not None and lease.is_live(world.clock.now_ns()) and lease.owner == execution.owner:
                    world.scheduler.flag(f"the walk lease is held after its End answered: {lease}")
    return body


__all__ = ["WalkExecution", "walk"]
