"""Hourly rollups: closed acceptance hours -> immutable chunks, index entries, a committed generation.

For each hour H (an *acceptance* hour, UTC) the reconciler has closed — hours before its checkpoint —:

1. list ``accepted-by-time/v1/<H>/`` in executors (16 shards by the first hex digit of the
   agent), giving the hour's input manifest-ids; their sorted list's sha256 is the *inputs digest*;
2. find the highest committed generation G of H (LIST ``manifests/v1/<H>/`` + GET). Same digest:
   H is up to date (``--recompute`` re-issues G's writes, which must all answer 412). Otherwise
   the job builds generation G+1 (1 if none): a late batch in a rolled-up hour supersedes, never mutates;
3. read each batch (acceptance record -> blob, sha256 checked) and decode its frame in Arrow
   batches (``mapInPandas``), aggregate per series and window (1m, 5m, 1h) with
   ``applyInPandas`` (count, nan_count, sum, min, max, last, DDSketch), encode one chunk per
   (series, window);
4. write every chunk, then its index entry, by conditional create (executors);
5. renew the lease, then create ``manifests/v1/<H>/generation=<N>.json`` — **last**, the commit
   point. A 412 there with other bytes means another owner committed N first: refused
   (:class:`GenerationTaken`), and its chunks stay unreferenced.

Chunk ids are deterministic (hour, window, series, generation, sorted manifest-ids), and so are
chunk bytes and the manifest, so a rerun is a no-op: every write answers 412.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from lightmetrics.clock import DEFAULT_CLOCK, Clock
from lightmetrics.keys import KeyKind, UtcHour
from lightmetrics.leases import lease_rule_broken

from pipeline import chunks as C
from pipeline.decode import SAMPLE_SCHEMA, fetch_and_decode
from pipeline.lease import Lease
from pipeline.s3io import S3Access, Tally, counter_accumulator, task_tally

SHARDS = "0123456789abcdef"
CHUNK_META_COLUMNS = ["hour_s", "series", "window", "chunk_id", "metric", "labels_json", "ts_min", "ts_max",
                      "samples", "rows", "sha256", "bytes", "manifest_ids_n"]
CHUNK_SCHEMA = ("hour_s long, series string, window string, chunk_id string, metric string, labels_json string, "
                "ts_min long, ts_max long, samples long, rows long, sha256 string, bytes long, manifest_ids_n long, "
                "chunk binary")
WRITTEN_SCHEMA = ("hour_s long, series string, window string, chunk_id string, metric string, labels_json string, "
                  "ts_min long, ts_max long, samples long, rows long, sha256 string, bytes long, manifest_ids_n long, "
                  "chunk_outcome string, index_outcome string")


class GenerationTaken(Exception):
    """Another owner committed this generation of the hour first (the CLI exits 5)."""


class NondeterministicRollup(Exception):
    """A recomputed generation produced other chunk bytes than the committed one."""


@dataclass
class HourPlan:
    hour: UtcHour
    status: str  # build | recompute | up-to-date | empty | open | tombstoned | raw-reaped
    generation: int | None = None
    supersedes: int | None = None
    input_count: int = 0
    input_sha256: str = ""
    committed: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"hour": str(self.hour), "status": self.status, "generation": self.generation,
                "supersedes": self.supersedes, "inputs": self.input_count}


@dataclass
class RollupPlan:
    owner: str
    hours: list[HourPlan]
    entries: Any = None  # DataFrame (hour_s, manifest_id), persisted
    requests: Tally = field(default_factory=Tally)  # what planning asked S3

    def work(self) -> dict[int, int]:
        return {h.hour.start_unix_s: int(h.generation) for h in self.hours
                if h.status in ("build", "recompute") and h.generation is not None}


@dataclass
class HourResult:
    hour: str
    status: str
    generation: int | None = None
    supersedes: int | None = None
    inputs: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    chunks: int = 0
    series: int = 0
    samples: int = 0
    writes: Counter[str] = field(default_factory=Counter)
    manifest_key: str = ""
    manifest_outcome: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"hour": self.hour, "status": self.status, "generation": self.generation, "supersedes": self.supersedes,
                "inputs": self.inputs, "skipped": self.skipped, "chunks": self.chunks, "series": self.series,
                "samples": self.samples, "writes": dict(self.writes), "manifest_key": self.manifest_key,
                "manifest_outcome": self.manifest_outcome}


@dataclass
class RollupReport:
    owner: str
    hours: list[HourResult] = field(default_factory=list)
    requests: Tally = field(default_factory=Tally)
    seconds: float = 0.0

    @property
    def samples(self) -> int:
        return sum(h.samples for h in self.hours)

    @property
    def skipped(self) -> int:
        return sum(len(h.skipped) for h in self.hours)

    @property
    def created(self) -> int:
        return sum(h.writes.get("created", 0) for h in self.hours)

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "hours": [h.to_json() for h in self.hours], "samples": self.samples,
                "skipped_inputs": self.skipped, "objects_created": self.created,
                "s3_requests": self.requests.to_json(), "seconds": round(self.seconds, 2)}


# ------------------------------------------------------------------------- executor functions


def _list_entries(access: S3Access, accumulator: Any) -> Any:
    def run(batches: Any) -> Any:
        import numpy as np

        from pipeline import s3io

        codec = access.codec
        for pdf in batches:
            hours, mids = [], []
            with s3io.task_tally() as tally:
                for hour_s, shard in zip(pdf["hour_s"], pdf["shard"]):
                    prefix = codec.accepted_by_time_hour(UtcHour(int(hour_s))) + shard
                    for key, _ in s3io.list_all(access, prefix)[0]:
                        try:
                            parsed = codec.parse(key)
                        except Exception:
                            continue  # not ours: the audit reports keys outside the layout
                        if parsed.kind is KeyKind.ACCEPTED_BY_TIME and parsed.identity is not None:
                            hours.append(int(hour_s))
                            mids.append(parsed.identity.manifest_id)
            accumulator.add(tally.counts)
            yield s3io.pandas_frame({"hour_s": np.array(hours, dtype="int64"), "manifest_id": mids})

    return run


def _build_chunks(generations: dict[int, int]) -> Any:
    """``applyInPandas`` per (hour, series): every window's rows, encoded as chunks."""

    def build(pdf: Any) -> Any:
        import numpy as np
        import pandas as pd

        hour_s = int(pdf["hour_s"].iloc[0])
        hour = UtcHour(hour_s)
        series = str(pdf["series"].iloc[0])
        generation = generations[hour_s]
        ts = pdf["ts_ns"].to_numpy(dtype="int64")
        values = pdf["value"].to_numpy(dtype="float64")
        mids = pdf["manifest_id"].to_numpy(dtype=object)
        ords = pdf["ord"].to_numpy(dtype="int64")
        contributors = sorted(set(mids.tolist()))
        ts_min, ts_max = int(ts.min()), int(ts.max())
        out: dict[str, list[Any]] = {c: [] for c in CHUNK_META_COLUMNS + ["chunk"]}
        fine: dict[int, Any] = {}  # 1m window start -> DDSketch (merged into 5m and 1h)
        metric, labels = C.parse_series(series)
        for window in C.WINDOW_NS:  # 1m first: 5m and 1h merge its sketches
            w = C.WINDOW_NS[window]
            starts = (ts // w) * w
            order = np.argsort(starts, kind="stable")
            uniq, first = np.unique(starts[order], return_index=True)
            bounds = list(first[1:]) + [len(order)]
            rows = []
            for ws, lo, hi in zip(uniq.tolist(), first.tolist(), bounds):
                idx = order[lo:hi]
                if window == "1m":
                    sk = C.sketch_of(values[idx].tolist())
                    fine[ws] = sk
                else:
                    sk = C.merge_sketches(s for k, s in fine.items() if ws <= k < ws + w)
                rows.append(C.aggregate_window(values[idx].tolist(), ts[idx].tolist(), mids[idx].tolist(),
                                               ords[idx].tolist(), ws, sketch=sk))
            cid = C.chunk_id(hour, window, series, generation, contributors)
            header = C.chunk_header(hour=hour, window=window, series=series, generation=generation, chunk_id_=cid,
                                    manifest_ids=contributors, ts_min=ts_min, ts_max=ts_max, samples=len(ts),
                                    rows=len(rows))
            data = C.encode_chunk(header, rows)
            for col, v in zip(CHUNK_META_COLUMNS + ["chunk"],
                              (hour_s, series, window, cid, metric, json.dumps([list(p) for p in labels]), ts_min, ts_max,
                               len(ts), len(rows), hashlib.sha256(data).hexdigest(), len(data), len(contributors), data)):
                out[col].append(v)
        return pd.DataFrame(out)

    return build


def _write_chunks(access: S3Access, generations: dict[int, int], accumulator: Any, workers: int = 16) -> Any:
    """``mapInPandas``: conditional create of each chunk, then of its index entry."""

    def run(batches: Any) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        from pipeline import s3io

        codec = access.codec

        def write(row: dict[str, Any]) -> tuple[str, str]:
            hour = UtcHour(int(row["hour_s"]))
            key = codec.rollup_chunk(row["window"], hour, row["metric"], row["chunk_id"])
            chunk_outcome = s3io.put_if_absent(access, key, bytes(row["chunk"]), content_type="application/zstd")
            entry = {"chunk_key": key, "chunk_id": row["chunk_id"], "chunk_sha256": row["sha256"],
                     "chunk_bytes": int(row["bytes"]), "hour": str(hour), "window": row["window"],
                     "metric": row["metric"], "labels": json.loads(row["labels_json"]), "series": row["series"],
                     "generation": generations[int(row["hour_s"])], "sample_ts_min_ns": int(row["ts_min"]),
                     "sample_ts_max_ns": int(row["ts_max"]), "samples": int(row["samples"]), "rows": int(row["rows"])}
            index_outcome = s3io.put_if_absent(access, codec.rollup_index(hour, row["chunk_id"]),
                                               C.encode_index_entry(entry), content_type="application/zstd")
            return chunk_outcome, index_outcome

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lm-rollup-write") as pool:
            for pdf in batches:
                records = pdf.to_dict("records")
                with s3io.task_tally() as tally:
                    outcomes = list(pool.map(write, records))
                accumulator.add(tally.counts)
                meta = pdf.drop(columns=["chunk"])
                meta["chunk_outcome"] = [o[0] for o in outcomes]
                meta["index_outcome"] = [o[1] for o in outcomes]
                yield meta

    return run


# ------------------------------------------------------------------------------- the job


def rollup_dataframe(entries: Any, access: S3Access, generations: dict[int, int], accumulator: Any) -> tuple[Any, Any]:
    """``(samples, chunks)`` for the hours in ``generations``: the decode and aggregation plan."""
    from pyspark.sql import functions as F

    work = entries.where(F.col("hour_s").isin(list(generations)))
    samples = work.repartition(max(2, min(64, len(generations) * 4)), "manifest_id") \
        .mapInPandas(fetch_and_decode(access, accumulator), SAMPLE_SCHEMA)
    chunks = samples.where(F.col("error").isNull()).drop("error") \
        .groupBy("hour_s", "series").applyInPandas(_build_chunks(generations), CHUNK_SCHEMA)
    return samples, chunks


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
                 progress: Callable[[str], None] | None = None) -> None:
        broken = table is not None and lease_rule_broken(
            lease_s, commit_step_s(access), "the rollup's fenced commit: the manifest's create and a GET, with "
            "the S3 timeouts and attempts of its access", "lease_s")
        if broken:
            raise ValueError(broken)
        self.spark, self.access, self.table, self.clock = spark, access, table, clock
        self.owner = owner or f"rollup-{uuid.uuid4().hex[:12]}"
        self.lease = Lease(table, "rollup", self.owner, clock, lease_s) if table is not None else None
        self.workers = workers
        self.say = progress or (lambda _: None)  # phases of a run, for lmctl's progress lines

    # -- planning ---------------------------------------------------------------------------
    def committed(self, hour: UtcHour, requests: Tally) -> dict[str, Any] | None:
        """The highest committed generation of ``hour`` (its manifest), or None."""
        with task_tally() as tally:
            doc = read_committed(self.access, hour)
        requests.add(tally)
        return doc

    def plan(self, hours: list[UtcHour], *, first_open: UtcHour | None, allow_open: bool = False,
             recompute: bool = False) -> RollupPlan:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from pipeline import s3io

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
        if eligible:
            shards = self.spark.createDataFrame([(h.start_unix_s, s) for h in eligible for s in SHARDS],
                                                "hour_s long, shard string").repartition(min(len(eligible) * 16, 32))
            entries = shards.mapInPandas(_list_entries(self.access, acc), "hour_s long, manifest_id string") \
                .persist(StorageLevel.MEMORY_AND_DISK)
            rows = entries.groupBy("hour_s").agg(
                F.count("*").alias("n"),
                F.sha2(F.concat_ws("\n", F.array_sort(F.collect_list("manifest_id"))), 256).alias("digest"),
            ).collect()  # one row per hour
            digests = {int(r["hour_s"]): (int(r["n"]), str(r["digest"])) for r in rows}
        for h in eligible:
            n, digest = digests.get(h.start_unix_s, (0, C.inputs_digest([])))
            committed = self.committed(h, requests)
            if committed is None:
                status, gen, sup = ("empty", None, None) if n == 0 else ("build", 1, None)
            elif committed["inputs"]["sha256"] == digest:
                status, gen, sup = ("recompute" if recompute else "up-to-date"), committed["generation"], committed["supersedes"]
            else:
                status, gen, sup = "build", int(committed["generation"]) + 1, int(committed["generation"])
            plans.append(HourPlan(h, status, gen, sup, n, digest, committed))
        requests.add(dict(acc.value))
        return RollupPlan(self.owner, sorted(plans, key=lambda p: p.hour), entries, requests)

    # -- execution ---------------------------------------------------------------------------
    def execute(self, plan: RollupPlan) -> RollupReport:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        started = time.monotonic()
        report = RollupReport(self.owner)
        generations = plan.work()
        results = {p.hour.start_unix_s: HourResult(str(p.hour), p.status, p.generation, p.supersedes, p.input_count)
                   for p in plan.hours}
        acc = counter_accumulator(self.spark)
        try:
            if generations:
                samples, chunk_df = rollup_dataframe(plan.entries, self.access, generations, acc)
                samples.persist(StorageLevel.MEMORY_AND_DISK)
                try:
                    errors = samples.where(F.col("error").isNotNull()).select("hour_s", "manifest_id", "error").collect()
                    written = chunk_df.mapInPandas(_write_chunks(self.access, generations, acc, self.workers), WRITTEN_SCHEMA).collect()
                finally:
                    samples.unpersist()
                for e in errors:
                    results[int(e["hour_s"])].skipped.append({"manifest_id": e["manifest_id"], "reason": e["error"]})
                by_hour: dict[int, list[Any]] = {}
                for r in written:
                    by_hour.setdefault(int(r["hour_s"]), []).append(r)
                for p in plan.hours:
                    if p.hour.start_unix_s in generations:
                        self.say(f"committing {p.hour}")
                        self._commit(p, by_hour.get(p.hour.start_unix_s, []), results[p.hour.start_unix_s],
                                     report.requests)
        finally:
            if plan.entries is not None:
                plan.entries.unpersist()
        report.hours = [results[p.hour.start_unix_s] for p in plan.hours]
        report.requests.add(plan.requests)
        report.requests.add(dict(acc.value))
        report.seconds = time.monotonic() - started
        return report

    def _commit(self, p: HourPlan, rows: list[Any], result: HourResult, requests: Tally) -> None:
        from pipeline import s3io

        assert p.generation is not None
        codec = self.access.codec
        chunk_docs = [{"chunk_id": r["chunk_id"], "window": r["window"], "metric": r["metric"],
                       "labels": json.loads(r["labels_json"]), "series": r["series"],
                       "sample_ts_min_ns": int(r["ts_min"]), "sample_ts_max_ns": int(r["ts_max"]),
                       "samples": int(r["samples"]), "rows": int(r["rows"]), "sha256": r["sha256"],
                       "bytes": int(r["bytes"])} for r in rows]
        for r in rows:
            result.writes[r["chunk_outcome"]] += 1
            result.writes[r["index_outcome"]] += 1
        result.chunks = len(chunk_docs)
        result.series = len({c["series"] for c in chunk_docs})
        result.samples = sum(c["samples"] for c in chunk_docs if c["window"] == "1h")
        body = C.manifest_bytes(hour=p.hour, generation=p.generation, supersedes=p.supersedes,
                                input_count=p.input_count, input_sha256=p.input_sha256, skipped=result.skipped,
                                chunks=chunk_docs)
        key = codec.rollup_manifest(p.hour, p.generation)
        result.manifest_key = key
        if p.status == "recompute" and p.committed is not None:
            committed = {c["chunk_id"]: c["sha256"] for c in p.committed["chunks"]}
            mine = {c["chunk_id"]: c["sha256"] for c in chunk_docs}
            if committed != mine:
                raise NondeterministicRollup(f"{p.hour} generation {p.generation}: recomputed chunks differ from the "
                                             "committed ones")
        if self.lease is not None:
            self.lease.renew()  # LeaseLost: stop before committing anything else
        with task_tally() as tally:
            outcome = s3io.put_if_absent(self.access, key, body)
            if outcome == "exists":
                existing = s3io.store(self.access).get(key)
                if existing != body:
                    requests.add(tally)
                    raise GenerationTaken(f"{p.hour}: generation {p.generation} was committed by another owner "
                                          f"({key}); this run's chunks stay unreferenced")
        requests.add(tally)
        result.writes[outcome] += 1
        result.manifest_outcome = outcome
        if p.status == "recompute":
            result.status = "recomputed"
        else:
            result.status = "committed" if outcome == "created" else "already-committed"

    # -- the whole run -------------------------------------------------------------------------
    def run(self, hours: list[UtcHour], *, first_open: UtcHour | None, allow_open: bool = False,
            recompute: bool = False) -> RollupReport:
        if self.lease is not None:
            self.lease.acquire()  # LeaseHeld: another run is at it
        try:
            self.say(f"planning {len(hours)} hours")
            plan = self.plan(hours, first_open=first_open, allow_open=allow_open, recompute=recompute)
            self.say(f"rolling up {len(plan.work())} of them")
            return self.execute(plan)
        finally:
            if self.lease is not None:
                self.lease.release()


def read_committed(access: S3Access, hour: UtcHour) -> dict[str, Any] | None:
    """What readers do: the highest generation listed under ``manifests/v1/<hour>/`` (every listed
    manifest is complete — it is written after all its chunks)."""
    from pipeline import s3io

    codec = access.codec
    keys, _ = s3io.list_all(access, codec.rollup_manifest_hour(hour))
    best: tuple[int, str] | None = None
    for key, _size in keys:
        try:
            parsed = codec.parse(key)
        except Exception:
            continue
        if parsed.kind is KeyKind.ROLLUP_MANIFEST and parsed.generation is not None:
            if best is None or parsed.generation > best[0]:
                best = (parsed.generation, key)
    if best is None:
        return None
    doc = C.parse_manifest(s3io.store(access).get(best[1]) or b"")
    doc["_key"] = best[1]
    return doc


__all__ = ["GenerationTaken", "HourPlan", "HourResult", "NondeterministicRollup", "RollupJob", "RollupPlan",
           "RollupReport", "read_committed", "rollup_dataframe"]
