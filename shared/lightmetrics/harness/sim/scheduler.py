"""The deterministic scheduler: real service code as actors, one at a time, switched at storage calls.

Each actor runs in its own thread, but only the actor holding the baton runs: at every storage call
(:meth:`Scheduler.before_call`, from the port proxies) its step ends — the step's checks
(``after_step``) run — and the scheduler's seeded ``random.Random`` picks which unfinished actor
proceeds next. That decision runs in the thread holding the baton, which passes it straight to the
picked actor's ``go`` lock (one release wakes exactly the thread whose turn it is) or, when the seed
picks the same actor again (always, with one actor left), simply goes on: no thread in between. So
a seed fixes the interleaving, the faults and the clock, and two runs of one seed produce the same
trace. A pool of several workers would make a service's calls in an order no seed fixes, so
:func:`serial_pools` gives the services' module-level pools an :class:`InlineExecutor` for a run
(their tasks run in the actor's thread, in the order submitted, each call a step of the actor's),
as :mod:`~lightmetrics.harness.sim.runner` gives ``uuid4`` the seed: nothing in the services
changes. A thread a service starts itself calls while its actor holds the baton: it runs as that actor.

Example:
    >>> import random
    >>> s = Scheduler(random.Random(1), SimClock(0))
    >>> s.spawn("a", lambda actor: [s.before_call("GetObject", "k") for _ in range(2)])
    >>> s.spawn("b", lambda actor: s.before_call("PutObject", "k"))
    >>> s.run(); [line.split()[1] for line in s.trace]
    ['a', 'a', 'b']
"""

from __future__ import annotations

import importlib
import os
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

_NS = 1_000_000_000
#: where the services keep a pool of several workers (module, name), each at the module that uses it
SERVICE_POOLS = (("lightmetrics.derived.reconcile_scan", "_POOL"), ("lightmetrics.lambda_shell.sqs_batch", "_EXECUTOR"),
                 ("lightmetrics.derived.walk.page_task", "POOL"))


