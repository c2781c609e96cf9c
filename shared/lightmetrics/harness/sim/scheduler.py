"""The deterministic scheduler: real service code as actors, one at a time, switched at storage calls.

Each actor runs in its own thread, but only the actor holding the baton runs: at every storage call
(:meth:`Scheduler.before_call`, from the port proxies) it hands the baton back, and the scheduler's
seeded ``random.Random`` picks which unfinished actor proceeds next. The baton is a pair of plain
locks per hand-over (the actor's ``go``, the scheduler's ``back``): one release wakes exactly the
thread whose turn it is, where a shared condition woke every waiting actor at every step. So a seed fixes the interleaving,
the faults and the clock, and two runs of one seed produce the same trace. Threads a service starts
itself (a pool) call while their actor holds the baton: they run as that actor. A pool of several
workers would make those calls in an order no seed fixes, so :func:`serial_pools` gives the services'
module-level pools one worker each for a run (their tasks then run in the order submitted), as
:mod:`~lightmetrics.harness.sim.runner` gives ``uuid4`` the seed: nothing in the services changes.

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
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

_NS = 1_000_000_000
#: where the services keep a pool of several workers (module, name), each at the module that uses it
SERVICE_POOLS = (("lightmetrics.derived.reconcile_scan", "_POOL"), ("lightmetrics.lambda_shell.sqs_batch", "_EXECUTOR"),
                 ("lightmetrics.derived.walk.page_task", "POOL"))


@contextmanager
def serial_pools() -> Iterator[None]:
    """Each of :data:`SERVICE_POOLS` one worker for the duration (tasks in submission order)."""
    saved = []
    for module_name, name in SERVICE_POOLS:
        module = importlib.import_module(module_name)
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sim-{name.strip('_').lower()}"))
    try:
        yield
    finally:
        for module, name, pool in saved:
            getattr(module, name).shutdown(wait=False)
            setattr(module, name, pool)


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
        self._back = threading.Lock()  # released by the running actor when it hands the baton back
        self._back.acquire()
        self._holder: Actor | None = None  # the actor running now (threads it started run as it)
        self._local = threading.local()

    def spawn(self, name: str, body: Callable[[Actor], None]) -> None:
        actor = Actor(name, body)
        actor.go.acquire()
        self.actors.append(actor)

    def current(self) -> Actor | None:
        return getattr(self._local, "actor", None) or self._holder

    def note(self, text: str) -> None:
        """A trace line of the running actor (faults, crash points, outcomes)."""
        actor = self.current()
        self.trace.append(f"{self.steps:05d} {actor.name if actor else '-'} {text}")

    def flag(self, violation: str) -> None:
        self.note(f"VIOLATION {violation}")
        self.flagged.append(violation)

    def before_call(self, operation: str, key: str, *, storage: bool = True) -> Actor | None:
        """Called by a proxy before each storage call: hand the baton back and wait for it again."""
        self.calls += storage
        actor = getattr(self._local, "actor", None)
        if actor is None:  # a service's own worker thread: it runs in its actor's turn
            if self._holder is not None and self._holder.crashed:
                raise SimCrash(f"{self._holder.name} is dead")
            self.note(f"{operation} {key}")
            return self._holder
        if actor.crashed:
            raise SimCrash(f"{actor.name} is dead")
        self._back.release()
        actor.go.acquire()
        if self.stopping:
            raise SimStop()
        self.note(f"{operation} {key}")
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
        try:
            if not self.stopping:
                actor.body(actor)
        except SimStop:
            pass
        except BaseException as exc:  # noqa: BLE001 - an actor's escape is reported, never lost
            actor.error = f"{type(exc).__name__}: {exc}"
        finally:
            actor.done = True
            self._back.release()

    def _give(self, actor: Actor) -> None:
        self._holder = actor
        actor.go.release()
        self._back.acquire()
        self._holder = None

    def run(self) -> None:
        """Until every actor is done; past ``max_steps`` the rest stop at their next call."""
        for actor in self.actors:
            actor.thread = threading.Thread(target=self._main, args=(actor,), name=f"sim-{actor.name}", daemon=True)
            actor.thread.start()
        while True:
            runnable = [a for a in self.actors if not a.done]
            if not runnable:
                break
            actor = self.rng.choice(runnable)
            self.clock.advance(ns=self.rng.randrange(0, self.max_tick_ms) * 1_000_000)
            if self.rng.random() < self.jump_rate:  # the world pauses (a slow actor): leases run out
                jump_s = self.rng.randrange(300, 1800)
                self.clock.advance(jump_s)
                self.jumps += 1
                self.trace.append(f"{self.steps:05d} - clock jump +{jump_s}s")
            self.steps += 1
            self.stopping = self.stopping or self.steps > self.max_steps
            self._give(actor)
            self.after_step()
        for actor in self.actors:
            assert actor.thread is not None
            actor.thread.join()


__all__ = ["SERVICE_POOLS", "Actor", "Scheduler", "SimClock", "SimCrash", "SimStop", "SkewedClock", "serial_pools"]
