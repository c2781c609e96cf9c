"""Reaps that failed before the run, planted with the real reap tasks (no faults, no scheduling): what
the run's reaps must finish (docs/protocol.md §16 R-I6, §15 G-I8).

* :func:`plant_stopped_retention` — a retention of an expired hour that failed right after deleting
  the hour's last ``accepted-by-time`` entry: the hour is tombstoned, its prefix lists empty (S3
  lists no emptied prefix), its control-table record says ``tombstoned``. Only that record lets the
  scheduled run (no ``hour``) find it again.
* :func:`plant_failed_gc` — the race of G-I8: a GC proves an orphan; at that moment an accept of its
  identity answers 412 on the blob and creates its record; the GC places its marker, records the
  page, and fails. A record names a hidden blob, and the failed GC's ``marks#`` item waits for the
  next reap that is not a dry run, whatever its mode or shape, to settle it before it ends.

Both end as the state machine's Catch ends a failed execution: ``end`` with ``failed`` (the lease
released).
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.harness.testing.memory import MemorySystem
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.reaps import Reaper
from lightmetrics.work import crashpoints

_NS = 1_000_000_000


class _Stopped(Exception):
    """The planted execution's Lambda died here; its Catch ends the reap failed."""


def _run(system: MemorySystem, clock: Any, inp: dict[str, Any], hook: Any) -> None:
    """One execution of ``inp`` until ``hook`` stops it (as reap.asl.json routes; Waits move ``clock``)."""
    reaper = Reaper(system.ctx, system.settings)
    rng, original = random.Random(repr(inp)), uuid.uuid4  # the same owner and tokens every time
    uuid.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)  # type: ignore[assignment]
    try:
        _drive(reaper, clock, inp, hook)
    finally:
        uuid.uuid4 = original  # type: ignore[assignment]


def _drive(reaper: Reaper, clock: Any, inp: dict[str, Any], hook: Any) -> None:
    out = reaper.begin({"input": inp, "execution_arn": "planted"})
    reap = out["reap"]
    try:
        with crashpoints.hooked(hook):
            for _ in range(500):
                nxt = out["next"]
                if nxt == "finish":
                    raise AssertionError(f"the planted reap {inp} finished before its stop")
                if nxt == "ranges":
                    for item in out["ranges"]:
                        getattr(reaper, item["task"])({"reap": reap, "job": out["range_job"], "range": item})
                    nxt = "retention"
                elif nxt == "wait":
                    clock._now += int(out["wait_s"]) * _NS
                    nxt = out["after"]
                out = getattr(reaper, nxt)({"reap": reap})
    except _Stopped:
        reaper.end({"reap": reap, "outcome": "failed", "error": {"Error": "Lambda.Unknown"}})
        return
    raise AssertionError(f"the planted reap {inp} never reached its stop")


def _stop_at(point: str) -> Any:
    def hook(name: str) -> None:
        if name == point:
            raise _Stopped(name)
    return hook


def plant_stopped_retention(system: MemorySystem, clock: Any, hour: UtcHour, identity: Any, frame: Any,
                            run_at_ns: int) -> None:
    """A batch accepted in ``hour``, and its retention stopped after the hour's entries went."""
    clock._now = hour.start_unix_s * _NS + 5 * _NS
    ident = identity(70, "agent-stopped")
    result = accept_batch(system.accept, ident, frame(ident))
    index_accepted(system.ctx, result.manifest_key)
    index_raw_blob(system.ctx, result.blob_key)
    clock._now = run_at_ns
    _run(system, clock, {"mode": "retention", "dry_run": False, "hour": str(hour),
                         "concurrency": 1}, _stop_at("retention.by-time-one"))


def plant_failed_gc(system: MemorySystem, clock: Any, orphan_ns: int, identity: Any, frame: Any,
                    run_at_ns: int) -> str:
    """The race of the module docstring; returns the blob left hidden under the failed GC's mark."""
    ident = identity(71, "agent-raced")
    clock._now = orphan_ns
    system.store.fail("PutObject", "ServiceUnavailable", key_contains=system.ctx.codec.accepted_root(), times=-1)
    orphan = accept_batch(system.accept, ident, frame(ident))  # the blob lands, its record does not
    system.store.clear_faults()
    index_raw_blob(system.ctx, orphan.blob_key)
    clock._now = run_at_ns

    def hook(name: str) -> None:
        if name == "gc.proved":
            raced = accept_batch(system.accept, ident, frame(ident))  # the blob PUT answers 412
            index_accepted(system.ctx, raced.manifest_key)
        if name == "reap.page-recorded":
            raise _Stopped(name)

    _run(system, clock, {"mode": "gc", "dry_run": False, "source": "by-time",
                         "hour": str(UtcHour.of_unix_ns(orphan_ns)), "concurrency": 1}, hook)
    return str(orphan.blob_key)


__all__ = ["plant_failed_gc", "plant_stopped_retention"]
