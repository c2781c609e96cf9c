"""The demo's scale and its report: what ``lmctl demo`` ran, what it saw, and whether that is OK.

Each phase of :mod:`lightmetrics.harness.demo` fills its part of :class:`DemoReport`; ``ok`` is
the conjunction of every phase's check, and ``print`` is the summary table.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.cli.output import grid
from lightmetrics.protocol.identity import BatchIdentity


@dataclass(frozen=True)
class DemoScale:
    agents: int
    batches_per_agent: int
    samples_per_batch: int = 20
    resend_every: int = 7  # every Nth batch is also sent to a second collector
    collectors: int = 3
    kill_after_blob_puts: int = 40  # the victim stalls after this many blob PUTs, then is killed

    @property
    def batches(self) -> int:
        return self.agents * self.batches_per_agent


SCALES = {"quick": DemoScale(agents=10, batches_per_agent=25), "small": DemoScale(agents=10, batches_per_agent=100),
          "full": DemoScale(agents=10, batches_per_agent=300)}


@dataclass
class Ack:
    identity: BatchIdentity
    sha256: str
    duplicate: bool


@dataclass
class DemoReport:
    scale: DemoScale
    answers: Counter[str] = field(default_factory=Counter)
    failovers: int = 0
    acks: list[Ack] = field(default_factory=list)
    conflict: dict[str, Any] = field(default_factory=dict)
    killed: dict[str, Any] = field(default_factory=dict)
    s3_requests: int = 0
    seconds: float = 0.0
    verified: int = 0
    violations: list[str] = field(default_factory=list)
    index_s3_requests: int = 0
    indexed_objects: int = 0
    derived: dict[str, Any] = field(default_factory=dict)
    dropped_event: dict[str, Any] = field(default_factory=dict)
    poisoned: dict[str, Any] = field(default_factory=dict)
    blockers: list[dict[str, Any]] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    walk: dict[str, Any] = field(default_factory=dict)
    verify: dict[str, Any] = field(default_factory=dict)
    reaps: dict[str, Any] = field(default_factory=dict)  # issue 6: lightmetrics.harness.demo_reaps

    @property
    def accepted(self) -> int:
        return self.answers["accepted"]

    @property
    def ok(self) -> bool:
        return (
            not self.violations
            and self.verified == len({a.identity for a in self.acks})
            and self.conflict.get("ok", False)
            and self.killed.get("killed", False)
            and self.derived.get("complete", False)
            and self.dropped_event.get("repaired", False)
            and self.poisoned.get("listed", False)
            and self.walk.get("ok", False)
            and self.verify.get("ok", False)
            and self.reaps.get("ok", False)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "collectors": self.scale.collectors,
            "agents": self.scale.agents,
            "batches": self.scale.batches,
            "answers": dict(self.answers),
            "accepted": self.accepted,
            "duplicates": self.answers["duplicate"],
            "identity_conflicts": self.answers["identity_conflict"],
            "unavailable_503": self.answers["unavailable"],
            "failovers": self.failovers,
            "acknowledged_identities": len({a.identity for a in self.acks}),
            "verified": self.verified,
            "violations": self.violations,
            "conflict": self.conflict,
            "killed_collector": self.killed,
            "s3_requests": self.s3_requests,
            "s3_requests_per_accepted_batch": round(self.s3_requests / self.accepted, 3) if self.accepted else None,
            "indexed_objects": self.indexed_objects,
            "index_s3_requests": self.index_s3_requests,
            "s3_requests_per_indexed_object": round(self.index_s3_requests / self.indexed_objects, 3)
            if self.indexed_objects else None,
            "derived": self.derived,
            "dropped_event": self.dropped_event,
            "poisoned": self.poisoned,
            "open_blockers": self.blockers,
            "walk": self.walk,
            "verify": self.verify,
            "reaps": self.reaps,
            "seconds": round(self.seconds, 1),
            "phase_seconds": {k: round(v, 1) for k, v in self.phases.items()},
        }

    def print(self, console: Any) -> None:
        from lightmetrics.harness.demo_conflicts import summary_row
        from lightmetrics.harness.demo_reaps import summary_rows as reap_rows

        d = self.to_json()
        rows = [
            ("collectors (processes)", d["collectors"]),
            ("agents", d["agents"]),
            ("batches", d["batches"]),
            ("accepted", d["accepted"]),
            ("duplicates", d["duplicates"]),
            ("identity conflicts", d["identity_conflicts"]),
            ("503 unavailable", d["unavailable_503"]),
            ("failovers (collector unreachable)", d["failovers"]),
            ("collector killed mid-accept", "yes" if self.killed.get("killed") else "NO"),
            ("S3 requests (ingest)", d["s3_requests"]),
            ("S3 requests per accepted batch", d["s3_requests_per_accepted_batch"]),
            ("acknowledged identities verified", f"{d['verified']}/{d['acknowledged_identities']}"),
            ("objects indexed (event pump)", d["indexed_objects"]),
            ("S3 requests per indexed object", d["s3_requests_per_indexed_object"]),
            ("derived entries complete", "yes" if self.derived.get("complete") else "NO"),
            ("dropped event repaired by reconciler", "yes" if self.dropped_event.get("repaired") else "NO"),
            ("poisoned record in blockers list", "yes" if self.poisoned.get("listed") else "NO"),
            ("derived entries deleted / restored by the walk",
             f"{self.walk.get('deleted', 0)} / {self.walk.get('restored', 0)}"),
            ("walk (Step Functions): executions, keys, repairs",
             f"{len(self.walk.get('executions', []))}, {self.walk.get('keys', 0)}, {self.walk.get('repairs', 0)}"),
            ("walk keys/s; S3 requests per walked key",
             f"{self.walk.get('keys_per_s')}; {self.walk.get('s3_requests_per_key')}"),
            # "acknowledged" above is an agent's 200; here it is a finding an operator skipped
            ("lmctl verify (strict)", ("clean" if self.verify.get("ok") else
                                       f"{len(self.verify.get('violations', []))} violations")
             + f", {len(self.verify.get('acknowledged', []))} skipped by the operator (the poisoned record)"),
            summary_row(self),
            *reap_rows(self),
            ("violations", len(self.violations)),
            ("seconds", d["seconds"]),
        ]
        console.print(grid("lightmetrics demo", ["what", "#"], rows))
        for v in self.violations[:20]:
            console.print(f"[red]violation:[/] {v}")
        console.print("[bold green]OK[/]" if self.ok else "[bold red]FAILED[/]")
