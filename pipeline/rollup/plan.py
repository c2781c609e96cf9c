"""The rollup's plan and report: what a run decided for each hour, and what it did.

:class:`RollupPlan` (one :class:`HourPlan` per hour: build, recompute, up to date, ...) is what
:meth:`lightmetrics_pipeline.rollup.job.RollupJob.plan` returns and ``execute`` carries out;
:class:`RollupReport` (one :class:`HourResult` per hour) is what ``lmctl pipeline rollup`` prints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.protocol.keys import UtcHour
from lightmetrics_pipeline.s3io import Tally

#: The format new generations are written in (docs/pipeline.md §6); 2 only for tests and the benchmark.
ROLLUP_FORMAT = 3


class GenerationTaken(Exception):
    """Another owner committed this generation of the hour first (the CLI exits 5)."""


class NondeterministicRollup(Exception):
    """A recomputed generation produced other object (v3) or chunk (v1/v2) bytes than the committed one."""


def decide(committed: dict[str, Any] | None, inputs: int, digest: str, recompute: bool,
           max_generation: int) -> tuple[str, int | None, int | None]:
    """``(status, generation, supersedes)`` of an eligible hour from its highest committed manifest
    and its current inputs: ``empty``, ``build`` (generation 1, or the next), ``up-to-date``,
    ``recompute``, or ``generation-limit`` when the next generation would pass ``max_generation``
    (the catalog's projected range: docs/pipeline.md §1): nothing is built, the committed
    generation stays the hour's current one.

    >>> decide({"generation": 999, "supersedes": 998, "inputs": {"sha256": "a"}}, 3, "b", False, 999)
    ('generation-limit', 999, 998)
    """
    if committed is None:
        return ("empty", None, None) if inputs == 0 else ("build", 1, None)
    generation, supersedes = int(committed["generation"]), committed["supersedes"]
    if committed["inputs"]["sha256"] == digest:
        return ("recompute" if recompute else "up-to-date"), generation, supersedes
    if generation >= max_generation:
        return "generation-limit", generation, supersedes  # the committed one stays the current one
    return "build", generation + 1, generation


@dataclass
class HourPlan:
    hour: UtcHour
    #: build | recompute | up-to-date | empty | open | tombstoned | raw-reaped | generation-limit | refused
    status: str
    generation: int | None = None
    supersedes: int | None = None
    input_count: int = 0
    input_sha256: str = ""
    committed: dict[str, Any] | None = None
    format: int = ROLLUP_FORMAT  # a recompute keeps the committed generation's format
    #: ``refused``: the v2 object its inputs could not be read from, and why (V-D4, V-D7)
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        doc = {"hour": str(self.hour), "status": self.status, "generation": self.generation,
               "supersedes": self.supersedes, "inputs": self.input_count, "format": self.format}
        return {**doc, "reason": self.reason} if self.reason else doc


@dataclass
class RollupPlan:
    owner: str
    hours: list[HourPlan]
    entries: Any = None  # DataFrame (hour_s, manifest_id), persisted
    requests: Tally = field(default_factory=Tally)  # what planning asked S3

    def work(self, fmt: int | None = None) -> dict[int, int]:
        """``{hour_s: generation}`` of the hours to write (of format ``fmt`` only, if given)."""
        return {h.hour.start_unix_s: int(h.generation) for h in self.hours
                if h.status in ("build", "recompute") and h.generation is not None and fmt in (None, h.format)}


@dataclass
class HourResult:
    hour: str
    status: str
    generation: int | None = None
    supersedes: int | None = None
    inputs: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)  # the first SKIPPED_SAMPLE, by manifest-id
    skipped_count: int = 0
    chunks: int = 0  # format 2: chunks written
    objects: int = 0  # format 3: Parquet objects written
    rows: int = 0  # format 3: rows in them (series x window starts, all windows)
    format: int = ROLLUP_FORMAT
    series: int = 0
    samples: int = 0
    writes: Counter[str] = field(default_factory=Counter)
    manifest_key: str = ""
    manifest_outcome: str = ""
    reason: str = ""  # ``refused``: the v2 object and why

    def to_json(self) -> dict[str, Any]:
        doc = {"hour": self.hour, "status": self.status, "generation": self.generation, "supersedes": self.supersedes,
               "inputs": self.inputs, "skipped": self.skipped, "skipped_count": self.skipped_count,
               "format": self.format, "objects": self.objects, "rows": self.rows,
               "chunks": self.chunks, "series": self.series,
               "samples": self.samples, "writes": dict(self.writes), "manifest_key": self.manifest_key,
               "manifest_outcome": self.manifest_outcome}
        return {**doc, "reason": self.reason} if self.reason else doc


@dataclass
class RollupReport:
    owner: str
    hours: list[HourResult] = field(default_factory=list)
    requests: Tally = field(default_factory=Tally)
    seconds: float = 0.0  # the whole run: Spark's start, the plan, the writes
    tasks: dict[str, int] = field(default_factory=dict)  # Spark tasks that got input, by stage
    #: what the preflight found (lightmetrics_pipeline.rollup.preflight): open hours, empty ones
    notes: list[str] = field(default_factory=list)
    spark_started: bool = True

    @property
    def samples(self) -> int:
        return sum(h.samples for h in self.hours)

    @property
    def skipped(self) -> int:
        return sum(h.skipped_count for h in self.hours)

    @property
    def refused(self) -> list[HourResult]:
        """Hours whose v2 inputs a reader refused: not rolled up, the run fails (never a silent skip)."""
        return [h for h in self.hours if h.status == "refused"]

    @property
    def created(self) -> int:
        return sum(h.writes.get("created", 0) for h in self.hours)

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "hours": [h.to_json() for h in self.hours], "samples": self.samples,
                "skipped_inputs": self.skipped, "objects_created": self.created,
                "s3_requests": self.requests.to_json(), "tasks": dict(sorted(self.tasks.items())),
                "seconds": round(self.seconds, 2), "notes": list(self.notes), "spark_started": self.spark_started}


__all__ = ["ROLLUP_FORMAT", "GenerationTaken", "decide", "HourPlan", "HourResult", "NondeterministicRollup", "RollupPlan",
           "RollupReport"]
