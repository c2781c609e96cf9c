"""Issue 23, property 7 (its fast half): a ``pending`` finding of ``lmctl verify`` shows its age, in
the report, the table and ``--json`` — so an entry lost behind the system's back that is still newer
than its index's watermark W is seen growing old, not silently ``pending`` forever."""

from __future__ import annotations

import dataclasses
import json

from click.testing import CliRunner
from conftest import FAST, T0_NS, ident
from pipeline_support import make_system

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.clock import FrozenClock

_NS = 10**9


def test_pending_findings_show_their_age_in_the_report_the_table_and_json(runtime, clock, monkeypatch):  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock)
    s3 = runtime.boto3_client("s3")
    actx = accept_context(system.settings, client=s3, clock=clock, policy=FAST)
    ctx = system.work_context(policy=FAST)
    results = []
    for n in range(2):
        r = accept_batch(actx, ident(n), make_frame_for(n))
        index_accepted(ctx, r.manifest_key)
        index_raw_blob(ctx, r.blob_key)
        results.append(r)
    lost = ctx.codec.accepted_by_blob(results[0].frame_sha256, ident(0))
    s3.delete_object(Bucket=system.bucket, Key=lost)  # behind the system's back; no watermark yet

    later = FrozenClock(T0_NS + 3 * 3600 * _NS)  # three hours after the acceptance
    report = verify(dataclasses.replace(ctx, clock=later))
    assert report.ok and report.pending["accepted-by-blob"] == 1
    (found,) = report.pending_findings
    assert (found.index, found.keys, found.age_s) == ("accepted-by-blob", (results[0].manifest_key,), 3 * 3600)
    assert report.to_json()["pending_findings"] == [found.to_json()]
    assert found.to_json()["accepted_at"] == "2025-11-24 16:00:00Z" and found.to_json()["age_s"] == 3 * 3600

    for name, value in system.environment().items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()
    out = runner.invoke(cli(), ["verify", "--json"])
    assert out.exit_code == 0, out.output
    (doc,) = json.loads(out.stdout)["pending_findings"]
    assert doc["index"] == "accepted-by-blob" and doc["keys"] == [results[0].manifest_key]
    assert doc["age_s"] > 3 * 3600  # real time now, long after T0
    table = runner.invoke(cli(), ["verify"])
    assert table.exit_code == 0, table.output
    assert "pending accepted-by-blob" in table.output and results[0].manifest_key in table.output
    assert "old" in table.output.split("pending accepted-by-blob", 1)[1].splitlines()[0]  # "... d old"


def make_frame_for(n: int) -> bytes:
    from conftest import make_frame

    return make_frame(ident(n))


def cli():  # type: ignore[no-untyped-def]
    from lightmetrics.cli.main import cli as main

    return main
