"""The one resource spec that the CDK app and the local provisioner both read.

Plain frozen dataclasses and stdlib only: no boto3, no CDK. The CDK stack maps each spec onto
constructs; :mod:`lightmetrics.local.provision` maps it onto API calls against moto. Physical
names come from configuration at run time (``LM_BUCKET``, ``LM_TABLE``, ``LM_AUTH_SECRET_ID``);
the ``default_name`` of each spec is only the local default.

Example::

    >>> from lightmetrics.deployment.resources import SPEC
    >>> SPEC.table.key_schema()
    [{'AttributeName': 'pk', 'KeyType': 'HASH'}, {'AttributeName': 'sk', 'KeyType': 'RANGE'}]
    >>> SPEC.function("ingest").handler_string
    'functions.ingest.app.handler'
"""

from __future__ import annotations

import json

from lightmetrics.deployment.resource_types import (
    BucketSpec,
    FunctionSpec,
    QueueSpec,
    ResourceSpec,
    SecretSpec,
    ShardQueueSpec,
    StateMachineSpec,
    TableSpec,
)
from lightmetrics.protocol.keys import KeyKind as K  # short: the spec names many kinds
from lightmetrics.protocol.keys import layout_root, layout_roots
from lightmetrics.protocol.segment_keys import V2_ROOTS, SegmentIndex

__all__ = ["BUCKET", "FUNCTIONS", "PIPELINE_SCHEDULES", "QUEUES",
           "SECRET", "SHARD_QUEUES", "SPEC", "STATE_MACHINES", "TABLE"]


BUCKET = BucketSpec()
TABLE = TableSpec()
SECRET = SecretSpec()
#: The event path (docs/protocol.md §10): one queue per authoritative prefix, each with its DLQ.
QUEUES: tuple[QueueSpec, ...] = (
    QueueSpec("index-accepted", layout_root(K.ACCEPTED), "index-accepted-dlq", max_receive_count=5,
              visibility_timeout_s=120),
    QueueSpec("index-raw-blobs", layout_root(K.RAW_BLOB), "index-raw-blobs-dlq", max_receive_count=5,
              visibility_timeout_s=120),
    QueueSpec("index-quarantine", layout_root(K.QUARANTINE), "index-quarantine-dlq", max_receive_count=5,
              visibility_timeout_s=120),
)

#: The reconciler's one schedule fans out here, a message per shard (docs/protocol.md §12 R8); its
#: visibility timeout outlasts the reconcile function's 900 s timeout.
SHARD_QUEUES: tuple[ShardQueueSpec, ...] = (ShardQueueSpec("reconcile-shards", "reconcile-shards-dlq"),)

