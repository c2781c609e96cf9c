"""The demo's conflict phase: the deliberate conflict is listed, resolved, and the agent drops its batch.

Runs after the index queues drained (so the quarantine indexer has registered the conflict), on the
same core as ``lmctl conflicts list`` / ``resolve`` (:class:`lightmetrics.acceptance.conflicts.ConflictRegistry`)
and with the demo agent's own client (:class:`lightmetrics.client.AgentClient`):

1. ``list --status unresolved`` shows the conflict (both hashes, collectors, first seen);
2. the agent's parked batch is visible; retried before any decision, it stays parked (409,
   ``resolution: unresolved``);
3. the operator resolves it ``accept_existing`` (write-once; a second resolve is refused);
4. the agent retries its parked batch, reads ``resolution: accept_existing`` in the 409 and drops it.

Results go to ``report.conflict["operator"]``; anything unexpected is a violation.

Example:
    >>> run_conflict_phase(report, system, agents[0].client)        # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Any

from lightmetrics.acceptance.conflict_records import ACCEPT_EXISTING, ConflictAlreadyResolved
from lightmetrics.acceptance.conflicts import ConflictRegistry

OPERATOR = "demo-operator"


def run_conflict_phase(report: Any, system: Any, client: Any) -> dict[str, Any]:
    """Steps 1-4 of the module docstring; returns (and stores) the phase's summary."""
    started = time.monotonic()
    qkey = report.conflict.get("quarantine_key")
    ctx = system.work_context(session=system.operator_session())  # the operator's steps, as the operators' role
    registry = ConflictRegistry(ctx.store, ctx.codec, ctx.blockers.table, clock=ctx.clock, policy=ctx.policy)
    out: dict[str, Any] = {"quarantine_key": qkey}

    # 1. what `lmctl conflicts list --status unresolved` shows
    listed = [e for e in registry.list(status="unresolved", limit=1000).items if e.quarantine_key == qkey]
    out["listed"] = len(listed) == 1
    if not listed:
        report.violations.append(f"conflict {qkey} is not in `lmctl conflicts list --status unresolved`")
        report.conflict["operator"] = out
        return out
    entry = listed[0]
    out["entry"] = entry.to_json()
    ident = entry.identity

    # 2. the agent's parked batch, before a decision
    parked_before = [p for p in client.parked() if p.identity == ident]
    out["parked_before"] = len(parked_before)
    early = client.retry_parked()
    out["retry_before_resolution"] = [o.action for o in early.outcomes if o.identity == ident]
    still = [p for p in client.parked() if p.identity == ident]
    out["resolution_seen_before"] = still[0].resolution if still else None

    # 3. the operator's decision (write-once)
    record = registry.resolve(entry.conflict_id, ACCEPT_EXISTING, who=OPERATOR,
                              reason="demo: the agent resent batch 0 with different samples; keep the accepted one")
    out["resolution"] = {"resolution": record.resolution, "resolved_by": record.resolved_by,
                         "resolved_at_unix_ns": record.resolved_at_unix_ns}
    try:
        registry.resolve(entry.conflict_id, "deny_identity", who=OPERATOR, reason="a second decision")
        out["second_resolve_refused"] = False
    except ConflictAlreadyResolved:
        out["second_resolve_refused"] = True

    # 4. the agent learns it from the 409 and drops the batch
    late = client.retry_parked()
    out["retry_after_resolution"] = [o.action for o in late.outcomes if o.identity == ident]
    out["parked_after"] = len([p for p in client.parked() if p.identity == ident])
    out["unresolved_after"] = len(registry.list(status="unresolved", limit=1000).items)
    out["seconds"] = round(time.monotonic() - started, 2)
    out["ok"] = (out["listed"] and out["parked_before"] == 1 and out["retry_before_resolution"] == ["kept_parked"]
                 and out["resolution_seen_before"] == "unresolved" and out["second_resolve_refused"]
                 and out["retry_after_resolution"] == ["dropped"] and out["parked_after"] == 0)
    if not out["ok"]:
        report.violations.append(f"conflict phase: {out}")
    report.conflict["operator"] = out
    return out


def summary_row(report: Any) -> tuple[str, str]:
    """The demo table's row for this phase."""
    op = report.conflict.get("operator") or {}
    if not op:
        return ("conflict listed / resolved / parked batch dropped", "not run")
    return ("conflict listed / resolved / parked batch dropped",
            " / ".join("yes" if v else "NO" for v in (
                op.get("listed"), op.get("resolution", {}).get("resolution") == ACCEPT_EXISTING,
                op.get("parked_before") == 1 and op.get("parked_after") == 0)))


__all__ = ["run_conflict_phase", "summary_row"]
