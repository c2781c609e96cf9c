"""Every S3 request a background function makes is one its deployed role allows.

The local runtime enforces each role's policy (tests/test_iam_enforced.py), but moto does not evaluate
the ``s3:prefix`` condition of a ListBucket grant, so a listing outside a role's prefixes would pass
locally and fail only on AWS (403). CDK builds each role from its ``FunctionSpec``
(``s3_read`` -> GetObject/HeadObject, ``s3_write`` -> PutObject, ``s3_list`` -> ListBucket by
prefix, ``s3_delete`` -> DeleteObject): these tests run the walk's tasks, the indexers and the
reconciler against moto, record every S3 request with the function that made it, and check it
against that function's spec. The reaps' tasks are checked in tests/test_invariant_reaps.py.
"""

from __future__ import annotations

from typing import Any

from conftest import FAST, ident, make_frame
from test_walk import make_system

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.aws.queue_probes import SqsCountProbe
from lightmetrics.composition.services import accept_context
from lightmetrics.deployment.resources import SPEC
from lightmetrics.derived.indexing import index_accepted, index_quarantine, index_raw_blob
from lightmetrics.derived.reconcile import Reconciler
from lightmetrics.derived.walk import Walker

_ALLOWED = {"GetObject": "s3_read", "HeadObject": "s3_read", "PutObject": "s3_write",
            "ListObjectsV2": "s3_list", "ListObjectVersions": "s3_list", "DeleteObject": "s3_delete"}


class Recorder:
    """``(function, operation, key or prefix)`` of every S3 request of one client."""

    def __init__(self, client: Any) -> None:
        self.function = "-"
        self.seen: list[tuple[str, str, str]] = []
        client.meta.events.register("before-parameter-build.s3", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        where = params.get("Key", params.get("Prefix"))
        self.seen.append((self.function, model.name, where if where is not None else "<whole bucket>"))

    def refused(self, prefix: str) -> list[tuple[str, str, str]]:
        out = []
        for name, op, where in self.seen:
            grants = getattr(SPEC.function(name), _ALLOWED.get(op, "none"), ())
            if not any(where.startswith(prefix + p) for p in grants):
                out.append((name, op, where))
        return out


def test_every_s3_request_of_the_walk_indexers_and_reconciler_is_allowed_by_their_specs(runtime, clock):  # type: ignore[no-untyped-def]
    system = make_system(runtime, clock)
    try:
        actx = accept_context(system.settings, client=runtime.boto3_client("s3"), clock=clock, policy=FAST)
        results = [accept_batch(actx, i, make_frame(i)) for i in (ident(n, agent=f"agent-{n % 2}") for n in range(4))]
        conflict = accept_batch(actx, ident(0, agent="agent-0"), make_frame(ident(0, agent="agent-0"), variant=0.5))
        assert conflict.status.value == "identity_conflict"
        ctx = system.work_context(policy=FAST)
        rec = Recorder(ctx.store.client)

        rec.function = "index-accepted"
        for r in results[:3]:
            index_accepted(ctx, r.manifest_key)
        rec.function = "index-raw-blobs"
        for r in results[:3]:
            index_raw_blob(ctx, r.blob_key)
        rec.function = "index-quarantine"
        index_quarantine(ctx, conflict.quarantine_key)

        rec.function = "reconcile"
        probe = SqsCountProbe(runtime.boto3_client("sqs"), [], [])
        Reconciler(ctx, system.settings, probe).run()

        walker = Walker(ctx, system.settings)
        rec.function = "walk-begin"
        out = walker.begin({"input": {"page_size": 2}, "execution_arn": "manual", "state_machine_arn": "-"})
        for _ in range(50):
            rec.function = "walk-plan"
            out = walker.plan({"walk": out["walk"]})
            if out["next"] in ("finish", "continue"):
                break
            rec.function = "walk-page"
            for item in out.get("work") or []:
                walker.page({"walk": out["walk"], "item": item, "retry_count": 0})
        assert out["next"] == "finish"
        rec.function = "walk-end"
        summary = walker.end({"walk": out["walk"], "outcome": "finished"})
        assert summary["status"] == "finished" and summary["outcomes"]["DONE"] >= 1  # the fourth batch, repaired

        functions = {name for name, _, _ in rec.seen}
        assert functions >= {"index-accepted", "index-raw-blobs", "index-quarantine", "reconcile", "walk-plan",
                             "walk-page"}, functions
        refused = rec.refused(ctx.codec.prefix)
        assert not refused, f"{len(refused)} requests a deployed role refuses, e.g. {refused[:5]}"
    finally:
        system.stop()
