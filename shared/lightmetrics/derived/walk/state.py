"""The walk's records in the control table (docs/control-table.md) and what is read from them.

The lease ``lease#walk``/``lease``; the summary ``checkpoint#walk``/``current`` (full walks;
``checkpoint#walk#agent=<agent-hex>`` for walks scoped to one agent) and one ``part#<partition>``
item per partition in progress (its cursor and counters); the watermarks
``watermark#<index>``/``current``. Every write is conditional on the walk's ``epoch`` and
``owner``; a resume re-stamps the owner of the summary and the partitions in progress in one
transaction, so a run that lost the walk cannot move a cursor.

Example (what ``lmctl walk status`` reads)::

    >>> summary, parts = read_walk(table, checkpoint_pk(None))                 # doctest: +SKIP
    >>> summarize(summary, parts, clock.now_ns()).keys_per_s                   # doctest: +SKIP
    >>> read_watermarks(table)["accepted-by-time"]                             # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from typing import TypedDict

from lightmetrics.derived.walk.checkpoint import (
    CHECKPOINT_SK,
    KEY_CHECKS,
    OUTCOMES,
    PART_PREFIX,
    WalkCheckpoint,
    WalkPartition,
    WalkSummary,
)
from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.control_store import ConditionFailed, ControlStore, plain
from lightmetrics.protocol.own_writes import update_own
from lightmetrics.work import leases

_NS = 1_000_000_000

LEASE_PK, LEASE_SK = "lease#walk", "lease"
#: The derived indexes the walk repairs; each has its own completeness watermark.
INDEXES = ("accepted-by-time", "accepted-by-blob", "raw-blobs-by-time", "quarantine-by-blob")
#: What a walk that is not ``full`` proves complete (W3, W5): it checks each record's time entry
#: (repairing what is missing) and repairs every quarantine manifest in full; a record's blob entry
#: and its blob's entry follow from a present time entry only for entries written under D5/D6
#: (protocol §17 E7), so only a full walk vouches for those two indexes.
PRESENCE_WALK_INDEXES = ("accepted-by-time", "quarantine-by-blob")


class WalkRun(TypedDict, total=False):
    """The walk's run as Step Functions carries it from task to task (``walk`` in every task's input
    and output): its scope and checkpoint, its lease (``owner``, ``epoch``, ``lease_seconds``), its
    page parameters, the rounds of this execution (against ``max_rounds``) and its executions so far."""

    scope: str
    agent: str | None
    checkpoint_pk: str
    epoch: int
    owner: str
    page_size: int
    parallelism: int
    max_rounds: int
    full: bool
    lease_seconds: int
    state_machine_arn: str
    execution_arn: str
    round: int
    executions: int


def checkpoint_pk(agent_hex: str | None) -> str:
    return "checkpoint#walk" if agent_hex is None else f"checkpoint#walk#agent={agent_hex}"


def watermark_pk(index: str) -> str:
    return f"watermark#{index}"


# --- the walk's lease (lightmetrics.work.leases; docs/protocol.md §13, L1-L3) ----------------------------------
def read_lease(table: ControlStore) -> leases.LeaseItem | None:
    """The walk lease's item, or None if no walk ever took it."""
    return leases.read(table, LEASE_PK)


def describe_lease(lease: leases.LeaseItem, now_ns: int) -> str:
    return leases.describe(lease, now_ns, "walk")


def read_walk(table: ControlStore, pk: str, *, leftovers: list[WalkPartition] | None = None
              ) -> tuple[WalkCheckpoint | None, list[WalkPartition]]:
    """The walk checkpoint of one scope: its summary (``current``) and its partition items
    (``part#<partition>``, the cursors of partitions in progress), with one Query. Partition
    items of an older, unfinished epoch are left out (appended to ``leftovers`` if given)."""
    summary, parts = None, []
    for item in table.query(pk):
        item = plain(item)
        if item["sk"] == CHECKPOINT_SK:
            summary = WalkCheckpoint.of(item)
        elif item["sk"].startswith(PART_PREFIX):
            parts.append(WalkPartition.of(item))
    epoch = None if summary is None else summary.epoch
    if leftovers is not None:
        leftovers.extend(p for p in parts if p.epoch != epoch)
    return summary, [p for p in parts if p.epoch == epoch]


def watermark_blocker(cp: WalkCheckpoint, parts: list[WalkPartition]) -> str | None:
    """Why a finished walk may not set the watermark (None: it may)."""
    if cp.scope != "all":
        return "agent-scoped walks never move the watermark"
    if cp.enum is None or not cp.enum.done or parts:
        return "the walk did not cover every partition"
    outcomes = cp.counters.outcomes
    bad = {o: outcomes.get(o, 0) for o in ("RETRY_LATER", "BLOCKED", "SKIPPED") if outcomes.get(o, 0)}
    if bad:
        return "items ended " + ", ".join(f"{o}: {n}" for o, n in bad.items())
    return None


def proven_before(check_started_ns: int, settle_s: int) -> int:
    """The W a complete check proves: every record accepted before ``check_started_ns −
    settle_s`` had landed in S3 when the check began listing (the settle window covers the longest
    accept, clock skew and the index pipeline) — a walk's start (W3), an inventory's scan (W6)."""
    return int(check_started_ns) - int(settle_s) * _NS


