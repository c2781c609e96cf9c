"""The accept-vs-GC race, parked at every step in both orders (issue 6, items 2 and 7).

An old orphan blob exists (a collector died between blob and manifest). An accept of that same
identity and frame (its blob PUT answers 412) races GC of the blob. Each side runs in its own
thread and is parked at one named point of the interleaving registry:

* accept (:data:`ACCEPT_POINTS`, at the store calls the accept algorithm makes): before the blob
  PUT, after it (step 4), after the manifest create (step 5), after the blob HEAD (step 6);
* GC (:data:`GC_POINTS`, crash points of lightmetrics.reaps.gc): after the proof, after the delete
  markers, after the re-check, between the settle's batches (versions purged; markers deleted), after
  the settle.

For every pair and both orders (the first side is parked, the second runs to its own point, then
the first is released to the end, then the second), the invariant is checked once both ended: the
acceptance record's blob exists — no dangling manifest, ever. The grace is 0 here, so the settle
runs at once: the handshake is correct without relying on the timing assumption.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from conftest import FAST, ident, make_frame
from reap_support import make_world

from lightmetrics.acceptance.accept import AcceptContext, accept_batch
from lightmetrics.protocol.object_store import ObjectStore
from lightmetrics.reaps import gc as gc_module
from lightmetrics.reaps.gc import BlobCollector
from lightmetrics.work import crashpoints

ACCEPT_POINTS = ("accept.before-blob-put", "accept.after-blob-put", "accept.after-manifest-put",
                 "accept.after-blob-head")
GC_POINTS = (gc_module.CP_PROVED, gc_module.CP_MARKED_ONE, gc_module.CP_RECHECKED, gc_module.CP_PURGED_VERSION,
             gc_module.CP_PURGED_MARKERS, gc_module.CP_SETTLED_ONE)
ORDERS = ("accept-first", "gc-first")
MATRIX: dict[tuple[str, str, str], str] = {}


class Park:
    """Parks the thread that reaches ``target`` until released (each point parks once)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.reached, self.release = threading.Event(), threading.Event()

    def __call__(self, name: str) -> None:
        if name == self.target and not self.reached.is_set():
            self.reached.set()
            assert self.release.wait(30), f"{name} was never released"


class ParkingStore:
    """The accept's store, reporting the accept's steps to a :class:`Park` around each call."""

    def __init__(self, inner: ObjectStore, park: Park) -> None:
        self.inner, self.park, self.bucket = inner, park, inner.bucket

    def put_if_absent(self, key: str, body: bytes, **kw: Any) -> Any:
        blob = "/raw-blobs/v1/" in "/" + key
        if blob:
            self.park("accept.before-blob-put")
        out = self.inner.put_if_absent(key, body, **kw)
        self.park("accept.after-blob-put" if blob else "accept.after-manifest-put")
        return out

    def get(self, key: str) -> Any:
        return self.inner.get(key)

    def head(self, key: str) -> Any:
        out = self.inner.head(key)
        if "/raw-blobs/v1/" in "/" + key:
            self.park("accept.after-blob-head")
        return out

    def list_keys(self, prefix: str, *, limit: int = 1000) -> list[str]:
        return self.inner.list_keys(prefix, limit=limit)


def _run_until_parked(thread: threading.Thread, park: Park) -> None:
    thread.start()
    while thread.is_alive() and not park.reached.wait(0.01):
        pass


@pytest.fixture(scope="module")
def race_world(runtime):  # type: ignore[no-untyped-def]
    from conftest import make_bucket

    return make_world(make_bucket(runtime))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("gc_point", GC_POINTS)
@pytest.mark.parametrize("accept_point", ACCEPT_POINTS)
def test_accept_and_gc_parked_at_every_step(race_world, accept_point: str, gc_point: str, order: str) -> None:  # type: ignore[no-untyped-def]
    w = race_world
    n = len(MATRIX) + 100
    identity = ident(n, agent="racer")
    blob_key = w.orphan(identity, variant=0.0)  # the same frame the accept will submit
    frame = make_frame(identity, 0.0)
    accept_park, gc_park = Park(accept_point), Park(gc_point)
    ctx = AcceptContext(store=ParkingStore(w.old.store, accept_park), codec=w.old.codec, collector_id="racer",
                        max_frame_bytes=w.settings.max_frame_bytes, clock=w.old.clock, policy=FAST)
    answers: dict[str, Any] = {}
    collector = BlobCollector(w.ctx, w.settings)

    def accept_side() -> None:
        answers["accept"] = accept_batch(ctx, identity, frame)

    def gc_side() -> None:
        [proof] = collector.prove_all([blob_key])
        if not proof.deletable:
            answers["gc"] = f"kept:{proof.reason}"
            return
        marks = collector.mark([collector.intent(proof, w.clock.now_ns())])
        answers["gc"] = collector.settle(marks)[0]

    accept_t, gc_t = threading.Thread(target=accept_side), threading.Thread(target=gc_side)
    with crashpoints.hooked(gc_park):
        first, second = ((accept_t, accept_park), (gc_t, gc_park)) if order == "accept-first" else \
            ((gc_t, gc_park), (accept_t, accept_park))
        _run_until_parked(*first)
        _run_until_parked(*second)
        first[1].release.set()
        first[0].join(30)
        second[1].release.set()
        second[0].join(30)
    collector.close()
    assert not accept_t.is_alive() and not gc_t.is_alive()
    result = answers["accept"]
    assert result.status.value in ("accepted", "duplicate"), result.to_json()
    # The invariant: the acceptance record exists and so does its blob (no dangling manifest).
    assert w.ctx.store.get(result.manifest_key) is not None
    assert w.ctx.store.head(blob_key) is not None, (accept_point, gc_point, order, answers["gc"], result.trace)
    MATRIX[(accept_point, gc_point, order)] = (
        f"{result.status.value}; gc {answers['gc']}; parked "
        f"{'A' if accept_park.reached.is_set() else '-'}{'G' if gc_park.reached.is_set() else '-'}; blob present")


def test_the_interleaving_matrix_is_complete() -> None:
    assert len(MATRIX) == len(ACCEPT_POINTS) * len(GC_POINTS) * len(ORDERS)
    for key, row in sorted(MATRIX.items()):
        print(" | ".join(key), "|", row)
