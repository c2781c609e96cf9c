"""The soak's background chaos: collectors killed and restarted, scoped walks and GC reaps, on their periods.

Each job runs on a daemon thread every ``every_s`` until its stop event is set; a job that raises
is recorded in the report's ``errors`` (not a violation by itself) and runs again next period.
The pump's own chaos (lost S3 events, duplicated SQS deliveries) is :func:`every`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from lightmetrics.harness.soak_plan import SoakPlan, SoakReport


def every(n: int) -> Any:
    """A thread-safe predicate true on every nth call (the pump's drop/duplicate knobs)."""
    lock, seen = threading.Lock(), [0]

    def pick(_body: str) -> bool:
        with lock:
            seen[0] += 1
            return seen[0] % n == 0

    return pick


def periodic(stop: threading.Event, every_s: float, job: Any, first_after_s: float) -> threading.Thread:
    def loop() -> None:
        if stop.wait(first_after_s):
            return
        while True:
            job()
            if stop.wait(every_s):
                return

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


class SoakChaos:
    """The chaos jobs of one soak (``fleet`` and ``system`` are the soak's)."""

    def __init__(self, plan: SoakPlan, report: SoakReport, system: Any, fleet: Any) -> None:
        self.plan, self.report, self.system, self.fleet = plan, report, system, fleet
        self.rng = random.Random(plan.seed)

    def start(self, stop: threading.Event, agent_ids: list[str]) -> list[threading.Thread]:
        """The killer, scoped walks (one agent after another) and GC reaps, each first at half its period."""
        plan = self.plan
        walk_agents: Iterator[str] = iter(a for _ in range(10**6) for a in agent_ids)
        return [periodic(stop, plan.kill_every_s, self._guarded("killer", self.kill_one), plan.kill_every_s / 2),
                periodic(stop, plan.walk_every_s, self._guarded("walk", lambda: self.walk_once(next(walk_agents))),
                         plan.walk_every_s / 2),
                periodic(stop, plan.gc_every_s, self._guarded("gc", self.gc_once), plan.gc_every_s / 2)]

    def _guarded(self, name: str, job: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                job()
            except Exception as exc:
                self.report.errors.append(f"{name}: {type(exc).__name__}: {exc}")

        return run

    def kill_one(self) -> None:
        """SIGKILL a live collector (never the last one), then restart it."""
        alive = self.fleet.alive()
        if len(alive) < 2:
            return
        victim = self.rng.choice(alive)
        self.fleet.kill(victim)
        self.report.counters["collectors killed (SIGKILL)"] += 1
        time.sleep(self.plan.restart_after_s)
        try:
            self.fleet.restart(victim)
            self.report.counters["collectors restarted"] += 1
        except Exception as exc:
            self.report.errors.append(f"restart of collector-{victim + 1}: {exc}")

    def walk_once(self, agent: str | None = None) -> dict[str, Any] | None:
        """One bootstrap walk (of ``agent``, or all), followed to its end; None if another holds the lease."""
        from lightmetrics.derived.walk import LeaseHeld as WalkLeaseHeld

        report = self.report
        control = self.system.walk_control(self.system.work_context(component="walk"))
        try:
            started_walk = control.start(agent=agent, page_size=200, parallelism=4)
        except WalkLeaseHeld:
            report.counters["walks refused (lease held)"] += 1
            return None
        result = control.follow(started_walk, poll_s=0.3, timeout_s=self.plan.settle_timeout_s)
        summary = result.summary_json()
        entry = {"scope": agent or "all", "status": result.status, "keys": summary.get("keys", 0),
                 "repairs": summary.get("repairs", 0), "executions": len(result.executions),
                 "detail": result.detail}
        report.walks.append(entry)
        report.counters[f"walks {result.status}"] += 1
        return entry

    def gc_once(self) -> None:
        """One GC reap (``dry_run`` off), followed to its end."""
        from lightmetrics.reaps import LeaseHeld as ReapLeaseHeld

        report = self.report
        control = self.system.reap_control(self.system.work_context(component="reap"))
        try:
            arn = control.start(mode="gc", dry_run=False)
        except ReapLeaseHeld:
            report.counters["reaps refused (lease held)"] += 1
            return
        result = control.follow(arn, poll_s=0.5, timeout_s=self.plan.settle_timeout_s)
        shown = result.report.to_json() if result.report is not None else {}
        counts = {k: shown.get(k) for k in ("examined", "marked", "purged", "restored")}
        report.reaps.append({"mode": "gc", "status": result.status, **counts, "detail": result.detail})
        report.counters[f"gc reaps {result.status}"] += 1
        for k, v in counts.items():
            report.counters[f"gc {k}"] += int(v or 0)


__all__ = ["SoakChaos", "every", "periodic"]
