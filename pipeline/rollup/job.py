"""Hourly rollups: closed acceptance hours -> immutable Parquet objects, a committed generation.

For each hour H (an *acceptance* hour, UTC) the reconciler has closed — hours before its checkpoint —:

1. list ``accepted-by-time/v1/<H>/`` in executors: one delimited listing per hour finds its agents
   (``<agent-hex>.``), then contiguous ranges of agents are listed in parallel (``StartAfter``),
   giving the hour's input manifest-ids; their sorted list's sha256 is the *inputs digest*;
2. find the highest committed generation G of H (LIST ``manifests/v1/<H>/`` + GET). Same digest:
   H is up to date (``--recompute`` re-issues G's writes, in G's format, which must all answer
   412). Otherwise the job builds generation G+1 (1 if none): a late batch in a rolled-up hour
   supersedes, never mutates;
3. read each batch (acceptance record -> blob, sha256 checked) and decode its frame in Arrow
   batches (``mapInPandas``, tasks sized from the number of inputs), aggregate per series and
   window (1m, 5m, 1h) in Spark SQL (:mod:`lightmetrics_pipeline.rollup.aggregate`);
4. write the rows of each (window, part) of the hour — the series whose metric hashes to the part —
   as one Parquet object by conditional create (format v3, :mod:`lightmetrics_pipeline.rollup.write_parquet`;
   a v1/v2 generation is recomputed in its own format, :mod:`lightmetrics_pipeline.rollup.write_chunks`);
5. renew the lease, then create ``manifests/v1/<H>/generation=<N>.json`` — **last**, the commit
   point, naming the objects by key and sha256. A 412 there with other bytes means another
   owner committed N first: refused (:class:`GenerationTaken`), and its objects stay unreferenced.

The driver collects only bounded summaries: per hour (counts, the first skipped inputs) and per
written object; nothing it holds grows with the series.

Object bytes and the manifest are pure functions of the inputs, so a rerun is a no-op: every
write answers 412. A v3 ``--recompute`` compares before it writes: each object's key (its sha256)
is compared with the committed one and none is PUT; any difference raises
:class:`NondeterministicRollup` with nothing new in the bucket.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.work.leases import lease_rule_broken
from lightmetrics_pipeline.rollup import chunks as C
from lightmetrics_pipeline.rollup import manifest as RM
from lightmetrics_pipeline.rollup import parquet as P
from lightmetrics_pipeline.rollup.committed import differing_objects, read_committed, same_chunks
from lightmetrics_pipeline.rollup.decode import SAMPLE_SCHEMA, fetch_and_decode
from lightmetrics_pipeline.rollup.inputs import list_agents, list_ranges, v2_parts, with_v2
from lightmetrics_pipeline.rollup.lease import Lease
from lightmetrics_pipeline.rollup.plan import (
    ROLLUP_FORMAT,
    GenerationTaken,
    HourPlan,
    HourResult,
    NondeterministicRollup,
    RollupPlan,
    RollupReport,
    decide,
)
from lightmetrics_pipeline.rollup.write_chunks import chunk_writes, write_chunks
from lightmetrics_pipeline.rollup.write_parquet import HourObjects, committed_refs, write_parquet
from lightmetrics_pipeline.s3io import S3Access, Tally, counter_accumulator, task_tally

#: Parallelism, sized from the input (docs/pipeline.md §4): agents per listing task, inputs
#: (batches) per decode task, chunks per write task; each count is capped.
AGENTS_PER_LIST_TASK = 64
INPUTS_PER_DECODE_TASK = 32
CHUNKS_PER_WRITE_TASK = 2_000  # v2: its aggregation tasks write the chunks
SAMPLES_PER_AGGREGATE_TASK = 25_000  # samples per aggregation task
MAX_TASKS = 2_000

def tasks_for(units: int, per_task: int) -> int:
    """``ceil(units / per_task)`` tasks, at least 1, at most :data:`MAX_TASKS`.

    >>> tasks_for(0, 32), tasks_for(100, 32), tasks_for(10**9, 32)
    (1, 4, 2000)
    """
    return max(1, min(MAX_TASKS, -(-units // per_task)))


# ------------------------------------------------------------------------- executor functions


def _count_tasks(tasks: Any, name: str, fn: Any) -> Any:
    """Wrap a ``mapInPandas``/``mapInArrow`` function: each task that receives rows adds 1 to
    ``tasks[name]`` (what a test asserts the parallelism with)."""

    def run(batches: Any) -> Any:
        counted = False
        for batch in batches:
            if not counted and len(batch):
                counted = True
                tasks.add({name: 1})
            yield batch
    return lambda batches: fn(run(batches))


# ------------------------------------------------------------------------------- the job


def decode_samples(entries: Any, access: S3Access, generations: dict[int, int], accumulator: Any,
                   tasks: Any, inputs: int) -> Any:
    """The hours' decoded samples (:data:`lightmetrics_pipeline.rollup.decode.SAMPLE_SCHEMA`), in
    ``tasks_for(inputs, INPUTS_PER_DECODE_TASK)`` decode tasks (an explicit count: adaptive
    execution does not coalesce it)."""
    from pyspark.sql import functions as F

    work = entries.where(F.col("hour_s").isin(list(generations)))
    return work.repartitionByRange(tasks_for(inputs, INPUTS_PER_DECODE_TASK), "manifest_id") \
        .mapInPandas(_count_tasks(tasks, "decode", fetch_and_decode(access, accumulator)), SAMPLE_SCHEMA)


def rollup_dataframe(entries: Any, access: S3Access, generations: dict[int, int], accumulator: Any,
                     *, tasks: Any = None, inputs: int = 1, write_tasks: int = 1) -> tuple[Any, Any]:
    """``(samples, written)`` for the hours in ``generations``: the decode, aggregation and chunk
    write plan (lazy: nothing runs, nothing is written until an action)."""
    tasks = tasks if tasks is not None else counter_accumulator(entries.sparkSession)
    samples = decode_samples(entries, access, generations, accumulator, tasks, inputs)
    return samples, chunk_writes(samples, access, generations, accumulator, tasks, write_tasks, _count_tasks)


def commit_step_s(access: S3Access) -> int:
    """The longest the rollup's commit runs after its fence (the lease renewal right before it): the
    manifest's conditional create, then a GET of what exists, each ``max_attempts`` attempts of a
    connect and a read timeout and a backoff pause (docs/protocol.md §13 L1)."""
    one_call = access.max_attempts * (2 * access.timeout_s + access.policy.max_delay_s)
    return math.ceil(2 * one_call)


class RollupJob:
    """One owner's rollup run. ``run`` = lease, plan, execute, release; tests drive the steps."""

    def __init__(self, spark: Any, access: S3Access, *, table: Any = None, clock: Clock = DEFAULT_CLOCK,
                 owner: str | None = None, lease_s: int = 900, workers: int = 16,
                 progress: Callable[[str], None] | None = None, rollup_format: int = ROLLUP_FORMAT) -> None:
        if rollup_format not in (2, 3):
            raise ValueError("rollup_format is 3 (Parquet objects) or 2 (per-series chunks: tests, benchmark)")
        broken = table is not None and lease_rule_broken(
            lease_s, commit_step_s(access), "the rollup's fenced commit: the manifest's create and a GET, with "
            "the S3 timeouts and attempts of its access", "lease_s")
        if broken:
            raise ValueError(broken)
        self.spark, self.access, self.table, self.clock = spark, access, table, clock
        self.owner = owner or f"rollup-{uuid.uuid4().hex[:12]}"
        self.lease = Lease(table, "rollup", self.owner, clock, lease_s) if table is not None else None
        self.workers = workers
        self.rollup_format = rollup_format
        self.tasks = counter_accumulator(spark)  # tasks per stage, this job's whole life
        self.say = progress or (lambda _: None)  # phases of a run, for lmctl's progress lines

    # -- planning ---------------------------------------------------------------------------
    def committed(self, hour: UtcHour, requests: Tally) -> dict[str, Any] | None:
        """The highest committed generation of ``hour`` (its manifest), or None."""
        with task_tally() as tally:
            doc = read_committed(self.access, hour)
        requests.add(tally)
        return doc

    def plan(self, hours: list[UtcHour], *, first_open: UtcHour | None, allow_open: bool = False,
             recompute: bool = False, parts: tuple[int, ...] | None = None) -> RollupPlan:
        """Each hour's status; ``parts``: the v2 parts (:func:`v2_parts`, listed here when None)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from lightmetrics_pipeline import s3io

        acc = counter_accumulator(self.spark)
        requests = Tally()
        hours = sorted(set(hours))
        plans: list[HourPlan] = []
        eligible = []
        for h in hours:
            if not allow_open and (first_open is None or h >= first_open):
                plans.append(HourPlan(h, "open"))
                continue
            with task_tally() as tally:
                st = s3io.store(self.access)
                tomb = st.head(self.access.codec.retention_tombstone("rollup", h))
                # Raw retention reaps an hour's batches long before rollup retention: once the raw
                # hour is tombstoned its inputs are going away, and a new generation built from
                # what is left would supersede the rollups with less. The committed one stays.
                raw_tomb = None if tomb is not None else st.head(self.access.codec.retention_tombstone("raw", h))
            requests.add(tally)
            if tomb is not None or raw_tomb is not None:
                plans.append(HourPlan(h, "tombstoned" if tomb is not None else "raw-reaped"))
                continue
            eligible.append(h)
        entries = None
        digests: dict[int, tuple[int, str]] = {}
        refused: dict[int, str] = {}
        if eligible:
            parts = v2_parts(self.access, requests) if parts is None else parts
            entries, refused = self._list_inputs(eligible, acc, parts)
            entries = entries.persist(StorageLevel.MEMORY_AND_DISK)
            rows = entries.groupBy("hour_s").agg(
                F.count("*").alias("n"),
                F.sha2(F.concat_ws("\n", F.array_sort(F.collect_list("manifest_id"))), 256).alias("digest"),
            ).collect()  # one row per hour
            digests = {int(r["hour_s"]): (int(r["n"]), str(r["digest"])) for r in rows}
            self._ranges.unpersist()
            if self._v2 is not None:
                self._v2.unpersist()
        for h in eligible:
            if h.start_unix_s in refused:  # a refused v2 object fails its hour, with its reason
                plans.append(HourPlan(h, "refused", reason=refused[h.start_unix_s]))
                continue
            n, digest = digests.get(h.start_unix_s, (0, C.inputs_digest([])))
            committed = self.committed(h, requests)
            status, gen, sup = decide(committed, n, digest, recompute, P.MAX_GENERATION)
            fmt = self.rollup_format
            if status == "recompute" and committed is not None:
                fmt = 3 if RM.is_parquet_manifest(committed) else 2
            plans.append(HourPlan(h, status, gen, sup, n, digest, committed, fmt))
        requests.add(dict(acc.value))
        return RollupPlan(self.owner, sorted(plans, key=lambda p: p.hour), entries, requests)

    def _list_inputs(self, hours: list[UtcHour], acc: Any, parts: tuple[int, ...]) -> tuple[Any, dict[int, str]]:
        """``(hour_s, manifest_id)`` of every input of ``hours`` and the hours refused (v1 and the
        v2 ``parts``: :func:`~lightmetrics_pipeline.rollup.inputs.with_v2`), listed in executors: the agents of
        each hour (one delimited listing), then ranges of ``AGENTS_PER_LIST_TASK`` consecutive
        agents, one listing task each. Agent ids are text, so their hex is not uniform (most start
        with ``6``/``7``): ranges of the agents actually present spread them whatever they are."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        agents = self.spark.createDataFrame([(h.start_unix_s,) for h in hours], "hour_s long") \
            .repartition(len(hours)).mapInPandas(list_agents(self.access, acc), "hour_s long, agent string")
        ranked = agents.withColumn("range", F.floor((F.row_number().over(
            Window.partitionBy("hour_s").orderBy("agent")) - 1) / AGENTS_PER_LIST_TASK))
        from pyspark import StorageLevel

        ranges = ranked.groupBy("hour_s", "range").agg(F.min("agent").alias("first"), F.max("agent").alias("last")) \
            .persist(StorageLevel.MEMORY_AND_DISK)  # listed once; released once the inputs are
        self._ranges = ranges
        counts = int(ranges.count())  # one number: how many listing tasks
        v1 = ranges.repartitionByRange(max(1, min(MAX_TASKS, counts)), "hour_s", "range") \
            .mapInPandas(_count_tasks(self.tasks, "listing", list_ranges(self.access, acc)),
                         "hour_s long, manifest_id string")
        self._v2 = None
        if not parts:
            return v1, {}  # no v2 object anywhere: the inputs are v1's, as listed before v2
        union, refused, self._v2 = with_v2(self.spark, v1, hours, self.access, acc, parts,
                                           lambda fn: _count_tasks(self.tasks, "listing-v2", fn))
        return union, refused

    # -- execution ---------------------------------------------------------------------------
    def execute(self, plan: RollupPlan) -> RollupReport:
        started = time.monotonic()
        report = RollupReport(self.owner)
        generations = plan.work()
        results = {p.hour.start_unix_s: HourResult(str(p.hour), p.status, p.generation, p.supersedes, p.input_count,
                                                   format=p.format, reason=p.reason) for p in plan.hours}
        acc = counter_accumulator(self.spark)
        try:
            if generations:
                built = self._build(plan, generations, acc, results)
                for p in plan.hours:
                    if p.hour.start_unix_s in generations:
                        self.say(f"committing {p.hour}")
                        self._commit(p, built.get(p.hour.start_unix_s), results[p.hour.start_unix_s], report.requests)
        finally:
            if plan.entries is not None:
                plan.entries.unpersist()
        report.hours = [results[p.hour.start_unix_s] for p in plan.hours]
        report.requests.add(plan.requests)
        report.requests.add(dict(acc.value))
        report.tasks = dict(self.tasks.value)
        report.seconds = time.monotonic() - started
        return report

    def _build(self, plan: RollupPlan, generations: dict[int, int], acc: Any,
               results: dict[int, HourResult]) -> dict[int, Any]:
        """Decode, aggregate, write each hour's objects in its format; per hour what its manifest
        names (:class:`HourObjects`, or a v2 hour's chunk list refs and totals). Everything
        collected is bounded: a row per hour, per object or chunk list, per skipped input shown."""
        from pyspark import StorageLevel
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        inputs = sum(p.input_count for p in plan.hours if p.hour.start_unix_s in generations)
        samples = decode_samples(plan.entries, self.access, generations, acc, self.tasks, inputs) \
            .persist(StorageLevel.MEMORY_AND_DISK)
        built: dict[int, Any] = {}
        try:
            failed = F.col("error").isNotNull()
            stats = samples.groupBy("hour_s").agg(
                F.count(F.when(failed, 1)).alias("skipped"),
                F.count(F.when(~failed, 1)).alias("samples"),
                F.approx_count_distinct(F.when(~failed, F.col("series"))).alias("series")).collect()
            first = samples.where(failed).select("hour_s", "manifest_id", "error") \
                .withColumn("n", F.row_number().over(Window.partitionBy("hour_s").orderBy("manifest_id"))) \
                .where(F.col("n") <= RM.SKIPPED_SAMPLE).collect() if any(int(r["skipped"]) for r in stats) else []
            for r in stats:
                results[int(r["hour_s"])].skipped_count = int(r["skipped"])
            for e in first:
                results[int(e["hour_s"])].skipped.append({"manifest_id": e["manifest_id"], "reason": e["error"]})
            for fmt in (3, 2):
                gens = plan.work(fmt)
                if not gens:
                    continue
                mine = [r for r in stats if int(r["hour_s"]) in gens]
                # The aggregation's partitions (explicit: adaptive execution does not coalesce them),
                # sized by samples; in v2 its tasks also write a chunk and an index entry per series
                # and window, so also by chunks. v3 writes in a stage of its own (one task per object).
                write_tasks = tasks_for(sum(int(r["samples"]) for r in mine), SAMPLES_PER_AGGREGATE_TASK)
                if fmt == 2:
                    write_tasks = max(write_tasks, tasks_for(3 * sum(int(r["series"]) for r in mine),
                                                             CHUNKS_PER_WRITE_TASK))
                these = samples.where(F.col("hour_s").isin(list(gens)))
                if fmt == 3:
                    digests = {p.hour.start_unix_s: p.input_sha256 for p in plan.hours if p.hour.start_unix_s in gens}
                    # A recompute compares with the committed objects before it writes (none is written).
                    # ... in the committed generation's row-group size (the same bytes).
                    recomputed = {p.hour.start_unix_s: p.committed for p in plan.hours
                                  if p.hour.start_unix_s in gens and p.status == "recompute" and p.committed is not None}
                    committed = {hs: committed_refs(doc) for hs, doc in recomputed.items()}
                    row_groups = {hs: P.rows_per_row_group(doc) for hs, doc in recomputed.items()}
                    checks = {hs: P.records_range_checks(doc) for hs, doc in recomputed.items()}
                    built.update(write_parquet(these.where(~failed).drop("error"), self.access, gens, digests, acc,
                                               self.tasks, write_tasks, _count_tasks, committed, row_groups,
                                               range_checks=checks))
                else:
                    built.update(write_chunks(these, self.access, gens, acc, self.tasks, write_tasks, _count_tasks))
        finally:
            samples.unpersist()
        return built

    def _manifest(self, p: HourPlan, built: Any, result: HourResult) -> bytes:
        """The manifest of ``p``'s generation in its format, from what the write stage built."""
        assert p.generation is not None
        common = {"hour": p.hour, "generation": p.generation, "supersedes": p.supersedes, "input_count": p.input_count,
                  "input_sha256": p.input_sha256, "skipped": result.skipped, "skipped_count": result.skipped_count}
        if p.format == 3:
            objs = built if isinstance(built, HourObjects) else HourObjects({})
            result.objects, result.rows, result.series, result.samples = (len(objs.objects), objs.rows, objs.series,
                                                                          objs.samples)
            result.writes.update(objs.outcomes)
            # A recompute keeps the committed manifest's schema (v3 or v4) and row-group size: the
            # same bytes, a 412.
            again = p.committed if p.status == "recompute" else None
            schema = str(again["schema"]) if again is not None else RM.WRITTEN_MANIFEST_SCHEMA
            row_groups = P.rows_per_row_group(again) if again is not None else P.ROWS_PER_ROW_GROUP
            return P.manifest_v3_bytes(**common, parts=objs.parts, objects=objs.objects, totals=objs.totals(),
                                       schema=schema, rows_per_row_group=row_groups)
        lists, totals, writes = built if built is not None else ([], {}, Counter())
        totals = {"chunks": 0, "series": 0, "samples": 0, "parts": 1, **totals}
        result.chunks, result.series, result.samples = totals["chunks"], totals["series"], totals["samples"]
        result.writes.update(writes)
        return RM.manifest_bytes(**common, parts=totals["parts"], lists=lists, totals=totals)

    def _commit(self, p: HourPlan, built: Any, result: HourResult, requests: Tally) -> None:
        from lightmetrics_pipeline import s3io

        assert p.generation is not None
        codec = self.access.codec
        body = self._manifest(p, built, result)
        key = codec.rollup_manifest(p.hour, p.generation)
        result.manifest_key = key
        mine = RM.parse_manifest(body)
        if p.status == "recompute" and p.committed is not None and not same_chunks(codec, p.committed, mine):
            raise NondeterministicRollup(f"{p.hour} generation {p.generation}: recomputed objects differ from the "
                                         f"committed ones ({differing_objects(p.committed, mine)}); nothing "
                                         "was written")
        if self.lease is not None:
            self.lease.renew()  # LeaseLost: stop before committing anything else
        with task_tally() as tally:
            outcome = s3io.put_if_absent(self.access, key, body)
            if outcome == "exists":
                existing = s3io.store(self.access).get(key)
                # A generation committed as a v1 manifest (chunks inline) names the same chunks in
                # other bytes: that is this generation, not another owner's.
                if existing != body and not same_chunks(codec, RM.parse_manifest(existing or b"{}"), mine):
                    requests.add(tally)
                    raise GenerationTaken(f"{p.hour}: generation {p.generation} was committed by another owner "
                                          f"({key}); this run's objects stay unreferenced")
        requests.add(tally)
        result.writes[outcome] += 1
        result.manifest_outcome = outcome
        if p.status == "recompute":
            result.status = "recomputed"
        else:
            result.status = "committed" if outcome == "created" else "already-committed"

    # -- the whole run -------------------------------------------------------------------------
    def run(self, hours: list[UtcHour], *, first_open: UtcHour | None, allow_open: bool = False,
            recompute: bool = False, parts: tuple[int, ...] | None = None) -> RollupReport:
        if self.lease is not None:
            self.lease.acquire()  # LeaseHeld: another run is at it
        try:
            self.say(f"planning {len(hours)} hours")
            plan = self.plan(hours, first_open=first_open, allow_open=allow_open, recompute=recompute, parts=parts)
            self.say(f"rolling up {len(plan.work())} of them")
            return self.execute(plan)
        finally:
            if self.lease is not None:
                self.lease.release()


__all__ = ["RollupJob", "commit_step_s", "decode_samples", "rollup_dataframe", "tasks_for"]
