"""One soak agent: a producer thread spooling batches (now and then a conflict) and a sender thread draining them."""

from __future__ import annotations

import hashlib
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lightmetrics.harness.soak_plan import SoakPlan, SoakReport
from lightmetrics.protocol.frame import Sample, encode_frame
from lightmetrics.protocol.identity import BatchIdentity


class SoakAgent:
    """One agent: a producer thread spooling batches and a sender thread draining the spool."""

    def __init__(self, n: int, plan: SoakPlan, token: str, endpoints: list[str], spool: Path,
                 report: SoakReport, lock: threading.Lock) -> None:
        from lightmetrics.client import AgentClient

        self.n, self.plan, self.report, self.lock = n, plan, report, lock
        self.agent_id, self.boot_id = f"soak-agent-{n:02d}", f"boot-{n:02d}"
        self.produced: dict[BatchIdentity, str] = {}  # identity -> sha of the bytes spooled first
        self.alerts: list[Any] = []
        self.token = token
        self.client = AgentClient(agent_id=self.agent_id, token=token, endpoints=endpoints, spool=spool,
                                  parked_retry_s=5.0, request_timeout_s=10.0, on_alert=self.alerts.append,
                                  rng=random.Random(plan.seed * 1000 + n))
        self.client.endpoint_index = n % len(endpoints)
        self.rng = random.Random(plan.seed * 7919 + n)
        self.seq = 0
        self.outcomes: list[Any] = []

    def frame(self, ident: BatchIdentity, variant: float = 0.0) -> bytes:
        base = time.time_ns()
        samples = [Sample(metric="soak.value", labels={"agent": self.agent_id, "i": str(i)},
                          ts_unix_ns=base + i, value=self.rng.uniform(0, 100) + variant)
                   for i in range(ident.seq_end - ident.seq_start + 1)]
        return encode_frame(ident, samples, compress=self.rng.random() < 0.5)

    def produce(self, stop: threading.Event) -> None:
        per = self.plan.samples_per_batch
        batch = 0
        while not stop.is_set():
            ident = BatchIdentity.create(self.agent_id, self.boot_id, self.seq, self.seq + per - 1)
            self.seq += per
            body = self.frame(ident)
            self.client.enqueue(ident, body)
            self.produced[ident] = hashlib.sha256(body).hexdigest()
            batch += 1
            if batch % self.plan.conflict_every == 0:
                self._conflict()
            stop.wait(self.plan.batch_pause_s)

    def _conflict(self) -> None:
        """Other bytes for an identity produced earlier and already sent (acknowledged, usually)."""
        done = [o.identity for o in list(self.outcomes) if o.action in ("accepted", "duplicate")]
        if not done:
            return
        ident = self.rng.choice(done)
        spool_dir = Path(tempfile.mkdtemp(prefix="lm-soak-conflict-"))
        try:
            # Another client instance on a scratch spool: the agent's own spool refuses other bytes
            # for an identity it holds, and a real conflict is a *different* submitter anyway.
            from lightmetrics.client import AgentClient

            other = AgentClient(agent_id=self.agent_id, token=self.token,
                                endpoints=[e.url for e in self.client.endpoints], spool=spool_dir,
                                request_timeout_s=10.0, on_alert=self.alerts.append)
            other.enqueue(ident, self.frame(ident, variant=0.5))
            out = other.drain(timeout_s=30)
            with self.lock:
                self.report.counters["conflicts submitted"] += 1
                self.report.counters["conflicts parked"] += out.newly_parked
            other.close()
        finally:
            for p in sorted(spool_dir.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
            spool_dir.rmdir()

    def send(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                out = self.client.run_once()
            except Exception as exc:  # an agent that stops is a finding, not a crash of the soak
                with self.lock:
                    self.report.errors.append(f"{self.agent_id}: {type(exc).__name__}: {exc}")
                stop.wait(1.0)
                continue
            self._count(out)
            if not out.outcomes:
                stop.wait(0.1)

    def _count(self, out: Any) -> None:
        self.outcomes.extend(out.outcomes)
        with self.lock:
            for o in out.outcomes:
                self.report.counters[f"client {o.action}"] += 1
            self.report.counters["client failovers"] += out.failovers
            self.report.counters["client network errors"] += out.network_errors
            self.report.counters["client timeouts"] += out.timeouts
            for word, k in out.answers.items():
                self.report.counters[f"answer {word}"] += k

    def drain(self, timeout_s: float) -> bool:
        out = self.client.drain(timeout_s=timeout_s, poll_s=0.2)
        self._count(out)
        return out.pending == 0


__all__ = ["SoakAgent"]