def set_watermark(table: ControlStore, index: str, w_ns: int, *, epoch: int, now_ns: int,
                  set_by: str | None = None) -> bool:
    """Raise ``watermark#<index>`` to ``w_ns`` (monotonic: never lowered); True if it moved.
    ``set_by`` names the check that proved it (``walk epoch N``, ``audit run R``)."""
    try:
        update_own(table, watermark_pk(index), "current", "SET #w = :w, #at = :now, #ep = :ep, #by = :by",
                   names={"#w": "w_ns", "#at": "set_at_ns", "#ep": "epoch", "#by": "set_by"},
                   values={":w": w_ns, ":now": now_ns, ":ep": epoch, ":by": set_by or f"walk epoch {epoch}"},
                   condition="attribute_not_exists(#w) OR #w < :w")
        return True
    except ConditionFailed:
        return False


def read_watermarks(table: ControlStore) -> dict[str, int | None]:
    """``{index: W in unix ns, or None if no clean full walk has finished yet}``."""
    out: dict[str, int | None] = {}
    for index in INDEXES:
        item = table.get(watermark_pk(index), "current")
        out[index] = int(item["w_ns"]) if item and "w_ns" in item else None
    return out


def walk_failure(table: ControlStore, now_ns: int) -> str:
    """Why the last full walk is stuck (docs/protocol.md §12 R9), "" if it is not: its summary says
    ``failed`` (the Abort task recorded the error), or ``running`` while its lease lapsed more than
    ``leases.STOPPED_MARGIN_S`` ago (StopExecution, a timeout: no Abort ran). One GetItem, and the
    lease's only while it says running: agent-scoped walks are an operator's, who follows them
    (``lmctl walk start --wait``)."""
    item = table.get(checkpoint_pk(None), CHECKPOINT_SK)
    cp = None if item is None else WalkCheckpoint.of(plain(item))
    step = "continue it: lmctl walk start --resume --wait"
    if cp is not None and cp.status is JobStatus.RUNNING:
        return "".join(leases.stopped_cause(read_lease(table), now_ns, f"walk epoch {cp.epoch}", step))
    if cp is None or cp.status is not JobStatus.FAILED:
        return ""
    return f"walk epoch {cp.epoch}: its last execution failed: {cp.error or '(no error recorded)'} ({step})"


def summarize(cp: WalkCheckpoint, parts: list[WalkPartition], now_ns: int) -> WalkSummary:
    """Progress of a walk: the summary plus the partitions in progress; keys/s and an ETA estimate.
    ``keys_present`` and ``keys_reaped`` are the NOOP_RESOLVED keys no repair ran for (W4, W5)."""
    total = cp.counters
    outcomes = {o: total.outcomes.get(o, 0) + sum(p.outcomes.get(o, 0) for p in parts) for o in OUTCOMES}
    keys = total.keys + sum(p.keys for p in parts)
    pages = total.pages + sum(p.pages for p in parts)
    settled = {c: total.settled[c] + sum(p.settled[c] for p in parts) for c in KEY_CHECKS}
    by_kind = Counter({"accepted": cp.keys_accepted, "quarantine": cp.keys_quarantine})
    for p in parts:
        by_kind[p.kind] += p.keys
    found = cp.partitions_found
    complete = cp.partitions_done + sum(1 for p in parts if p.done)
    enum_done = cp.enum is not None and cp.enum.done
    running = cp.status is JobStatus.RUNNING
    since = next(t for t in (cp.rate_since_ns, cp.started_at_ns, now_ns) if t is not None)
    until = 0 if running else (cp.finished_at_ns or cp.failed_at_ns or 0)
    elapsed = ((until or now_ns) - since) / _NS
    rate = (keys - cp.rate_keys_base) / elapsed if elapsed > 0 else None
    eta = None
    if running and enum_done and rate and complete:
        estimated_total = keys * found / complete
        eta = max(0.0, (estimated_total - keys) / rate)
    return WalkSummary(
        checkpoint_pk=cp.pk, scope=cp.scope, epoch=cp.epoch, status=cp.status, started_at_ns=cp.started_at_ns,
        updated_at_ns=cp.updated_at_ns, executions=cp.executions, resumes=cp.resumes, execution=cp.execution,
        partitions_found=found, partitions_done=complete, enumeration_complete=enum_done,
        in_progress=sorted(p.partition for p in parts if not p.done),
        keys=keys, keys_accepted=by_kind["accepted"], keys_quarantine=by_kind["quarantine"], pages=pages,
        outcomes=outcomes, settled=settled,
        keys_per_s=None if rate is None else round(rate, 1), eta_s=None if eta is None else round(eta, 1),
        watermark_ns=cp.watermark_ns, watermark_withheld=cp.watermark_withheld, error=cp.error)


__all__ = ["CHECKPOINT_SK", "INDEXES", "KEY_CHECKS", "LEASE_PK", "LEASE_SK", "OUTCOMES", "PART_PREFIX",
           "PRESENCE_WALK_INDEXES", "WalkCheckpoint", "WalkPartition", "WalkRun", "WalkSummary", "checkpoint_pk",
           "describe_lease", "proven_before", "read_lease", "read_walk", "read_watermarks", "set_watermark", "summarize",
           "walk_failure", "watermark_blocker", "watermark_pk"]
