"""The inventory audit's confirmation and watermark step (docs/protocol.md §13 W6) as an actor.

``audit#i`` runs the audit job's real code wherever it touches storage. Its Spark stages are
modelled: the inventory is S3's own listing of the in-memory bucket (no request), its
``creationTimestamp`` now or up to an hour and a half back (an older report re-run: it proves less),
and :mod:`~lightmetrics.harness.sim.audit_inventory` selects from it the rows the classification and
candidate joins would. From there the code is the job's: GC's marks read through the world's table
(``gc_marked_blobs``: ``checkpoint#reap``, then the 32 shards sent at once — one step of the
audit, each Query meeting its own fault, :class:`OneStepExecutor`), every candidate confirmed by the pipeline's own checks
(``audit.confirm.confirm``) reading through the fault-injecting store (an ``S3Access`` carrying it),
the missing blobs looked at again after the marks are read again (``recheck_held``), then the real
:func:`plan_watermarks` and, once the summary is committed, :func:`apply_watermarks` (a crash there
moves nothing more). A failed read fails the job, which commits nothing. A record the reader cannot
parse (the newer writer's) is the confirmation's ``unreadable`` finding when it is a candidate,
unless the job's image was upgraded too (half the audits: :class:`UpgradedReads`); then it reads
it, and its missing entries are findings.

Checks (:class:`AuditWatch`): W3/W6 — a watermark only moves forward (after every step that updated
one); W6 — an audit proves no index for which it confirmed a finding, none at all when it could not
read a candidate, and once its apply answered, each proved index's W is at least what it proved;
and, against the world rather than the job's findings (``InventoryView.unproven``), every source
its inventory showed before what it proved has its entry, in the inventory or now.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.derived.walk import INDEXES
from lightmetrics.derived.walk.state import watermark_pk
from lightmetrics.harness.sim.audit_inventory import InventoryView
from lightmetrics.harness.sim.scheduler import Actor, OneStepExecutor, SimCrash
from lightmetrics.harness.sim.world import World
from lightmetrics.operator_tools import invariants as inv
from lightmetrics.operator_tools.audit_watermarks import apply_watermarks, plan_watermarks
from lightmetrics.protocol.manifests import ACCEPTED_BATCH_SCHEMA

_NS = 1_000_000_000


@dataclass
class AuditWatch:
    world: World
    seen: int = 0
    w: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._read(flag=False)

    def _read(self, *, flag: bool = True) -> None:
        for index in INDEXES:
            item = self.world.system.table._items.get((watermark_pk(index), "current"))
            if item is None or "w_ns" not in item:
                continue
            w, before = int(item["w_ns"]), self.w.get(index)
            if flag and before is not None and w < before:
                self.world.scheduler.flag(f"W3/W6: watermark#{index} moved backward: {before} -> {w} "
                                          f"(set by {item.get('set_by')})")
            self.w[index] = max(w, before or w)

    def step(self) -> None:
        lines = self.world.scheduler.trace[self.seen:]
        self.seen = len(self.world.scheduler.trace)
        if any(" UpdateItem watermark#" in line for line in lines):
            self._read()


Row = dict[str, Any]
#: the confirmation stage's tasks (the job coalesces to the session's cores) and the attempts Spark
#: gives each (``spark.task.maxFailures``: 4 on EMR Serverless, which the job does not change)
SPARK_TASKS, SPARK_TASK_ATTEMPTS = 2, 4


class UpgradedReads:
    """The world's store as a job whose image was upgraded reads it: a record the newer writer wrote
    reads as what that newer reader takes from it (the fields this version knows), every other
    call passes through (its faults and scheduling too)."""

    def __init__(self, store: Any, newer_records: dict[str, str]) -> None:
        self._store, self._newer = store, newer_records

    def get(self, key: str) -> bytes | None:
        raw = self._store.get(key)
        if raw is None or key not in self._newer:
            return raw
        doc = json.loads(raw)
        doc.pop("written_by_newer", None)
        return json.dumps({**doc, "schema": ACCEPTED_BATCH_SCHEMA}).encode()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def confirmed_findings(world: World, rows: list[Row], horizon_before_s: int, *, upgraded: bool = False,
                       actor: Actor | None = None) -> list[Row]:
    """The job's confirmation of ``rows``: the pipeline's checks over the world's faulty store and
    table (``gc_marked_blobs``, ``confirm``, ``recheck_held``); raises if a read fails. ``upgraded``:
    the job's image reads the newer writer's records (:class:`UpgradedReads`)."""
    from lightmetrics_pipeline.audit.confirm import confirm, gc_marked_blobs, recheck_held
    from lightmetrics_pipeline.s3io import S3Access

    codec = world.system.ctx.codec
    store = UpgradedReads(world.store, world.newer_records) if upgraded else world.store
    access = S3Access(bucket=world.system.settings.bucket, prefix=codec.prefix, object_store=store)
    marked = gc_marked_blobs(world.table, codec, pool=OneStepExecutor(world.scheduler))  # sent at once
    findings = _stage(confirm(access, frozenset(marked), horizon_before_s), rows, actor)
    held = [f for f in findings if f["held_blob"]]
    if not held:
        return findings
    again = _stage(recheck_held(access, frozenset(marked.read_again())), held, actor)
    return [f for f in findings if not f["held_blob"]] + again


def _stage(fn: Any, rows: list[Row], actor: Actor | None) -> list[Row]:
    """A Python stage over ``rows`` as Spark runs it: :data:`SPARK_TASKS` tasks, each attempted up to
    :data:`SPARK_TASK_ATTEMPTS` times (a read that failed, or an executor that died, fails the attempt;
    another executor reads the rows again); a task out of attempts fails the job."""
    out: list[Row] = []
    for task in range(SPARK_TASKS):
        part = rows[task::SPARK_TASKS]
        for attempt in range(1, SPARK_TASK_ATTEMPTS + 1):
            try:
                out += [found for row in part for found in fn(row)]
                break
            except (SimCrash, Exception):  # noqa: BLE001 - Spark retries the task, then fails the job
                if attempt == SPARK_TASK_ATTEMPTS:
                    raise
                if actor is not None:
                    actor.crashed = False  # the next attempt is another executor's
    return out


def watermark_inputs(findings: list[Row]) -> tuple[dict[str, int], dict[str, int]]:
    """``missing-derived`` findings per index and unreadable candidates per rule (what the job counts
    in Spark: ``audit.watermarks.missing_by_index`` and the ``unreadable`` category)."""
    from lightmetrics_pipeline.audit.confirm import UNREADABLE

    missing: Counter[str] = Counter()
    for f in findings:
        if f["rule"] == inv.MISSING_DERIVED.name and f["category"] != UNREADABLE:
            missing.update(json.loads(f["doc"])["missing"].split(","))
    unreadable = Counter(f["rule"] for f in findings if f["category"] == UNREADABLE)
    return dict(missing), dict(unreadable)


def audit(world: World, watch: AuditWatch, n: int, *, delay: int = 15, upgraded: bool | None = None,
          back_s: int | None = None) -> Any:
    """Audit run ``n``; ``upgraded`` (its image reads the newer writer's records) and ``back_s`` (its
    report's age) drawn from the seed unless given."""
    rng = world.rng
    drawn_upgraded, drawn_back_s = rng.random() < 0.5, rng.choice((0, 600, 1800, 5400))  # a re-run: 5400
    upgraded = drawn_upgraded if upgraded is None else upgraded
    back_s = drawn_back_s if back_s is None else back_s
    wait = rng.randrange(delay) if delay else 0

    def body(actor: Actor) -> None:
        actor.crashed = False
        # the report is taken first; the job runs on it later (the events path catches up meanwhile)
        now_ns = world.clock.now_ns()
        created_ns = now_ns - back_s * _NS
        horizon_before_s = now_ns // _NS - world.system.settings.retry_horizon_s
        inventory = InventoryView(world)
        rows = inventory.candidates(horizon_before_s)
        for _ in range(wait):
            world.scheduler.pause("Schedule")
        try:
            findings = confirmed_findings(world, rows, horizon_before_s, upgraded=upgraded, actor=actor)
        except (SimCrash, Exception) as exc:  # noqa: BLE001 - the job failed: it commits nothing
            world.scheduler.note(f"audit {n} failed before its commit: {type(exc).__name__}")
            return
        missing, unreadable = watermark_inputs(findings)
        plan = plan_watermarks({"creation_timestamp_ms": created_ns // 1_000_000},
                               world.system.settings.settle_s, missing, unreadable)
        world.scheduler.note(f"audit {n} committed: proved {sorted(plan['proved'])} withheld {sorted(plan['withheld'])}")
        bad = sorted(i for i in plan["proved"] if missing.get(i) or unreadable)
        if bad:
            world.scheduler.flag(f"W6: audit {n} proved {bad} with confirmed findings {missing} / unreadable {unreadable}")
        for unproven in inventory.unproven(world, plan["proved"]):
            world.scheduler.flag(f"audit {n}: {unproven}")
        try:
            moved = apply_watermarks(world.table, plan, now_ns=world.clock_for(0).now_ns(), run_id=f"sim-{n}")
        except (SimCrash, Exception) as exc:  # noqa: BLE001 - a crash after the commit: the next audit moves them
            world.scheduler.note(f"audit {n} apply failed: {type(exc).__name__}")
            return
        world.scheduler.note(f"audit {n} moved {moved}")
        watch._read()
        items = world.system.table._items
        low = [i for i, w in plan["proved"].items() if int(items[(watermark_pk(i), "current")]["w_ns"]) < int(w)]
        if low:
            world.scheduler.flag(f"W6: audit {n}'s apply answered but {low} stayed below what it proved")
    return body


__all__ = ["AuditWatch", "UpgradedReads", "audit", "confirmed_findings", "watermark_inputs"]
