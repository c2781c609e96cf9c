"""``lmctl bench keepup --rate R``: can every background job keep up with R accepted batches/s?

A closed-form bottleneck model, one per job (deterministic, no clock, no I/O). A job must follow
some units of work per second at R (records indexed, entries checked, keys walked, batches
reaped, inventory rows audited); what it can do is the **least** of its limits, each a rate in
the same units:

* its parallelism (shards, range tasks, Map pages, Lambda concurrency) times what one worker
  does, from the per-unit request counts the cost tests measure (``JOB_REQUESTS``,
  ``MEASURED_REQUESTS`` in :mod:`lightmetrics.operator_tools.cost_workload`: the one source) and
  a per-request latency (:class:`KeepupParams`, an assumption);
* AWS's documented quotas (:class:`Quotas`): a partition's rate divided by the requests per unit
  that land on it (every index write of an hour under one ``date=/hour=`` prefix; a reap's marks
  spread over ``MARKS_SHARDS`` partition keys, its checkpoints under ``checkpoint#reap`` and
  ``checkpoint#reap#range``); inline Map's 40; Lambda's account concurrency, which ingest takes
  first (EventBridge's 300 rules a bus bind nothing: the reconciler has one schedule whatever its
  shards, which fans out on the shards queue);
* the code's own bounds (R7's 50,000 entries a reconciler run, 24 retention hours a daily run,
  ``max_pending_pages`` per grace, GC's ``max_pages``).

``headroom`` = can do ÷ must follow; ``first limit`` is the least limit's name; ``at_rate`` is
the rate at which headroom falls to 1 (bisection over R: headroom never rises with R). Each
job's partitions are reported with their load at R (the rate it must follow × requests per unit
on the partition) as a share of the quota. docs/performance.md quotes the output.

The walk follows the deployment (the cost model's ``walks_per_month``): where an S3 Inventory runs
(the default) it is not scheduled — the weekly audit moves every watermark — so it has no rate to
follow and no headroom (``headroom`` None, ``scheduled`` False); its ``can_do_per_s`` and
``one_walk_hours`` are then a bootstrap's pace. ``--set walks_per_month=4.35`` models a bucket
without inventory, where it runs weekly over all history.

Example:
    >>> report = keepup(1000.0)
    >>> [j["job"] for j in report["jobs"]][:3]
    ['indexer: accepted', 'indexer: raw blobs', 'indexer: quarantine']
    >>> 0 < report["jobs"][0]["headroom"] < keepup(100.0)["jobs"][0]["headroom"]
    True
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, TypeVar, cast

from lightmetrics.deployment.resources import FUNCTIONS, PIPELINE_SCHEDULES, STATE_MACHINES
from lightmetrics.deployment.settings import MAX_RECONCILE_SHARDS, Settings
from lightmetrics.derived.reconcile import MAX_ENTRIES_PER_RUN
from lightmetrics.derived.walk.params import max_rounds_for
from lightmetrics.operator_tools.cost_model import control_table_units
from lightmetrics.operator_tools.cost_workload import (
    DAY_S,
    JOB_REQUESTS,
    MEASURED_REQUESTS,
    MONTH_S,
    Assumptions,
    inventory_objects,
    job_requests,
    job_units,
    retention_marks_capacity,
)
from lightmetrics.operator_tools.indexer_invocations import FULL_VCPU_MB, index_cpu_ms, index_messages_per_invocation
from lightmetrics.operator_tools.keepup_types import Limit, Partition, Quotas, job_row, s3_requests
from lightmetrics.operator_tools.schedules import scheduled
from lightmetrics.reaps.gc_marks import MARKS_SHARDS
from lightmetrics.reaps.params import DEFAULT_RANGE_PARALLELISM, ReapParams


def _schedule_field(machine: str, field: str) -> Any:
    spec = next(s for s in STATE_MACHINES if s.name == machine)
    return json.loads(spec.schedule_input or "{}")[field]


def _memory_mb(function: str) -> int:
    return next(f.memory_mb for f in FUNCTIONS if f.name == function)


@dataclass(frozen=True)
class KeepupParams:
    """The deployment's settings (defaults: what the code deploys) and the figures the model
    assumes. Every figure is an input (``--set name=value``), not a measurement."""

    # -- latency per request (S3's small-object median is tens of milliseconds)
    s3_rtt_s: float = 0.030
    list_rtt_s: float = 0.100  # a ListObjectsV2 page of 1,000 keys
    ddb_rtt_s: float = 0.010
    lambda_invoke_s: float = 0.030
    sfn_round_overhead_s: float = 1.0  # Step Functions + Lambda around one walk round (Plan, Route, Map)
    sfn_state_s: float = 0.05  # one state entered outside a round (a continuation's)
    # -- the indexers (their CPU per record and messages per invocation: the cost model's Assumptions)
    conflict_fraction: float = 0.001  # accepts that quarantine evidence (the quarantine indexer's units)
    # -- the reconciler (settings.py, reconcile.py)
    reconcile_shards: int = int(Settings.model_fields["reconcile_shards"].default)
    reconcile_workers: int = 8  # reconcile.py's pool
    # a sharded hour HEADs its entry's raw-blobs-by-time entry instead of listing blob hours (R8)
    reconcile_sharded_heads_per_check: float = 1.0
    # -- retention (reaps/params.py, resources.py)
    range_parallelism: int = DEFAULT_RANGE_PARALLELISM
    retention_cpu_ms_per_batch: float = 3.1  # measured locally at one vCPU (1,769 MB)
    retention_memory_mb: int = _memory_mb("reap-retention")
    gc_grace_s: int = int(Settings.model_fields["gc_grace_s"].default)
    retention_runs_per_day: float = 1.0  # cron(0 5 * * ? *)
    # -- GC (the daily schedule's input; ReapParams' defaults)
    gc_max_pages: int = int(_schedule_field("reap", "max_pages"))
    gc_concurrency: int = cast(int, ReapParams.__dataclass_fields__["concurrency"].default)
    # -- the walk: keys a page task probes at once
    walk_pool: int = 16
    # -- the pipeline on EMR Serverless (infra/components/pipeline.py: maximum capacity 16 vCPU)
    emr_max_vcpu: int = 16
    rollup_samples_per_vcpu_s: float = 22_450.0  # lmctl bench pipeline: 44,900 samples/s on 2 cores
    samples_per_batch: int = 500


#: Named configurations: ``deployed`` is the code's defaults; ``docs`` is what docs/performance.md
#: said 1,000 batches/s needs (96 shards, 40 ranges, 300 pending pages, reap functions at 1 vCPU).
PROFILES: dict[str, dict[str, Any]] = {
    "deployed": {},
    "docs": {"reconcile_shards": 96, "range_parallelism": 40, "retention_max_pending_pages": 300,
             "retention_memory_mb": 1769},
}


# --- the jobs ------------------------------------------------------------------------------------------
#: Requests per unit that land under one hour's prefix (the key layout, docs/protocol.md §2): an
#: accepted manifest's accepted-by-time entry, a blob's raw-blobs-by-time entry; accepted-by-blob
#: and quarantine-by-blob keys spread by hash after their roots.
HOUR_PREFIX_WRITES = {"index.accepted_manifest": 1.0, "index.raw_blob": 1.0}
#: The quarantine indexer per conflict: an assumption, not measured (the cost table has no probe
#: of it): the evidence read, its quarantine-by-blob entry written.
QUARANTINE_INDEX_REQUESTS = {"s3.GetObject": 1.0, "s3.PutObject": 1.0}


def _indexers(rate: float, a: Assumptions, k: KeepupParams, q: Quotas) -> list[dict[str, Any]]:
    out = []
    # Ingest takes its concurrency first; the three index queues share what is left.
    spare = max(0.0, q.lambda_concurrency - rate * a.ingest_ms / 1000) / 3
    for name, op, share in (("accepted", "index.accepted_manifest", 1.0), ("raw blobs", "index.raw_blob", 1.0),
                            ("quarantine", None, k.conflict_fraction)):
        b = index_messages_per_invocation(rate * share, a)
        req = dict(MEASURED_REQUESTS[op]) if op else QUARANTINE_INDEX_REQUESTS
        # records of a batch run concurrently: a read round trip, then a write round trip; CPU is serial
        trips = (s3_requests(req, reads=True) > 0) + (s3_requests(req, reads=False) > 0)
        cpu_s = index_cpu_ms(a, b, s3_requests(req, reads=True) + s3_requests(req, reads=False)) / 1000
        per_invocation = b / (trips * k.s3_rtt_s + cpu_s)
        limits = [Limit(f"Lambda {q.lambda_concurrency:,} less ingest", spare * per_invocation),
                  Limit(f"SQS event source max {q.sqs_event_source_concurrency:,}",
                        q.sqs_event_source_concurrency * per_invocation)]
        parts = [Partition("S3 PUT/s, hour prefix", HOUR_PREFIX_WRITES[op], q.s3_writes_per_prefix)] \
            if op in HOUR_PREFIX_WRITES else []
        out.append(job_row(f"indexer: {name}", "records", rate * share, limits, parts))
    return out


def _reconciler(rate: float, a: Assumptions, k: KeepupParams, q: Quotas) -> dict[str, Any]:
    checks = a.reconcile_repairs_per_entry  # checks per entry (R4)
    heads = k.reconcile_sharded_heads_per_check if k.reconcile_shards > 1 else 0.0
    trips = sum(JOB_REQUESTS["reconciler"]["entry.verified"].values()) + heads  # GET, then HEAD
    by_time = k.reconcile_workers / (trips * k.s3_rtt_s)
    by_r7 = MAX_ENTRIES_PER_RUN / a.reconcile_every_s
    shard = min(by_time, by_r7) / checks  # entries/s one shard follows
    why = f"R7 {MAX_ENTRIES_PER_RUN:,} a run" if by_r7 <= by_time else f"{k.reconcile_workers} in flight"
    limits = [Limit(f"{k.reconcile_shards} shard(s) x {why}", k.reconcile_shards * shard),
              Limit(f"shards max {MAX_RECONCILE_SHARDS}", MAX_RECONCILE_SHARDS * shard)]
    # reads under one hour's prefixes: its listing pages, and in a sharded hour the blob HEADs
    hour_reads = checks * heads + a.reconcile_passes_per_entry / 1000
    return job_row("reconciler", "entries", rate, limits,
                [Partition("S3 GET/s, hour prefix", hour_reads, q.s3_reads_per_prefix)])


def _walk(rate: float, a: Assumptions, k: KeepupParams, q: Quotas) -> dict[str, Any]:
    # The shape of one walk a month (keys a page, pages a round); how many run is walks_per_month:
    # none where an S3 Inventory runs (the audit moves W), weekly without one (docs/walks.md).
    u = job_units(rate, replace(a, walks_per_month=1.0))["walk"]
    keys = u["key.retained"] + u["key.listed"] + u["key.reaped"]  # one walk's
    per_page = keys / u["page"]
    # a page task: its LIST pages one after another, then its probes (group LISTs, HEADs,
    # tombstone HEADs) walk_pool at a time, then the fence and the cursor
    lists = (u["page"] + u["page_listing"]) / u["page"]
    probes_list = u["index_listing"] / u["page"]
    probes_head = (u["key.retained"] + u["tombstone_check"]) / u["page"]
    page_s = (lists * k.list_rtt_s + math.ceil(probes_list / k.walk_pool) * k.list_rtt_s
              + math.ceil(probes_head / k.walk_pool) * k.s3_rtt_s
              + JOB_REQUESTS["walk"]["page"]["dynamodb.UpdateItem"] * k.ddb_rtt_s + k.lambda_invoke_s)
    rounds = u["round"]
    cont = JOB_REQUESTS["walk"]["continuation"]
    per_round = (cont["sfn.transitions"] * k.sfn_state_s + cont["lambda.Invoke"] * k.lambda_invoke_s) \
        * u["continuation"] / rounds
    round_s = page_s + k.sfn_round_overhead_s + per_round
    p = a.walk_parallelism
    limits = [Limit(f"parallelism {p} (pages a round)", p * per_page / round_s),
              Limit(f"inline Map {q.inline_map_concurrency}", q.inline_map_concurrency * per_page / round_s)]
    wcu, _ = control_table_units(JOB_REQUESTS["walk"]["page"])
    parts = [Partition("DynamoDB WCU, walk checkpoint", wcu / per_page, q.ddb_wcu_per_partition)]
    if not a.walks_per_month:
        # Not scheduled: no rate to follow, so no headroom; can_do is a bootstrap's (or a repair's) pace.
        job = job_row("walk (not scheduled)", "keys", 0.0, limits, parts)
        return {**job, "scheduled": False, "headroom": None, "one_walk_keys": keys,
                "one_walk_hours": keys / job["can_do_per_s"] / 3600}
    job = job_row("walk (weekly)", "keys", keys * a.walks_per_month / MONTH_S, limits, parts)
    return {**job, "one_walk_keys": keys, "one_walk_hours": keys / job["can_do_per_s"] / 3600}


def retention_checkpoint_capacity(rate: float, a: Assumptions) -> tuple[float, float]:
    """(WCU, RCU) per retained batch of the reap's checkpoints (the summary ``checkpoint#reap``,
    the range items ``checkpoint#reap#range``): the cost model's units of a month (pages, settle
    rounds, hours, runs), per batch. A system younger than its retention reaps nothing yet; its
    first expired hour costs the same per batch."""
    units = job_units(rate, a)["retention"] or job_units(rate, replace(a, system_age_days=a.retention_days + 1))[
        "retention"]
    per_batch = {api: n / units["batch"] for api, n in job_requests("retention", units).items()}
    return control_table_units(per_batch)


def retention_capacity_per_batch(rate: float, a: Assumptions) -> tuple[float, float]:
    """(WCU, RCU) of the control table per retained batch, as the cost model prices it: the
    checkpoints' (:func:`retention_checkpoint_capacity`) and the marks items' (an hour in one range)."""
    wcu, rcu = retention_checkpoint_capacity(rate, a)
    marks_w, marks_r = retention_marks_capacity(a)
    return wcu + marks_w, rcu + marks_r


def marks_shard_partitions(wcu: float, rcu: float, q: Quotas) -> list[Partition]:
    """One marks shard's share of the marks items' capacity per unit: pages spread evenly over the
    ``MARKS_SHARDS`` partition keys (docs/protocol.md §15 G-I10)."""
    name = f"a marks shard (1/{MARKS_SHARDS})"
    return [Partition(f"DynamoDB WCU, {name}", wcu / MARKS_SHARDS, q.ddb_wcu_per_partition),
            Partition(f"DynamoDB RCU, {name}", rcu / MARKS_SHARDS, q.ddb_rcu_per_partition)]


def _retention(rate: float, a: Assumptions, k: KeepupParams, q: Quotas) -> dict[str, Any]:
    cpu_s = k.retention_cpu_ms_per_batch / 1000 * max(1.0, FULL_VCPU_MB / k.retention_memory_mb)
    ranges = k.range_parallelism
    grace = a.retention_max_pending_pages * a.retention_page_size / k.gc_grace_s  # per range
    hours_a_day = a.retention_hours_per_run * k.retention_runs_per_day
    limits = [Limit(f"range_parallelism {ranges} x CPU", ranges / cpu_s),
              Limit(f"inline Map {q.inline_map_concurrency}", q.inline_map_concurrency / cpu_s),
              Limit(f"max_pending_pages {a.retention_max_pending_pages}", min(ranges, q.inline_map_concurrency)
                    * grace),
              Limit(f"{a.retention_hours_per_run} hours a run, daily", rate * hours_a_day / 24)]
    wcu, rcu = retention_checkpoint_capacity(rate, a)
    # an hour in key ranges reads each page's marks once, by key; in one range, all pending ones
    marks_w, marks_r = retention_marks_capacity(a, by_key=ranges > 1)
    # both checkpoint keys' requests counted on each: an upper bound of either's load
    parts = [*marks_shard_partitions(marks_w, marks_r, q),
             Partition("DynamoDB WCU, reap checkpoints", wcu, q.ddb_wcu_per_partition),
             Partition("DynamoDB RCU, reap checkpoints", rcu, q.ddb_rcu_per_partition),
             # a batch's accepted-by-time entry and its raw-blobs-by-time hint: one key each under an hour
             Partition("S3 DELETE/s, hour prefix", 1.0, q.s3_writes_per_prefix)]
    return job_row("retention", "batches", rate, limits, parts)


def _gc(rate: float, a: Assumptions, k: KeepupParams, q: Quotas) -> dict[str, Any]:
    # Where an S3 Inventory runs GC proves the audit's orphans; without one (the weekly walk is then
    # scheduled: walks_per_month) no audit runs and the daily GC proves every blob from
    # raw-blobs-by-time (source by-time, schedules.schedule_input): one blob a batch.
    by_time = bool(a.walks_per_month)
    orphan = job_requests("gc" if by_time else "gc-audit", {"blob.old" if by_time else "candidate.orphan": 1})
    prove_s = sum(n for api, n in orphan.items() if api.startswith("s3.")) * k.s3_rtt_s  # reads in sequence
    limits = [Limit(f"max_pages {k.gc_max_pages:,} a daily run", k.gc_max_pages * a.gc_page_size / DAY_S),
              Limit(f"concurrency {k.gc_concurrency} all day", k.gc_concurrency / prove_s)]
    page_w, _ = control_table_units(JOB_REQUESTS["gc" if by_time else "gc-audit"]["page"])
    marks_w, _ = retention_marks_capacity(a)  # a GC mark is written, marked and settled the same way
    marked = a.orphan_fraction if by_time else 1.0  # by-time: only the orphans among the blobs are marked
    parts = [marks_shard_partitions(marks_w * marked, 0.0, q)[0],
             Partition("DynamoDB WCU, checkpoint#reap", page_w / a.gc_page_size, q.ddb_wcu_per_partition)]
    if by_time:
        return job_row("GC (every blob, by-time)", "blobs", rate, limits, parts)
    return job_row("GC (orphans)", "orphans", rate * a.orphan_fraction, limits, parts)


def _audit(rate: float, a: Assumptions, k: KeepupParams, q: Quotas) -> dict[str, Any]:
    rows = inventory_objects(rate, a) * a.audits_per_month / MONTH_S  # rows per second of the week
    return job_row("Spark audit", "inventory rows", rows,
                [Limit(f"EMR max {k.emr_max_vcpu} vCPU", a.audit_rows_per_vcpu_s * k.emr_max_vcpu)], [])


def _rollup(rate: float, a: Assumptions, k: KeepupParams, q: Quotas) -> dict[str, Any]:
    per_batch = k.rollup_samples_per_vcpu_s * k.emr_max_vcpu / k.samples_per_batch
    return job_row("hourly rollup", "batches", rate, [Limit(f"EMR max {k.emr_max_vcpu} vCPU", per_batch)], [])


JOBS = (_reconciler, _walk, _gc, _retention, _audit, _rollup)


def _jobs(rate: float, a: Assumptions, k: KeepupParams, q: Quotas) -> list[dict[str, Any]]:
    return _indexers(rate, a, k, q) + [job(rate, a, k, q) for job in JOBS]


def _crossing(index: int, a: Assumptions, k: KeepupParams, q: Quotas) -> float | None:
    """The rate at which job ``index``'s headroom falls to 1 (headroom never rises with the rate);
    None when it never does or the job is not scheduled."""
    lo, hi = 1e-3, 1e7
    if _jobs(hi, a, k, q)[index]["headroom"] is None or _jobs(hi, a, k, q)[index]["headroom"] >= 1:
        return None
    if _jobs(lo, a, k, q)[index]["headroom"] < 1:
        return 0.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if _jobs(mid, a, k, q)[index]["headroom"] >= 1 else (lo, mid)
    return lo


_D = TypeVar("_D", Assumptions, KeepupParams, Quotas)


def _has(obj: Any, name: str) -> bool:
    return any(f.name == name for f in fields(obj))


def _set(obj: _D, name: str, value: Any) -> _D:
    """``obj`` with ``name`` set to ``value`` as that field's type (an int setting stays an int)."""
    return replace(obj, **{name: type(getattr(obj, name))(value)})


