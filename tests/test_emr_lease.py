"""The EMR job's entry point when another run holds the rollup's lease: exit 0 and one line saying
who holds it and until when (an overlapping hourly run is not a failure: no failed job run, so
neither pipeline alarm fires — both count FAILED runs only, tests/test_infra_pipeline.py)."""

from __future__ import annotations

import re

import pytest
from pipeline_support import H0, accept_indexed, access_for, make_system, varied_samples

from lightmetrics.protocol.clock import SystemClock, utc_text
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics_pipeline.jobs import main
from lightmetrics_pipeline.rollup.committed import read_committed
from lightmetrics_pipeline.rollup.lease import Lease

NEXT = H0.next()  # the reconciler's checkpoint: H0 is closed


@pytest.fixture
def system(runtime, clock):  # type: ignore[no-untyped-def]
    return make_system(runtime, clock)


def test_a_held_lease_ends_the_job_successfully_with_one_line(system, runtime, clock, spark, monkeypatch,
                                                              capsys):  # type: ignore[no-untyped-def]
    accept_indexed(system, runtime, clock, BatchIdentity.create("agent-l", "boot-1", 0, 99), varied_samples(1, n=5))
    table = system.work_context().table
    table.put({"pk": "checkpoint#reconcile", "sk": "current", "hour_start_s": NEXT.start_unix_s, "hour": str(NEXT),
               "version": 1, "last_run_ns": 0})  # H0 is closed: there is work to do
    for name, value in system.environment().items():
        monkeypatch.setenv(name, value)
    holder = Lease(table, "rollup", "run-of-20-past", SystemClock(), 900).acquire()  # the job judges by the real clock

    assert main(["rollup", "--lookback-hours", "24"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    (until,) = re.findall(r"^rollup: not run: the rollup lease is held by owner run-of-20-past \(epoch 1\) "
                          r"until (\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ); exit 0$", lines[0])
    item = holder.current()
    assert item is not None and until == utc_text(item.expires_at_ns)
    assert read_committed(access_for(system, runtime), H0) is None  # the holder's work, not this run's
    assert holder.current().owner == "run-of-20-past"  # and this run did not release someone else's lease

