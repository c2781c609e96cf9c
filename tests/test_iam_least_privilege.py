"""Each role's exact grants on the control table and its S3 deletes, as its code calls them (issue 28).

A usage log over the demo (``LM_IAM_USAGE_LOG``) showed grants no request used; these were read
against every call the role's functions can make, not only what one demo made:

* the control-table writes: ``PutItem`` (a conditional create: a lease taken, a checkpoint started,
  a conflict registered, a walk partition or GC marks item recorded, a range item, a retention
  outcome), ``UpdateItem`` (a lease renewed or released, a checkpoint moved, a blocker or retry
  budget counted, a watermark raised), ``DeleteItem`` (a retry budget cleared after a success, a
  walk partition or marks item or range item done, a denylist lift). A transaction needs the
  action of each of its items (IAM has no ``TransactWriteItems`` of its own); no code sends
  ``BatchWriteItem``. The map below names, per function, the code that makes each write;
* ``s3:DeleteObjectVersion``: only GC deletes a version (the captured blob version at a purge, its
  delete markers at a purge or restore), only under ``raw-blobs/v1/``; retention and GC's hints
  delete without a version id (a delete marker);
* GC's ``s3:ListBucketVersions``: kept — :meth:`lightmetrics.reaps.gc.Collector.find_markers`, on a
  crash recovery of recorded intents, on a settle of a mark whose marker id was never recorded, and on
  every restore (all markers above the captured version go).
"""

from __future__ import annotations

import pytest

from lightmetrics.deployment.resource_types import FunctionSpec
from lightmetrics.deployment.resources import SPEC
from lightmetrics.operator_tools.policies import PolicyArns, function_statements, pipeline_job_statements

ARNS = PolicyArns(bucket="arn:aws:s3:::b", namespace="", table="arn:t", secret="arn:s",
                  queues={n: f"arn:q:{n}" for q in (*SPEC.queues, *SPEC.shard_queues) for n in (q.name, q.dlq_name)},
                  state_machines={sm.name: f"arn:sm:{sm.name}" for sm in SPEC.state_machines})
READ = {"GetItem", "Query"}
PUT, UPDATE, DELETE = "PutItem", "UpdateItem", "DeleteItem"

#: function -> the control-table writes its code makes, and where
TABLE_WRITES: dict[str, set[str]] = {
    "ingest": set(),  # reads the denylist only
    # conflicts.resolve (Put), denylist add/lift (Put, Update, Delete), blocker actions (Update; resume
    # clears the budget: Delete)
    "admin": {PUT, UPDATE, DELETE},
    # work units (lightmetrics.work.units): budgets counted (Update) and cleared (Delete), blockers (Update)
    "index-accepted": {UPDATE, DELETE},
    "index-raw-blobs": {UPDATE, DELETE},
    "index-quarantine": {PUT, UPDATE, DELETE},  # + the conflict registered (conflict_records.register: Put)
    "reconcile": {PUT, UPDATE, DELETE},  # + its checkpoint (reconcile_state: put_own)
    "sweep-dlq": {UPDATE},  # BlockerStore.block only
    "walk-begin": {PUT, UPDATE},  # lease take and fresh checkpoint (Put); a resume's takeover (Update)
    "walk-plan": {PUT, UPDATE, DELETE},  # partitions in (Put) and out (Delete), summary, lease renewal
    "walk-page": {PUT, UPDATE, DELETE},  # cursors, budgets, blockers; index_quarantine registers (Put)
    "walk-continue": {UPDATE},  # the checkpoint names the next execution
    "walk-end": {UPDATE},  # checkpoint, lease release, watermarks (update_own)
    "reap-begin": {PUT, UPDATE},  # lease take, checkpoint (Put; a stopped run's outcome); resume (Update)
    "reap-gc": {PUT, UPDATE, DELETE},  # marks items (Put, Delete when settled), open_once blockers (Put)
    "reap-retention": {PUT, UPDATE, DELETE},  # range items (Put, Delete), retention records (Update)
    "reap-continue": {UPDATE},  # ReapJob.commit: the summary and the lease renewal
    "reap-end": {PUT, UPDATE},  # ReapJob.commit with the lease release and the retention outcome (Put)
}


def _actions(name: str, prefix: str) -> set[str]:
    return {a.partition(":")[2] for s in function_statements(SPEC.function(name), ARNS) for a in s["Action"]
            if a.startswith(prefix)}


def test_each_function_role_gets_exactly_the_table_writes_its_code_makes() -> None:
    assert set(TABLE_WRITES) == {fn.name for fn in SPEC.functions}
    for name, writes in TABLE_WRITES.items():
        assert _actions(name, "dynamodb:") == READ | writes, name


def test_only_gc_deletes_object_versions_and_only_raw_blobs() -> None:
    for fn in SPEC.functions:
        grants = [(a, r) for s in function_statements(fn, ARNS) for a in s["Action"] for r in s["Resource"]
                  if a == "s3:DeleteObjectVersion"]
        assert grants == ([("s3:DeleteObjectVersion", "arn:aws:s3:::b/raw-blobs/v1/*")] if fn.gc_role else []), fn.name
    # retention deletes derived entries and rollups by marker only
    assert _actions("reap-retention", "s3:Delete") == {"DeleteObject"}
    assert "ListBucketVersions" in _actions("reap-gc", "s3:")  # find_markers: recovery, unrecorded marker, restore


def test_the_pipeline_job_keeps_its_query_of_gc_marks() -> None:
    """``dynamodb:Query``: every audit reads GC's recorded marks (pipeline/jobs.py ``audit_job`` ->
    ``gc_marked_blobs`` -> ``read_marks_items``, one Query of each marks partition), so it stays, and
    its ``LeadingKeys`` name every partition a marks item may be under: each shard and the previous
    version's ``checkpoint#reap`` (docs/protocol.md §17)."""
    from lightmetrics.reaps.gc_marks import MARKS_SHARDS, marks_pk, page_prefix, range_page_prefix

    (read,) = [s for s in pipeline_job_statements(ARNS) if s.get("Sid") == "ReadCheckpointsAndGcMarks"]
    assert read["Action"] == ["dynamodb:GetItem", "dynamodb:Query"]
    keys = set(read["Condition"]["ForAllValues:StringEquals"]["dynamodb:LeadingKeys"])
    written = {marks_pk(page_prefix(1, p)) for p in range(2 * MARKS_SHARDS)} | {
        marks_pk(range_page_prefix(1, r, 1, p)) for r in range(40) for p in range(3)}
    assert len(written) == MARKS_SHARDS and written | {"checkpoint#reap", "checkpoint#reconcile"} == keys


def test_the_spec_names_a_write_functions_writes_and_version_deletes_only_among_its_deletes() -> None:
    for bad in ({"table": "write"}, {"table": "read", "table_writes": ("PutItem",)},
                {"table": "write", "table_writes": ("BatchWriteItem",)}, {"s3_delete_versions": ("rollup/v1/",)}):
        with pytest.raises(ValueError, match="table_writes"):
            FunctionSpec("x", "m", **bad)  # type: ignore[arg-type]
    ok = FunctionSpec("x", "m", table="write", table_writes=("UpdateItem",), s3_delete=("rollup/v1/",),
                      s3_delete_versions=("rollup/v1/",))
    assert ok.table_writes == ("UpdateItem",)
