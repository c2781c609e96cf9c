"""The demo's accept phase parts: the simulated agents, the victim collector, the deliberate conflict.

Agents are threads, each draining its own durable spool through the agent client; one collector
is told (by a fault rule) to stall right after a raw-blob PUT landed, and is then killed with
SIGKILL by :func:`kill_victim_when_stalled`. After the batches, one agent sends other content for
an identity already accepted (:func:`deliberate_conflict`).
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from lightmetrics.aws.s3_store import S3ObjectStore
from lightmetrics.harness.demo_report import Ack, DemoReport, DemoScale
from lightmetrics.local.collectors import CollectorFleet
from lightmetrics.protocol.frame import Sample, encode_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyKind, layout_root


def _samples(agent: int, batch: int, n: int, base_ns: int, variant: float = 0.0) -> list[Sample]:
    rng = random.Random(agent * 1_000_003 + batch)
    return [
        Sample(
            metric=("cpu.usage" if i % 2 == 0 else "mem.rss"),
            labels={"host": f"host-{agent:02d}", "core": str(i % 4)},
            ts_unix_ns=base_ns + (batch * n + i) * 1_000_000_000,
            value=round(rng.uniform(0, 100), 3) + variant,
        )
        for i in range(n)
    ]


def victim_faults(scale: DemoScale, marker: Path) -> dict[str, str]:
    """The victim collector stalls right after a raw-blob PUT landed (then it is killed)."""
    rule = {"fault": "stall_after_landing", "operation": "PutObject", "key_contains": layout_root(KeyKind.RAW_BLOB),
            "after": scale.kill_after_blob_puts, "times": 1, "stall_s": 120, "marker_file": str(marker)}
    return {"LM_FAULTS": json.dumps([rule])}


def kill_victim_when_stalled(fleet: CollectorFleet, victim: int, marker: Path, stop: threading.Event,
                             report: DemoReport) -> None:
    while not stop.is_set():
        if marker.exists():
            key = marker.read_text()
            fleet.kill(victim)  # SIGKILL: no cleanup, no response
            report.killed = {
                "killed": True,
                "collector": f"collector-{victim + 1}",
                "signal": "SIGKILL",
                "stalled_after": "raw blob PUT landed, before the acceptance record",
                "blob_key": key.split("/", 4)[-1] if key else "",
            }
            return
        time.sleep(0.02)


class DemoAgent:
    """A simulated agent: encodes its batches, spools them and drains the spool with the agent
    client (:class:`lightmetrics.client.AgentClient`), which fails over across the collectors,
    backs off on 503 and parks conflicts. ``client`` stays usable after the accept phase (its
    parked batches, ``retry_parked()``)."""

    def __init__(self, n: int, token: str, scale: DemoScale, endpoints: list[str], report: DemoReport,
                 spool_root: Path) -> None:
        from lightmetrics.client import AgentClient, BackoffPolicy

        self.n, self.scale, self.report = n, scale, report
        self.agent_id, self.boot_id = f"demo-agent-{n:02d}", f"boot-{n:02d}-0001"
        self.lock = threading.Lock()
        self.alerts: list[Any] = []
        self.client = AgentClient(
            agent_id=self.agent_id,
            token=token,
            endpoints=endpoints,
            spool=spool_root / self.agent_id,
            # demo pace: short waits, and many attempts so a collector killed mid-run is ridden out
            backoff=BackoffPolicy(base_s=0.05, max_s=1.0, max_attempts=60, honor_retry_after=False),
            parked_retry_s=3600.0,
            request_timeout_s=30.0,
            on_alert=self.alerts.append,
            rng=random.Random(n),
        )

    def identity(self, batch: int) -> BatchIdentity:
        per = self.scale.samples_per_batch
        return BatchIdentity.create(self.agent_id, self.boot_id, batch * per, batch * per + per - 1)

    def frame(self, batch: int, base_ns: int, variant: float = 0.0) -> bytes:
        samples = _samples(self.n, batch, self.scale.samples_per_batch, base_ns, variant)
        return encode_frame(self.identity(batch), samples, compress=batch % 2 == 0)

    def send(self, ident: BatchIdentity, body: bytes, start: int) -> dict[str, Any]:
        """Spool ``body`` and drain the spool, starting at collector ``start``; the batch's last answer."""
        self.client.endpoint_index = start % len(self.client.endpoints)
        self.client.enqueue(ident, body)
        drained = self.client.drain(timeout_s=300)
        with self.lock:
            self.report.answers.update(drained.answers)
            self.report.failovers += drained.failovers
        mine = [o for o in drained.outcomes if o.identity == ident]
        if not mine or mine[-1].action == "unavailable":
            raise RuntimeError(f"{ident}: no collector answered ({drained.to_json()})")
        return mine[-1].body

    def run(self, base_ns: int, tick: Any) -> None:
        for batch in range(self.scale.batches_per_agent):
            ident, body = self.identity(batch), self.frame(batch, base_ns)
            first = (self.n + batch) % self.scale.collectors
            answer = self.send(ident, body, first)
            self._record(ident, body, answer)
            if batch % self.scale.resend_every == 0:
                # at-least-once delivery: the same bytes again, to another collector
                self._record(ident, body, self.send(ident, body, first + 1))
            tick()

    def _record(self, ident: BatchIdentity, body: bytes, answer: dict[str, Any]) -> None:
        if answer.get("status") in ("accepted", "duplicate"):
            sha = hashlib.sha256(body).hexdigest()
            if answer.get("frame_sha256") != sha:
                self.report.violations.append(f"{ident}: answer hash {answer.get('frame_sha256')} != sent {sha}")
            with self.lock:
                self.report.acks.append(Ack(ident, sha, answer["status"] == "duplicate"))
        else:
            self.report.violations.append(f"{ident}: unexpected answer {answer}")


def deliberate_conflict(agent: DemoAgent, base_ns: int, store: S3ObjectStore, report: DemoReport) -> None:
    ident = agent.identity(0)
    body = agent.frame(0, base_ns, variant=0.5)  # same identity, different content
    answer = agent.send(ident, body, 0)
    qkey = answer.get("quarantine_key")
    evidence = store.get(qkey) if qkey else None
    # The agent client parks it: kept with a sidecar, outside the normal order, and alerts.
    parked = [p for p in agent.client.parked() if p.identity == ident]
    alerted = [a for a in agent.alerts if a.kind == "parked" and a.identity == ident]
    report.conflict = {
        "identity": str(ident),
        "status": answer.get("status"),
        "quarantine_key": qkey,
        "evidence_present": evidence is not None,
        "resolution": answer.get("resolution"),
        "parked": [p.to_json() for p in parked],
        "parked_bytes_identical": bool(parked) and parked[0].read_bytes() == body,
        "alerts": len(alerted),
        "ok": answer.get("status") == "identity_conflict" and evidence is not None
        and len(parked) == 1 and parked[0].read_bytes() == body and len(alerted) == 1,
    }

