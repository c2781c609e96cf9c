"""A short chaos soak (``lmctl soak``): every component under faults at once, then the books balance.

The long soak is ``lmctl soak --minutes N``; this one runs the same code for ~20 s of load so
that ``make test`` proves the whole loop — kills, lost and duplicated events, S3 faults, walks and
GC reaps during load, the settle phase, strict verify and the ledger — still closes.
"""

from __future__ import annotations

from lightmetrics.harness.soak import run_soak
from lightmetrics.harness.soak_plan import SoakPlan, collector_faults


def test_collector_faults_cover_every_kind_and_differ_per_collector() -> None:
    plan = SoakPlan(minutes=1)
    rules = collector_faults(plan, 0)
    assert {r["fault"] for r in rules} == {"409", "503", "500", "timeout", "timeout_after_landing"}
    assert all(r["times"] == -1 and r["every"] >= 2 for r in rules)
    assert [r["after"] for r in collector_faults(plan, 2)] != [r["after"] for r in rules]


def test_soak_plan_refuses_nonsense() -> None:
    for bad in ({"minutes": 0}, {"minutes": 1, "collectors": 1}, {"minutes": 1, "agents": 0}):
        try:
            SoakPlan(**bad)  # type: ignore[arg-type]
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_short_soak_keeps_every_invariant() -> None:
    plan = SoakPlan(minutes=0.3, agents=2, batch_pause_s=0.1, kill_every_s=6.0, walk_every_s=9.0, gc_every_s=10.0,
                    conflict_every=40, gc_grace_s=3, settle_timeout_s=180.0)
    report = run_soak(plan, show_progress=False)
    c = report.counters
    assert report.ok, (report.violations[:10], report.verify, report.errors[:5])
    assert report.verify["ok"] and not report.violations
    # a chaos job that died of a bug in its own code is not a fault it injected
    bugs = [e for e in report.errors if any(f": {k}: " in e for k in ("AttributeError", "TypeError", "NameError"))]
    assert bugs == []
    # the faults really happened ...
    assert c["collectors killed (SIGKILL)"] >= 1 and c["collectors restarted"] >= 1
    assert c["S3 events dropped"] >= 1 and c["SQS deliveries duplicated"] >= 1
    assert c["conflicts parked"] >= 1
    assert c["walks finished"] >= 2  # one during the load, the final one
    assert c["gc reaps finished"] >= 1
    # ... and the books balance: everything produced was acknowledged once, with its own bytes
    assert c["produced"] > 100
    assert c["acknowledged identities"] == c["produced"] == c["ledger verified (record + blob)"]
    assert c["still spooled or parked"] == 0
