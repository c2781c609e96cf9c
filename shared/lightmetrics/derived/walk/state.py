"""The walk's records in the control table (docs/control-table.md) and what is read from them.

The lease ``lease#walk``/``lease``; the summary ``checkpoint#walk``/``current`` (full walks;
``checkpoint#walk#agent=<agent-hex>`` for walks scoped to one agent) and one ``part#<partition>``
item per partition in progress (its cursor and counters); the watermarks
``watermark#<index>``/``current``. Every write is conditional on the walk's ``epoch`` and
``owner``; a resume re-stamps the owner of the summary and the partitions in progress in one
transaction, so a run that lost the walk cannot move a cursor.

Example (what ``lmctl walk status`` reads)::

    >>> summary, parts = read_walk(table, checkpoint_pk(None))                 # doctest: +SKIP
    >>> summarize(summary, parts, clock.now_ns())["keys_per_s"]                # doctest: +SKIP
    >>> read_watermarks(table)["accepted-by-time"]                             # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from lightmetrics.jobs.kernel import JobStatus
from lightmetrics.protocol.control_store import ConditionFailed, ControlStore, plain
from lightmetrics.protocol.own_writes import update_own
from lightmetrics.work import leases

_NS = 1_000_000_000

LEASE_PK, LEASE_SK = "lease#walk", "lease"
CHECKPOINT_SK = "current"
PART_PREFIX = "part#"
#: The derived indexes the walk repairs; each has its own completeness watermark.
INDEXES = ("accepted-by-time", "accepted-by-blob", "raw-blobs-by-time", "quarantine-by-blob")
#: What a walk that is not ``full`` proves complete (W3, W5): it checks each record's time entry
#: (repairing what is missing) and repairs every quarantine manifest in full; a record's blob entry
#: and its blob's entry follow from a present time entry only for entries written under D5/D6
#: (protocol §17 E7), so only a full walk vouches for those two indexes.
PRESENCE_WALK_INDEXES = ("accepted-by-time", "quarantine-by-blob")
#: Outcome counters of a walk (``SKIPPED``: an operator skipped the key's blocker).
OUTCOMES = ("DONE", "NOOP_RESOLVED", "RETRY_LATER", "BLOCKED", "SKIPPED")
#: How a key counted NOOP_RESOLVED was settled without a unit of work (rules W4, W5): ``present``
#: — its ``accepted-by-time`` entry exists; ``reaped`` — its hour is tombstoned, nothing probed.
#: Partition items and the summary keep them as ``keys_present`` and ``keys_reaped``.
KEY_CHECKS = ("present", "reaped")


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


@dataclass(frozen=True)
class WalkPartition:
    """A partition in progress (``part#<partition>`` under the walk's checkpoint), as read: its cursor
    (``after``), whether its last page was listed (``done``), the epoch that owns it, its counters
    (``keys``, ``pages``, ``outcomes``, ``keys_<check>`` as ``settled``) and ``failed_through`` (rule O1a)."""

    partition: str
    kind: str = "accepted"
    after: str = ""
    done: bool = False
    epoch: int | None = None
    keys: int = 0
    pages: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    settled: dict[str, int] = field(default_factory=dict)
    failed_through: str = ""

    @property
    def sk(self) -> str:
        return PART_PREFIX + self.partition

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> WalkPartition:
        epoch = item.get("epoch")
        return cls(partition=str(item.get("partition") or str(item["sk"])[len(PART_PREFIX):]),
                   kind=str(item.get("kind") or "accepted"), after=str(item.get("after") or ""),
                   done=bool(item.get("done")), epoch=None if epoch is None else int(epoch),
                   keys=int(item.get("keys") or 0), pages=int(item.get("pages") or 0),
                   outcomes={str(k): int(v) for k, v in (item.get("outcomes") or {}).items()},
                   settled={c: int(item.get(f"keys_{c}") or 0) for c in KEY_CHECKS},
                   failed_through=str(item.get("failed_through") or ""))


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
              ) -> tuple[dict[str, Any] | None, list[WalkPartition]]:
    """The walk checkpoint of one scope: its summary (``current``) and its partition items
    (``part#<partition>``, the cursors of partitions in progress), with one Query. Partition
    items of an older, unfinished epoch are left out (appended to ``leftovers`` if given)."""
    summary, parts = None, []
    for item in table.query(pk):
        item = plain(item)
        if item["sk"] == CHECKPOINT_SK:
            summary = item
        elif item["sk"].startswith(PART_PREFIX):
            parts.append(WalkPartition.of(item))
    epoch = (summary or {}).get("epoch")
    if leftovers is not None:
        leftovers.extend(p for p in parts if p.epoch != epoch)
    return summary, [p for p in parts if p.epoch == epoch]


def watermark_blocker(cp: dict[str, Any], parts: list[WalkPartition]) -> str | None:
    """Why a finished walk may not set the watermark (None: it may)."""
    if cp.get("scope") != "all":
        return "agent-scoped walks never move the watermark"
    if not (cp.get("enum") or {}).get("done") or parts:
        return "the walk did not cover every partition"
    outcomes = cp.get("outcomes") or {}
    bad = {o: int(outcomes.get(o, 0)) for o in ("RETRY_LATER", "BLOCKED", "SKIPPED") if int(outcomes.get(o, 0))}
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
    cp = table.get(checkpoint_pk(None), CHECKPOINT_SK)
    step = "continue it: lmctl walk start --resume --wait"
    if cp is not None and cp.get("status") == JobStatus.RUNNING:
        return "".join(leases.stopped_cause(read_lease(table), now_ns, f"walk epoch {cp.get('epoch')}", step))
    if cp is None or cp.get("status") != JobStatus.FAILED:
        return ""
    return f"walk epoch {cp.get('epoch')}: its last execution failed: {cp.get('error') or '(no error recorded)'} ({step})"


def summarize(cp: dict[str, Any], parts: list[WalkPartition], now_ns: int) -> dict[str, Any]:
    """Progress of a walk: the summary plus the partitions in progress; keys/s and an ETA estimate.
    ``keys_present`` and ``keys_reaped`` are the NOOP_RESOLVED keys no repair ran for (W4, W5)."""
    cp = plain(cp)
    outcomes = {o: int((cp.get("outcomes") or {}).get(o, 0)) + sum(p.outcomes.get(o, 0) for p in parts)
                for o in OUTCOMES}
    keys = int(cp.get("keys", 0)) + sum(p.keys for p in parts)
    pages = int(cp.get("pages", 0)) + sum(p.pages for p in parts)
    settled = {f"keys_{c}": int(cp.get(f"keys_{c}", 0)) + sum(p.settled[c] for p in parts) for c in KEY_CHECKS}
    by_kind = Counter({"accepted": int(cp.get("keys_accepted", 0)), "quarantine": int(cp.get("keys_quarantine", 0))})
    for p in parts:
        by_kind[p.kind] += p.keys
    found = int(cp.get("partitions_found", 0))
    complete = int(cp.get("partitions_done", 0)) + sum(1 for p in parts if p.done)
    enum_done = bool((cp.get("enum") or {}).get("done"))
    since = int(cp.get("rate_since_ns", cp.get("started_at_ns", now_ns)))
    until = int(cp.get("finished_at_ns") or cp.get("failed_at_ns") or 0) if cp.get("status") != JobStatus.RUNNING else 0
    elapsed = ((until or now_ns) - since) / _NS
    rate = (keys - int(cp.get("rate_keys_base", 0))) / elapsed if elapsed > 0 else None
    eta = None
    if cp.get("status") == JobStatus.RUNNING and enum_done and rate and complete:
        estimated_total = keys * found / complete
        eta = max(0.0, (estimated_total - keys) / rate)
    return {
        "scope": cp.get("scope"), "epoch": cp.get("epoch"), "status": cp.get("status"),
        "started_at_ns": cp.get("started_at_ns"), "updated_at_ns": cp.get("updated_at_ns"),
        "executions": cp.get("executions"), "resumes": cp.get("resumes", 0), "execution": cp.get("execution"),
        "partitions_found": found, "partitions_done": complete, "enumeration_complete": enum_done,
        "in_progress": sorted(p.partition for p in parts if not p.done),
        "keys": keys, "keys_accepted": by_kind["accepted"], "keys_quarantine": by_kind["quarantine"],
        "pages": pages, "repairs": outcomes["DONE"], "outcomes": outcomes,
        # NOOP_RESOLVED keys settled without a repair: entry present (W5), hour reaped (W4)
        **settled,
        "keys_per_s": None if rate is None else round(rate, 1), "eta_s": None if eta is None else round(eta, 1),
        "watermark_ns": cp.get("watermark_ns"), "watermark_withheld": cp.get("watermark_withheld"),
        "error": cp.get("error"),
    }


__all__ = ["CHECKPOINT_SK", "INDEXES", "KEY_CHECKS", "LEASE_PK", "LEASE_SK", "OUTCOMES", "PART_PREFIX",
           "PRESENCE_WALK_INDEXES", "WalkPartition", "WalkRun", "checkpoint_pk", "describe_lease", "proven_before",
           "read_lease", "read_walk", "read_watermarks", "set_watermark", "summarize", "walk_failure",
           "watermark_blocker", "watermark_pk"]
