"""Synthetic batches for the benchmarks, and fast seeding of accepted history.

Example:
    >>> frames = batch_frames("bench-agent", "boot-1", 3)
    >>> [i.seq_start for i, _ in frames]
    [0, 10, 20]
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lightmetrics.acceptance.accept import AcceptStatus, accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.protocol.frame import Sample, encode_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.retry import RetryPolicy


def batch_frames(agent: str, boot: str, n: int, *, start: int = 0, samples: int = 3,
                 variant: float = 0.0) -> list[tuple[BatchIdentity, bytes]]:
    """``n`` consecutive identities of one agent/boot (10 sequence numbers each) with their frames."""
    out = []
    for k in range(start, start + n):
        ident = BatchIdentity.create(agent, boot, k * 10, k * 10 + 9)
        now = time.time_ns()
        frame = encode_frame(ident, [Sample("cpu", {"core": str(c)}, now + c, float(c) + k + variant)
                                     for c in range(samples)])
        out.append((ident, frame))
    return out


def seed_history(settings: Any, raw_s3: Any, batches: list[tuple[BatchIdentity, bytes]], *,
                 threads: int = 16) -> dict[str, float]:
    """Accept ``batches`` through the real accept algorithm on a client with no injected latency.

    History is real acceptance records and blobs (2 conditional PUTs per batch), only faster:
    the latency injector is not on this client and the batches go in parallel.
    """
    ctx = accept_context(settings, client=raw_s3, policy=RetryPolicy(max_attempts=6, base_delay_s=0.01))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        statuses = set(pool.map(lambda b: accept_batch(ctx, b[0], b[1]).status, batches))
    seconds = time.perf_counter() - t0
    if not statuses <= {AcceptStatus.ACCEPTED, AcceptStatus.DUPLICATE}:
        raise RuntimeError(f"seeding history failed: {statuses}")
    return {"batches": len(batches), "seconds": round(seconds, 3),
            "batches_per_s": round(len(batches) / seconds, 1) if seconds else 0.0}


def seed_indexed(system: Any, raw_s3: Any, batches: list[tuple[BatchIdentity, bytes]], *,
                 accepted_at_ns: int | None = None, threads: int = 16) -> dict[str, Any]:
    """Accept ``batches`` and index them as the event path would (the record's ``accepted-by-time``
    and ``accepted-by-blob`` entries, the blob's ``raw-blobs-by-time`` entry), on ``raw_s3`` (no
    injected latency): healthy history, every derived entry present. ``accepted_at_ns`` pins the
    acceptance time (an old hour, for retention); default now. Returns the manifest and blob keys.

    Example:
        >>> seed_indexed(system, raw, batch_frames("a", "boot-1", 3))["batches"]     # doctest: +SKIP
        3
    """
    from lightmetrics.derived.indexing import index_accepted, index_raw_blob
    from lightmetrics.protocol.clock import FrozenClock

    policy = RetryPolicy(max_attempts=6, base_delay_s=0.01)
    clock = FrozenClock(accepted_at_ns) if accepted_at_ns is not None else None
    actx = accept_context(system.settings, client=raw_s3, policy=policy, clock=clock)
    wctx = system.work_context(client=raw_s3, policy=policy, component="bench-seed")

    def one(batch: tuple[BatchIdentity, bytes]) -> tuple[str, str]:
        result = accept_batch(actx, batch[0], batch[1])
        if result.status not in (AcceptStatus.ACCEPTED, AcceptStatus.DUPLICATE) or not result.manifest_key:
            raise RuntimeError(f"seeding history failed: {result.status}")
        index_accepted(wctx, result.manifest_key)
        index_raw_blob(wctx, result.blob_key)
        return result.manifest_key, result.blob_key

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        keys = list(pool.map(one, batches))
    return {"batches": len(batches), "seconds": round(time.perf_counter() - t0, 3),
            "manifests": [m for m, _ in keys], "blobs": [b for _, b in keys]}