class InlineExecutor(Executor):
    """An executor that runs each task at once in the caller's thread (its actor's turn, its calls
    scheduled as the actor's own), in the order submitted."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - a SimCrash too: the caller's result() raises it
            future.set_exception(exc)
        return future


class OneStepExecutor(InlineExecutor):
    """A pool on which a service sends requests at once (the audit's driver reading every marks
    partition): each task runs in the caller's thread, in the order submitted, and their calls are
    one step of its actor — no other actor's call between them, as none lands between requests sent
    together — each still meeting its own fault. Given where the service takes a pool."""

    def __init__(self, scheduler: "Scheduler") -> None:
        self.scheduler = scheduler

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        local = self.scheduler._local
        local.at_once = True
        try:
            return super().submit(fn, *args, **kwargs)
        finally:
            local.at_once = False


@contextmanager
def serial_pools() -> Iterator[None]:
    """Each of :data:`SERVICE_POOLS` an :class:`InlineExecutor` for the duration (restored after)."""
    inline = InlineExecutor()
    saved = []
    for module_name, name in SERVICE_POOLS:
        module = importlib.import_module(module_name)
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, inline)
    try:
        yield
    finally:
        for module, name, pool in saved:
            setattr(module, name, pool)


def pin_to_one_core() -> None:
    """Keep this thread, and the threads it starts after, on one CPU of those allowed (picked by
    process id, so parallel runs spread). Actors take turns, so a run uses one core; on two, each
    hand-over wakes a thread on the other core, which costs more than the turn (about a third of a
    run's CPU time). For a process that only simulates (``lmctl sim``); nothing else changes."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(allowed) > 1:
        os.sched_setaffinity(0, {allowed[os.getpid() % len(allowed)]})


class SimCrash(BaseException):
    """The actor's process died here (a BaseException: service code that catches ``Exception``
    must not survive it, as no code survives a killed Lambda)."""


class SimStop(BaseException):
    """The run's step budget is spent: every actor still running stops at its next storage call."""


class SimClock:
    """The scheduler's clock (S3's and DynamoDB's time); actors read it through :class:`SkewedClock`."""

    def __init__(self, now_ns: int) -> None:
        self._now = now_ns

    def now_ns(self) -> int:
        return self._now

    def advance(self, seconds: float = 0.0, *, ns: int = 0) -> None:
        self._now += int(seconds * _NS) + ns


class SkewedClock:
    """One actor's view of the time: the scheduler's clock plus the actor's skew."""

    def __init__(self, base: SimClock, skew_ns: int) -> None:
        self.base, self.skew_ns = base, skew_ns

    def now_ns(self) -> int:
        return self.base.now_ns() + self.skew_ns

    def advance(self, seconds: float = 0.0, *, ns: int = 0) -> None:
        """A Step Functions Wait inside an actor: the whole world's time moves."""
        self.base.advance(seconds, ns=ns)


@dataclass
class Actor:
    name: str
    body: Callable[[Actor], None]
    done: bool = False
    crashed: bool = False  # died at a call; every later call of this attempt dies too
    dry_run: bool = False  # runs a dry-run reap now: it may send no delete
    error: str | None = None
    thread: threading.Thread | None = field(default=None, repr=False)
    #: released by the scheduler to give this actor its turn (held while the actor waits)
    go: threading.Lock = field(default_factory=threading.Lock, repr=False)


class Scheduler:
    """Runs actors one at a time; ``trace`` is one line per storage call, in the order they ran."""

    def __init__(self, rng: random.Random, clock: SimClock, *, max_steps: int = 400,
                 after_step: Callable[[], None] | None = None, max_tick_ms: int = 1500) -> None:
        self.rng, self.clock, self.max_steps = rng, clock, max_steps
        self.after_step = after_step or (lambda: None)
        self.max_tick_ms = max_tick_ms
        self.actors: list[Actor] = []
        self.trace: list[str] = []
        self.steps = 0
        self.calls = 0  # storage calls, quiescence included (a pause is none)
        #: chance per step that the clock jumps minutes ahead (a slow actor whose lease expires)
        self.jump_rate = 0.0
        self.jumps = 0
        self.stopping = False
        #: safety violations found by the actors' drivers and the proxies (checked after each step)
        self.flagged: list[str] = []
        self._finished = threading.Lock()  # released when the last actor is done
        self._holder: Actor | None = None  # the actor running now (threads it started run as it)
        self._local = threading.local()
        self._error: BaseException | None = None  # what escaped ``after_step`` (``run`` raises it)

    def spawn(self, name: str, body: Callable[[Actor], None]) -> None:
        actor = Actor(name, body)
        actor.go.acquire()
        self.actors.append(actor)

    def start(self, actor: Actor) -> None:
        """The actor's thread (it waits for its first turn)."""
        actor.thread = threading.Thread(target=self._main, args=(actor,), name=f"sim-{actor.name}", daemon=True)
        actor.thread.start()

    def current(self) -> Actor | None:
        return None if self._holder is None else getattr(self._local, "actor", None) or self._holder

    def note(self, text: str) -> None:
        """A trace line of the running actor (faults, crash points, outcomes)."""
        actor = self.current()
        self.trace.append(f"{self.steps:05d} {actor.name if actor else '-'} {text}")

    def flag(self, violation: str) -> None:
        self.note(f"VIOLATION {violation}")
        self.flagged.append(violation)

    def before_call(self, operation: str, key: str, *, storage: bool = True) -> Actor | None:
        """Called by a proxy before each storage call: the step ends; the next one (maybe this
        actor's again) begins once the seed picked its actor."""
        self.calls += storage
        actor = getattr(self._local, "actor", None)
        if actor is None:  # a service's own worker thread: it runs in its actor's turn
            if self._holder is not None and self._holder.crashed:
                raise SimCrash(f"{self._holder.name} is dead")
            self.note(f"{operation} {key}")
            return self._holder
        if actor.crashed:
            raise SimCrash(f"{actor.name} is dead")
        at_once = getattr(self._local, "at_once", False)
        if at_once and getattr(self._local, "at_once_step", None) == self.steps:
            self.note(f"{operation} {key}")  # sent with the previous call (OneStepExecutor)
            return actor
        nxt = self._next()
        if nxt is not actor:
            self._give(nxt)
            actor.go.acquire()
        self._holder = actor
        if self.stopping:
            raise SimStop()
        self.note(f"{operation} {key}")
        self._local.at_once_step = self.steps if at_once else None
        return actor

    def pause(self, label: str) -> None:
        """A turn spent without a storage call (a poll, a schedule not yet due): a fresh
        invocation begins after it, so an earlier crash no longer applies."""
        actor = getattr(self._local, "actor", None)
        if actor is not None:
            actor.crashed = False
        self.before_call(label, "", storage=False)

    def _main(self, actor: Actor) -> None:
        self._local.actor = actor
        actor.go.acquire()
        self._holder = actor
        try:
            if not self.stopping:
                actor.body(actor)
        except SimStop:
            pass
        except BaseException as exc:  # noqa: BLE001 - an actor's escape is reported, never lost
            actor.error = f"{type(exc).__name__}: {exc}"
        finally:
            actor.done = True
            self._give(self._next())

    def _next(self, *, ended: bool = True) -> Actor | None:
        """The step's end (``after_step``) and the next step's actor: the seed picks it among those
        not done, and moves the clock. Runs in the thread holding the baton, so only one runs it;
        the baton then passes straight to the picked actor (no thread in between)."""
        self._holder = None
        if ended:
            try:
                self.after_step()
            except BaseException as exc:  # noqa: BLE001 - raised by run(), not into an actor
                self._error = self._error or exc
                self.stopping = True
        runnable = [a for a in self.actors if not a.done]
        if not runnable:
            return None
        actor = self.rng.choice(runnable)
        self.clock.advance(ns=self.rng.randrange(0, self.max_tick_ms) * 1_000_000)
        if self.rng.random() < self.jump_rate:  # the world pauses (a slow actor): leases run out
            jump_s = self.rng.randrange(300, 1800)
            self.clock.advance(jump_s)
            self.jumps += 1
            self.trace.append(f"{self.steps:05d} - clock jump +{jump_s}s")
        self.steps += 1
        self.stopping = self.stopping or self.steps > self.max_steps
        return actor

    def _give(self, actor: Actor | None) -> None:
        if actor is None:
            self._finished.release()
        else:
            actor.go.release()

    def run(self) -> None:
        """Until every actor is done; past ``max_steps`` the rest stop at their next call."""
        for actor in self.actors:
            self.start(actor)
        self._finished.acquire()
        self._give(self._next(ended=False))
        self._finished.acquire()
        self._finished.release()
        for actor in self.actors:
            assert actor.thread is not None
            actor.thread.join()
        if self._error is not None:
            raise self._error


__all__ = ["SERVICE_POOLS", "Actor", "InlineExecutor", "OneStepExecutor", "Scheduler", "SimClock", "SimCrash",
           "SimStop", "SkewedClock", "pin_to_one_core", "serial_pools"]
