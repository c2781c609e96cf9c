"""The simulation's audit actor (issue 24: "the audit's confirmation step where it touches storage"):
the Spark stages it models select exactly the rows the real ones do, and from there it runs the
pipeline's own confirmation through the world's store.

* **Contract.** ``harness/sim/audit_inventory.InventoryView`` models the audit's classification and
  candidate joins over S3's listing. The real ``classify`` + ``candidate_rows`` run in Spark over the
  same listing as an inventory, in a world holding every kind of candidate; the two row sets agree.
* **Real confirmation.** The actor's findings come from ``audit.confirm.confirm`` reading through
  the ``S3Access`` it carries (``object_store``): the newer writer's record is unreadable unless the
  image is upgraded, and a missing entry is found.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.derived.indexing import index_accepted, index_quarantine, index_raw_blob
from lightmetrics.harness.sim.audit_actor import confirmed_findings, watermark_inputs
from lightmetrics.harness.sim.audit_inventory import InventoryView
from lightmetrics.harness.sim.world import World, build_world, frame, identity
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import parse_record
from lightmetrics_pipeline.audit.confirm import CANDIDATE_COLUMNS

_NS = 1_000_000_000


def _gone(world: World, key: str) -> None:
    store = world.system.store
    store.delete_objects([(key, v.version_id) for v in store.versions_of(key)])


def _world_with_every_candidate() -> World:
    """The planted world (orphans past the horizon, the newer writer's record, tombstoned hours, a
    stray key) and, accepted now through the real code, one source of every other candidate kind."""
    world = build_world(1, fault_rate=0.0, max_steps=1)
    ctx, accept, codec = world.system.ctx, world.system.accept, world.system.ctx.codec
    results = {n: accept_batch(accept, identity(n, "agent-z"), frame(identity(n, "agent-z"))) for n in range(1, 7)}
    for n in (2, 3, 4, 5):  # indexed in full
        index_accepted(ctx, str(results[n].manifest_key))
        index_raw_blob(ctx, str(results[n].blob_key))
    # 1: no entry at all; 2: its blob gone (integrity); 3: its raw-blobs-by-time entry gone;
    # 4: its record gone (its entries have no source); 5: fine; 6: its accepted-by-blob only
    _gone(world, str(results[2].blob_key))
    blob3 = world.system.store.head(str(results[3].blob_key))
    assert blob3 is not None
    _gone(world, codec.raw_blobs_by_time(UtcHour((int(blob3.last_modified_unix_s) // 3600) * 3600),
                                         codec.parse(str(results[3].blob_key)).sha256 or ""))
    _gone(world, str(results[4].manifest_key))
    key6 = str(results[6].manifest_key)
    index_accepted(ctx, key6)
    m6 = parse_record(codec, key6, world.system.store.get(key6) or b"")
    _gone(world, codec.accepted_by_time(UtcHour.of_unix_ns(m6.accepted_at_unix_ns), m6.identity))
    # a range overlapping record 5's, of the same boot
    overlapping = BatchIdentity.create("agent-z", "boot-1", 55, 64)
    accept_batch(accept, overlapping, frame(overlapping))
    # two conflicts: one not indexed, one indexed whose quarantine manifest is then gone
    q1 = accept_batch(accept, identity(5, "agent-z"), frame(identity(5, "agent-z"), variant=1.0))
    q2 = accept_batch(accept, identity(3, "agent-z"), frame(identity(3, "agent-z"), variant=1.0))
    assert q1.quarantine_key and q2.quarantine_key
    index_quarantine(ctx, q2.quarantine_key)
    _gone(world, q2.quarantine_key)
    return world


def _as_inventory(spark: Any, view: InventoryView) -> Any:
    rows = [(k, 0, datetime.fromtimestamp(lm // _NS, tz=timezone.utc), True, False) for k, lm in view.listed.items()]
    return spark.createDataFrame(rows, "key string, size long, last_modified_date timestamp, is_latest boolean, "
                                       "is_delete_marker boolean")


def _normal(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row compared by value: sequence numbers as numbers (Spark spells them zero-padded)."""
    return tuple(int(row[c]) if c in ("s", "e") and row[c] is not None else row[c] for c in CANDIDATE_COLUMNS)


def test_the_modelled_spark_stages_select_exactly_the_real_candidate_rows(spark: Any) -> None:
    from lightmetrics_pipeline.audit.candidates import candidate_rows
    from lightmetrics_pipeline.audit.classify import classify

    world = _world_with_every_candidate()
    view = InventoryView(world)
    horizon_before_s = world.clock.now_ns() // _NS - world.system.settings.retry_horizon_s
    model = view.candidates(horizon_before_s)
    ns = world.system.ctx.codec.prefix
    cached: list[Any] = []
    cl = classify(_as_inventory(spark, view), ns).select("kind", "key", "lm", "valid", "sha", "mid", "hour_s")
    real = [r.asDict() for r in candidate_rows(cl.where("valid"), ns, horizon_before_s, cached).collect()]
    for df in cached:
        df.unpersist()
    assert sorted(map(_normal, model), key=repr) == sorted(map(_normal, real), key=repr)
    # every query has rows here, so the agreement covers each of them
    assert {r["check"] for r in model} == {"manifest", "quarantine", "derived", "orphan", "overlap"}
    assert {c for r in model if r["check"] == "manifest" for c in r["cand"].split(",")} == {"repair", "integrity"}
    assert {r["entry_kind"] for r in model if r["check"] == "derived"} == {
        "accepted-by-time", "accepted-by-blob", "raw-blobs-by-time", "quarantine-by-blob"}


def test_the_actor_confirms_through_the_pipelines_checks_over_the_worlds_store() -> None:
    world = _world_with_every_candidate()
    horizon_before_s = world.clock.now_ns() // _NS - world.system.settings.retry_horizon_s
    rows = InventoryView(world).candidates(horizon_before_s)
    calls_before = world.scheduler.calls
    missing, unreadable = watermark_inputs(confirmed_findings(world, rows, horizon_before_s))
    assert unreadable == {"unsupported-version": 1}  # the newer writer's record
    assert world.scheduler.calls > calls_before + len(rows)  # each read went through the world's store
    up_missing, up_unreadable = watermark_inputs(confirmed_findings(world, rows, horizon_before_s, upgraded=True))
    assert up_unreadable == {}
    # the upgraded image reads it: its two missing entries join the others'
    assert up_missing["accepted-by-time"] == missing["accepted-by-time"] + 1
    assert up_missing["accepted-by-blob"] == missing["accepted-by-blob"] + 1
    assert missing["raw-blobs-by-time"] >= 1 and missing["quarantine-by-blob"] == 1


def test_an_access_carrying_an_object_store_reaches_the_bucket_through_it_only() -> None:
    from lightmetrics.harness.testing.memory import InMemoryObjectStore
    from lightmetrics_pipeline import s3io

    memory = InMemoryObjectStore("lm-memory")
    access = s3io.S3Access(bucket="lm-memory", object_store=memory, endpoint_url="http://127.0.0.1:9")  # no server
    assert s3io.put_if_absent(access, "k", b"v") == "created" and s3io.put_if_absent(access, "k", b"w") == "exists"
    assert s3io.store(access) is memory and s3io.store(access.with_bucket("other")) is memory
    assert memory.get("k") == b"v" and s3io.list_all(access, "")[0] == [("k", 1)]
    # a value: the store it carries takes no part in equality or hashing (clients are cached by access)
    plain = s3io.S3Access(bucket="lm-memory", endpoint_url="http://127.0.0.1:9")
    assert access == plain and hash(access) == hash(plain) and "object_store" not in repr(access)