def configure(profile: str = "deployed", overrides: dict[str, float] | None = None
              ) -> tuple[Assumptions, KeepupParams, Quotas]:
    """The profile's settings with ``overrides`` (a field of :class:`KeepupParams`, :class:`Quotas`
    or the cost model's :class:`Assumptions`, by name) applied."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(PROFILES)}")
    a, k, q = Assumptions(), KeepupParams(), Quotas()
    for name, value in {**PROFILES[profile], **(overrides or {})}.items():
        if _has(a, name):
            a = _set(a, name, value)
        elif _has(k, name):
            k = _set(k, name, value)
        elif _has(q, name):
            q = _set(q, name, value)
        else:
            raise ValueError(f"no setting {name!r} in KeepupParams, Quotas or Assumptions")
    if "walk_rounds_per_execution" not in (overrides or {}):
        # Step Functions' 25,000 history events bound the rounds of one execution (walk.max_rounds_for)
        a = replace(a, walk_rounds_per_execution=max_rounds_for(a.walk_parallelism))
    return a, k, q


def eventbridge_rules(*, inventory: bool = True) -> int:
    """The stack's EventBridge rules (the default bus): one per scheduled function (the reconciler's
    one whatever ``LM_RECONCILE_SHARDS``: it fans out on its shards queue), per state machine schedule
    and per pipeline schedule the deployment runs (``schedules.scheduled``: the audit's with an S3
    Inventory, the walk's without).

    >>> eventbridge_rules() < Quotas().eventbridge_rules_per_bus
    True
    """
    functions = sum(1 for f in FUNCTIONS if f.trigger_kind == "schedule")
    machines = sum((s.schedule is not None and scheduled(s.name, inventory=inventory))
                   + (s.disabled_schedule is not None) for s in STATE_MACHINES)
    return functions + machines + sum(scheduled(job, inventory=inventory) for job in PIPELINE_SCHEDULES)


def keepup(rate: float, *, profile: str = "deployed", overrides: dict[str, float] | None = None) -> dict[str, Any]:
    """Every background job at ``rate`` accepted batches/s: what it must follow, what it can do,
    its headroom, the first limit it meets and the rate at which it meets it."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    a, k, q = configure(profile, overrides)
    jobs = _jobs(rate, a, k, q)
    for i, job in enumerate(jobs):
        job["at_rate"] = _crossing(i, a, k, q)
    return {"rate": rate, "profile": profile, "overrides": dict(overrides or {}), "params": asdict(k),
            "quotas": asdict(q), "assumptions": {f.name: getattr(a, f.name) for f in fields(a)},
            "jobs": jobs, "min_headroom": min(j["headroom"] for j in jobs if j["headroom"] is not None),
            "walk_scheduled": bool(a.walks_per_month),
            "eventbridge_rules": {"used": eventbridge_rules(inventory=not a.walks_per_month),
                                  "quota": q.eventbridge_rules_per_bus}}
