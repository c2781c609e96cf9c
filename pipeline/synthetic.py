"""Generated data for the pipeline's scale tests and the benchmark.

* :func:`generate_inventory` writes an inventory report (real format, Parquet) of a *consistent*
  bucket — every identity has its acceptance record, both accepted-* entries, its blob and its
  raw-blobs-by-time entry (5 keys each) — plus planted defects, straight from pyarrow columns
  (the objects themselves need not exist: the audit's joins only read the inventory);
* :func:`load_batches` writes accepted batches (blob, acceptance record, accepted-by-time entry)
  into a bucket directly, for rollup benchmarks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lightmetrics.protocol.derived_entries import AcceptedByTimeEntry
from lightmetrics.protocol.frame import Sample, encode_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec, UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest
from lightmetrics_pipeline.inventory.report import Destination, WrittenReport, parquet_table_bytes, write_report_files


@dataclass
class GeneratedInventory:
    report: WrittenReport
    rows: int
    identities: int
    planted: dict[str, list[str]] = field(default_factory=dict)


def generate_inventory(dest_dir: Path, *, bucket: str, prefix: str = "", identities: int, now_s: int,
                       orphan_derived: int = 0, rows_per_file: int = 500_000) -> GeneratedInventory:
    """A consistent inventory of ``identities`` accepted batches (5 rows each), and
    ``orphan_derived`` accepted-by-time entries whose acceptance record does not exist."""
    import pyarrow as pa

    codec = KeyCodec(prefix)
    hour = UtcHour.of_unix_ns((now_s - 86400) * 1_000_000_000)
    lm = datetime.fromtimestamp(hour.start_unix_s + 60, tz=timezone.utc)
    keys: list[str] = []
    sizes: list[int] = []
    for i in range(identities):
        ident = BatchIdentity.create(f"agent-{i % 997:04d}", f"boot-{i // 997:06d}", i * 10, i * 10 + 9)
        sha = hashlib.sha256(i.to_bytes(8, "big")).hexdigest()
        keys += [codec.accepted(ident), codec.accepted_by_time(hour, ident), codec.accepted_by_blob(sha, ident),
                 codec.raw_blob(sha), codec.raw_blobs_by_time(hour, sha)]
        sizes += [300, 200, 150, 4000, 250]
    planted = []
    for j in range(orphan_derived):
        ghost = BatchIdentity.create("ghost-agent", f"ghost-{j}", 0, 9)
        planted.append(codec.accepted_by_time(hour, ghost))
    keys += planted
    sizes += [200] * len(planted)
    n = len(keys)
    bodies = []
    for lo in range(0, n, rows_per_file):
        hi = min(n, lo + rows_per_file)
        m = hi - lo
        table = pa.table({
            "bucket": pa.array([bucket] * m), "key": pa.array(keys[lo:hi]), "version_id": pa.array([None] * m, pa.string()),
            "is_latest": pa.array([True] * m), "is_delete_marker": pa.array([False] * m),
            "size": pa.array(sizes[lo:hi], pa.int64()),
            "last_modified_date": pa.array([lm] * m, pa.timestamp("ms", tz="UTC")),
            "e_tag": pa.array(["0" * 32] * m), "storage_class": pa.array(["STANDARD"] * m),
            "is_multipart_uploaded": pa.array([False] * m), "checksum_algorithm": pa.array([None] * m, pa.string()),
        })
        bodies.append((parquet_table_bytes(table), m))
    report = write_report_files(iter(bodies), Destination(None, "inventory", dest_dir), source_bucket=bucket,
                                now_ms=now_s * 1000)
    return GeneratedInventory(report, n, identities, {"derived-without-source": planted})


def frame_samples(agent: int, batch: int, n: int, base_ns: int) -> list[Sample]:
    return [Sample(metric=("cpu.usage" if i % 2 == 0 else "mem.rss"),
                   labels={"host": f"host-{agent:02d}", "core": str(i % 4)},
                   ts_unix_ns=base_ns + (batch * n + i) * 1_000_000_000 // max(1, n // 60),
                   value=float((agent * 31 + batch * 7 + i) % 1000) / 10.0) for i in range(n)]


def series_samples(k: int, *, series: int, per_series: int, per_batch: int, base_ns: int) -> list[Sample]:
    """Batch ``k`` of an hour of ``series`` series × ``per_series`` samples each, spread evenly over
    the hour, in time order, ``per_batch`` samples per batch (the rollup benchmark's shapes: many
    series with few samples, few series with many)."""
    step = 3600 * 1_000_000_000 // per_series
    out = []
    for j in range(k * per_batch, min(series * per_series, (k + 1) * per_batch)):
        t, i = divmod(j, series)
        out.append(Sample(f"bench.m{i % 4}", {"host": f"h{i // 4:05d}"}, base_ns + t * step,
                          float((i * 7 + t) % 1000) / 10.0))
    return out


def load_batches(s3: Any, bucket: str, codec: KeyCodec, *, batches: int, samples_per_batch: int, accepted_at_ns: int,
                 base_ns: int, agents: int = 10, workers: int = 32,
                 samples_of: Callable[[int], list[Sample]] | None = None, agent_prefix: str = "bench-agent") -> int:
    """Write ``batches`` accepted batches of one hour directly (blob, record, accepted-by-time); returns
    samples. ``samples_of(k)``: the samples of batch ``k`` (default :func:`frame_samples`); agents are
    ``<agent_prefix>-NN`` (another prefix: other identities, in the same bucket)."""

    def one(k: int) -> int:
        agent, batch = k % agents, k // agents
        ident = BatchIdentity.create(f"{agent_prefix}-{agent:02d}", "boot-1", batch * samples_per_batch,
                                     batch * samples_per_batch + samples_per_batch - 1)
        samples = samples_of(k) if samples_of else frame_samples(agent, batch, samples_per_batch, base_ns)
        data = encode_frame(ident, samples, compress=True)
        sha = hashlib.sha256(data).hexdigest()
        blob_key, manifest_key = codec.raw_blob(sha), codec.accepted(ident)
        m = AcceptedBatchManifest(agent_id=ident.agent_id, boot_id=ident.boot_id, seq_start=ident.seq_start,
                                  seq_end=ident.seq_end, frame_sha256=sha, frame_bytes=len(data), raw_blob_key=blob_key,
                                  accepted_at_unix_ns=accepted_at_ns, collector_id="bench", wire_version=1,
                                  frame_version=1)
        s3.put_object(Bucket=bucket, Key=blob_key, Body=data, IfNoneMatch="*")
        s3.put_object(Bucket=bucket, Key=manifest_key, Body=m.to_bytes(), IfNoneMatch="*")
        entry = AcceptedByTimeEntry(manifest_key=manifest_key, frame_sha256=sha, raw_blob_key=blob_key,
                                    frame_bytes=len(data), accepted_at_unix_ns=accepted_at_ns)
        s3.put_object(Bucket=bucket, Key=codec.accepted_by_time(UtcHour.of_unix_ns(accepted_at_ns), ident),
                      Body=entry.to_bytes(), IfNoneMatch="*")
        return len(samples)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(one, range(batches)))


__all__ = ["GeneratedInventory", "frame_samples", "generate_inventory", "load_batches", "series_samples"]