FUNCTIONS: tuple[FunctionSpec, ...] = (
    FunctionSpec(
        "ingest",
        "functions.ingest.app",
        "handler",
        trigger="http",
        # Blob, acceptance record, conflict evidence: conditional creates only.
        s3_write=layout_roots(K.RAW_BLOB, K.ACCEPTED, K.QUARANTINE),
        # GET of an existing record, HEAD of a pre-existing blob, HEAD of a resolution record.
        s3_read=layout_roots(K.ACCEPTED, K.RAW_BLOB, K.CONFLICT_RESOLUTION),
        # So that a missing key is a 404, not a 403.
        s3_list=layout_roots(K.ACCEPTED, K.RAW_BLOB, K.CONFLICT_RESOLUTION),
        reads_secret=True,
        table="read",  # the identity denylist: one Query per LM_DENYLIST_TTL_S into a cache, never per request
        reserved_concurrency_param="IngestReservedConcurrency",
        timeout_s=60,
        memory_mb=1024,
        description="Accepts metric batches: authenticate, validate, conditional creates in S3",
    ),
    FunctionSpec(
        "admin",
        "functions.admin.app",
        "handler",
        trigger="http",
        url_auth="iam",  # operators sign with SigV4; nothing else can reach it
        # Evidence (GET) and resolution records (GET; conditional create, write-once).
        s3_read=layout_roots(K.QUARANTINE, K.CONFLICT_RESOLUTION),
        s3_write=layout_roots(K.CONFLICT_RESOLUTION),
        s3_list=layout_roots(K.QUARANTINE, K.CONFLICT_RESOLUTION),
        table="write",  # conflict registry, denylist, blockers, status reads
        table_writes=("PutItem", "UpdateItem", "DeleteItem"),
        # status: queue depths, the shards queue's and its DLQ's too (whose URL it is told)
        sqs_read_attributes=(*(n for q in QUEUES for n in (q.name, q.dlq_name)),
                             *(n for sq in SHARD_QUEUES for n in (sq.name, sq.dlq_name))),
        timeout_s=30,
        description="Admin API (IAM auth): identity conflicts, resolutions, denylist, blockers, status",
    ),
    FunctionSpec(
        "index-accepted",
        "functions.index_accepted.app",
        trigger="queue:index-accepted",
        s3_read=layout_roots(K.ACCEPTED, K.RETENTION_TOMBSTONE),  # the record; the hour's tombstone (HEAD)
        s3_write=layout_roots(K.ACCEPTED_BY_TIME, K.ACCEPTED_BY_BLOB),
        s3_list=layout_roots(K.ACCEPTED, K.RETENTION_TOMBSTONE),
        table="write",  # retry budgets (counted, cleared after a success) and blockers
        table_writes=("UpdateItem", "DeleteItem"),
        timeout_s=60,
        description="Indexes acceptance records: accepted-by-time and accepted-by-blob",
    ),
    FunctionSpec(
        "index-raw-blobs",
        "functions.index_raw_blobs.app",
        trigger="queue:index-raw-blobs",
        s3_read=layout_roots(K.RAW_BLOB, K.RETENTION_TOMBSTONE),  # HEAD for LastModified and identity metadata
        s3_write=layout_roots(K.RAW_BLOBS_BY_TIME),
        s3_list=layout_roots(K.RAW_BLOB, K.RETENTION_TOMBSTONE),
        table="write",
        table_writes=("UpdateItem", "DeleteItem"),
        timeout_s=60,
        description="Indexes raw blobs (orphans too): raw-blobs-by-time",
    ),
    FunctionSpec(
        "index-quarantine",
        "functions.index_quarantine.app",
        trigger="queue:index-quarantine",
        s3_read=layout_roots(K.QUARANTINE),
        s3_write=layout_roots(K.QUARANTINE_BY_BLOB),
        s3_list=layout_roots(K.QUARANTINE),
        table="write",
        table_writes=("PutItem", "UpdateItem", "DeleteItem"),
        timeout_s=60,
        description="Indexes identity-conflict evidence: quarantine-by-blob",
    ),
    FunctionSpec(
        "reconcile",
        "functions.reconcile.app",
        trigger="schedule:rate(5 minutes)",
        # reads and lists raw-blobs-by-time and accepted-by-blob: an entry is checked against the
        # blob listing, and the repair HEADs an entry before writing it (protocol §12)
        s3_read=layout_roots(K.ACCEPTED_BY_TIME, K.ACCEPTED, K.RAW_BLOB, K.RETENTION_TOMBSTONE, K.ACCEPTED_BY_BLOB,
                             K.RAW_BLOBS_BY_TIME),
        s3_write=layout_roots(K.ACCEPTED_BY_TIME, K.ACCEPTED_BY_BLOB, K.RAW_BLOBS_BY_TIME),
        s3_list=layout_roots(K.ACCEPTED_BY_TIME, K.ACCEPTED, K.RAW_BLOB, K.RETENTION_TOMBSTONE, K.RAW_BLOBS_BY_TIME),
        table="write",  # checkpoint, budgets, blockers
        table_writes=("PutItem", "UpdateItem", "DeleteItem"),
        sqs_read_attributes=tuple(n for q in QUEUES for n in (q.name, q.dlq_name)),
        cloudwatch_read=True,  # ApproximateAgeOfOldestMessage decides when an hour may close
        timeout_s=900,
        memory_mb=1024,
        shard_queue="reconcile-shards",  # one schedule fans out to every shard (protocol §12 R8)
        description="Steady-state reconciler: repairs derived state from a DynamoDB checkpoint",
    ),
    FunctionSpec(
        "sweep-dlq",
        "functions.sweep_dlq.app",
        trigger="schedule:rate(5 minutes)",
        table="write",
        table_writes=("UpdateItem",),
        sqs_consume=tuple(q.dlq_name for q in QUEUES),
        timeout_s=300,
        description="Turns every dead-lettered index message into a blocker",
    ),
    # The bootstrap walk's Step Functions tasks (docs/walks.md): thin shells over lightmetrics.derived.walk.
    FunctionSpec(
        "walk-begin",
        "functions.walk_begin.app",
        trigger="task",
        table="write",  # the walk lease and checkpoint (taken, created; a resume takes them over)
        table_writes=("PutItem", "UpdateItem"),
        timeout_s=60,
        description="Bootstrap walk: take the lease; start a new epoch, resume one, or continue an execution",
    ),
    FunctionSpec(
        "walk-plan",
        "functions.walk_plan.app",
        trigger="task",
        # Partitions (agent, then boot) by ListObjectsV2 with a Delimiter. Stray keys outside the
        # layout become blockers without being read.
        s3_list=layout_roots(K.ACCEPTED, K.QUARANTINE),
        table="write",  # lease, checkpoint, blockers
        table_writes=("PutItem", "UpdateItem", "DeleteItem"),
        timeout_s=120,
        description="Bootstrap walk: finished partitions out, the next ones in; routes the loop",
    ),
    FunctionSpec(
        "walk-page",
        "functions.walk_page.app",
        trigger="task",
        # repair_accepted / index_quarantine: the records, blobs (HEAD) and tombstones (HEAD); a
        # record's accepted-by-time entry (HEAD, or a LIST of its hour and boot: §13 W5) ...
        # A key missing from v1 is looked up in the v2 segments and seals of its hours (§13 W5).
        s3_read=(*layout_roots(K.ACCEPTED, K.QUARANTINE, K.RAW_BLOB, K.RETENTION_TOMBSTONE, K.ACCEPTED_BY_TIME),
                 V2_ROOTS[SegmentIndex.ACCEPTED_BY_TIME]),
        # ... and every derived entry they hang off (conditional creates only).
        s3_write=layout_roots(K.ACCEPTED_BY_TIME, K.ACCEPTED_BY_BLOB, K.RAW_BLOBS_BY_TIME, K.QUARANTINE_BY_BLOB),
        # One page of a partition; and a missing blob, tombstone or entry must be a 404, not a 403.
        s3_list=(*layout_roots(K.ACCEPTED, K.QUARANTINE, K.RAW_BLOB, K.RETENTION_TOMBSTONE, K.ACCEPTED_BY_TIME),
                 V2_ROOTS[SegmentIndex.ACCEPTED_BY_TIME]),
        table="write",  # lease, checkpoint, retry budgets, blockers
        table_writes=("PutItem", "UpdateItem", "DeleteItem"),
        timeout_s=300,
        memory_mb=1024,
        description="Bootstrap walk: one page of one partition, every key repaired, then the checkpoint",
    ),
    FunctionSpec(
        "walk-continue",
        "functions.walk_continue.app",
        trigger="task",
        table="write",  # records the next execution in the checkpoint
        table_writes=("UpdateItem",),
        sfn_start=("bootstrap-walk",),  # the same state machine, under the same lease and epoch
        timeout_s=60,
        description="Bootstrap walk: continue in a new execution (stays under the history limit)",
    ),
    FunctionSpec(
        "walk-end",
        "functions.walk_end.app",
        trigger="task",
        table="write",  # checkpoint, lease release, completeness watermarks
        table_writes=("UpdateItem",),
        timeout_s=60,
        description="Bootstrap walk: finish (watermark) or record a failure; release the lease",
    ),
    # The reap's Step Functions tasks (docs/reaps.md): thin shells over lightmetrics.reaps.
    FunctionSpec(
        "reap-begin",
        "functions.reap_begin.app",
        trigger="task",
        # Retention without --hour lists accepted-by-time's hours and HEADs their reaped markers; GC
        # with audit_run "latest" lists the audits' commit markers (audit/v1/committed/, rule G-B3).
        s3_read=layout_roots(K.RETENTION_TOMBSTONE),
        s3_list=layout_roots(K.ACCEPTED_BY_TIME, K.ROLLUP_MANIFEST, K.RETENTION_TOMBSTONE, K.AUDIT),
        table="write",  # the reap lease and checkpoint (taken, created; a resume takes them over)
        table_writes=("PutItem", "UpdateItem"),
        timeout_s=60,
        description="Reap: validate the input (dry_run explicit), take the lease, write the checkpoint",
    ),
    FunctionSpec(
        "reap-gc",
        "functions.reap_gc.app",
        trigger="task",
        # The proof reads only authoritative keys: the blob (HEAD), its acceptance record (GET), the
        # conflict evidence and resolution (HEAD), the hour's tombstone (HEAD); candidates come from
        # raw-blobs/ or raw-blobs-by-time/ listings or the Spark audit's orphan-blob-candidates
        # (audit/v1/), retention's from the hour's accepted-by-time.
        s3_read=layout_roots(K.RAW_BLOB, K.ACCEPTED, K.QUARANTINE, K.CONFLICT_RESOLUTION, K.RETENTION_TOMBSTONE,
                             K.ACCEPTED_BY_TIME, K.AUDIT),
        s3_list=layout_roots(K.RAW_BLOB, K.RAW_BLOBS_BY_TIME, K.ACCEPTED, K.QUARANTINE, K.CONFLICT_RESOLUTION,
                             K.RETENTION_TOMBSTONE, K.ACCEPTED_BY_TIME, K.AUDIT),
        # The one blob deleter (delete markers, then exactly the captured versions) and the blob's
        # raw-blobs-by-time hint, which goes with it.
        s3_delete=layout_roots(K.RAW_BLOB, K.RAW_BLOBS_BY_TIME),
        # A purge deletes the captured version and its markers, a restore the markers (the hints go
        # by a marker): versions only under raw-blobs/v1/.
        s3_delete_versions=layout_roots(K.RAW_BLOB),
        gc_role=True,
        table="write",  # lease, checkpoint (intents and marks)
        table_writes=("PutItem", "UpdateItem", "DeleteItem"),
        timeout_s=600,
        memory_mb=1024,
        description="Reap (GC role, the only raw-blob deleter): prove and mark a page of blobs, or settle marks",
    ),
    FunctionSpec(
        "reap-retention",
        "functions.reap_retention.app",
        trigger="task",
        # The hour's acceptance records are the authority for which accepted-by-blob entry to delete
        # (read only; listing them keeps a vanished record a 404, not a 403: protocol §16 R-I5).
        s3_read=layout_roots(K.ACCEPTED, K.ACCEPTED_BY_TIME, K.RETENTION_TOMBSTONE),
        # Tombstones and reaped markers: conditional creates, never deleted.
        s3_write=layout_roots(K.RETENTION_TOMBSTONE),
        s3_list=layout_roots(K.ACCEPTED, K.ACCEPTED_BY_TIME, K.ACCEPTED_BY_BLOB, K.RETENTION_TOMBSTONE,
                             K.ROLLUP_PART, K.ROLLUP_INDEX, K.ROLLUP_MANIFEST),
        # Derived prefixes only: the retention role can delete no blob and no acceptance record.
        # Rollup retention (scope rollup): chunks, chunk indexes, then generation manifests.
        s3_delete=layout_roots(K.ACCEPTED_BY_TIME, K.ACCEPTED_BY_BLOB, K.ROLLUP_PART, K.ROLLUP_INDEX,
                               K.ROLLUP_MANIFEST),
        table="write",  # lease, checkpoint, retention records; reads the completeness watermark
        table_writes=("PutItem", "UpdateItem", "DeleteItem"),
        timeout_s=600,
        description="Reap (retention role): tombstone an expired hour, delete its derived entries, mark it reaped",
    ),
    FunctionSpec(
        "reap-continue",
        "functions.reap_continue.app",
        trigger="task",
        table="write",  # renews the lease, records the next execution in the checkpoint
        table_writes=("UpdateItem",),
        sfn_start=("reap",),  # the same state machine, under the same lease and epoch
        timeout_s=60,
        description="Reap: continue in a new execution (stays under the history limit)",
    ),
    FunctionSpec(
        "reap-end",
        "functions.reap_end.app",
        trigger="task",
        table="write",  # checkpoint, lease release; a retention run's outcome (created)
        table_writes=("PutItem", "UpdateItem"),
        timeout_s=60,
        description="Reap: the final report (examined, marked, purged, restored, kept and why); release the lease",
    ),
)

#: Step Functions state machines; their ASL is in infra/statemachines/ (docs/walks.md).
STATE_MACHINES: tuple[StateMachineSpec, ...] = (
    StateMachineSpec(
        "bootstrap-walk",
        "BootstrapWalk",
        "bootstrap_walk.asl.json",
        substitutions=(
            ("WalkBeginFunctionArn", "walk-begin"),
            ("WalkPlanFunctionArn", "walk-plan"),
            ("WalkPageFunctionArn", "walk-page"),
            ("WalkContinueFunctionArn", "walk-continue"),
            ("WalkEndFunctionArn", "walk-end"),
        ),
        # Weekly, Sunday 03:00 UTC, only on a bucket without S3 Inventory (schedules.scheduled): a walk
        # of every partition, not `full` — one read per record (protocol §13 W5) — that moves the
        # accepted-by-time and quarantine-by-blob watermarks (W3). With an inventory the weekly audit
        # (PIPELINE_SCHEDULES) moves all four (W6) and the walk runs only at bootstrap or on an audit's
        # repair folder (docs/walks.md).
        schedule="cron(0 3 ? * SUN *)",
        schedule_input=json.dumps(
            {"agent": None, "resume": False, "page_size": 10000, "parallelism": 40}, sort_keys=True
        ),
        description=("Bootstrap walk: complete, resumable cold reconciliation of "
                     f"{layout_root(K.ACCEPTED)} and {layout_root(K.QUARANTINE)}"),
    ),
    StateMachineSpec(
        "reap",
        "Reap",
        "reap.asl.json",
        substitutions=(
            ("ReapBeginFunctionArn", "reap-begin"),
            ("ReapGcFunctionArn", "reap-gc"),
            ("ReapRetentionFunctionArn", "reap-retention"),
            ("ReapContinueFunctionArn", "reap-continue"),
            ("ReapEndFunctionArn", "reap-end"),
        ),
        # Daily GC at 04:00 UTC. It deletes (dry_run false, stated explicitly): every deletion is
        # proven from authoritative reads and goes through the delete-marker handshake. Its
        # candidates are the newest committed weekly audit's orphan-blob-candidates (rule G-B3), so
        # its cost follows the orphans, not the blobs: each audit run is proven once, and a day with
        # no new audit costs one listing. At most max_pages pages a run (a run ends; the next day's goes
        # on from the audit's cursor): 2,000 pages of 500 = 1 M orphans a day, 10x the orphans of a
        # fleet at 1,000 batches/s with 0.1% of them orphaned (docs/performance.md); a normal day's
        # run takes what that day's orphans take.
        schedule="cron(0 4 * * ? *)",
        schedule_input=json.dumps({"mode": "gc", "dry_run": False, "source": "audit", "audit_run": "latest",
                                   "max_pages": 2000}, sort_keys=True),
        # Without an S3 Inventory no audit runs: the daily GC takes its candidates from the
        # raw-blobs-by-time hours past the retry horizon (rule G-B1), from its durable cursor.
        no_inventory_schedule_input=json.dumps({"mode": "gc", "dry_run": False, "source": "by-time",
                                                "max_pages": 2000}, sort_keys=True),
        # Retention deletes data by policy: its schedule is deployed DISABLED until an operator
        # sets LM_RETENTION_S deliberately and enables the rule (docs/reaps.md).
        disabled_schedule="cron(0 5 * * ? *)",
        disabled_schedule_input=json.dumps({"mode": "retention", "dry_run": False, "hour": None, "page_size": 1000},
                                           sort_keys=True),
        description="Reap: GC of orphan raw blobs (mode gc) and retention of expired hours (mode retention)",
    ),
)

SPEC = ResourceSpec(
    bucket=BUCKET, table=TABLE, secret=SECRET, queues=QUEUES, functions=FUNCTIONS, state_machines=STATE_MACHINES,
    shard_queues=SHARD_QUEUES,
)

#: The pipeline state machine's EventBridge schedules (infra/components/pipeline.py; the jobs run on
#: EMR Serverless, docs/pipeline.md §7): job -> (schedule expression, the execution's input). The
#: audit runs Tuesday 06:30 UTC, after the weekly inventory (generated Sunday, delivered within 48 h)
#: has landed; it moves the completeness watermarks it proves (docs/protocol.md §13 W6).
PIPELINE_SCHEDULES: dict[str, tuple[str, str]] = {
    "rollup": ("cron(20 * * * ? *)", json.dumps({"job": "rollup"})),
    "audit": ("cron(30 6 ? * TUE *)", json.dumps({"job": "audit"})),
}
