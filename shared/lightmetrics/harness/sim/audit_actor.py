"""The inventory audit's confirmation and watermark step (docs/protocol.md §13 W6) as an actor.

``audit#i`` models the Spark job around the real code that touches the control table: the inventory
is S3's own listing of the in-memory bucket (no request), its ``creationTimestamp`` now or up to an
hour back (an older report re-run: it proves less); every acceptance record and quarantine manifest
it shows without one of its entries is a candidate, confirmed live with a HEAD of the entry (through
the fault-injecting store: a failed read fails the job, which commits nothing). A record the job
cannot read (the newer writer's) is unreadable unless the pipeline's image was upgraded too (then it
reads it and its missing entries are findings). Then the real :func:`plan_watermarks` and, once the
summary is committed, :func:`apply_watermarks` on the world's table (a crash there moves nothing more).

Checks (:class:`AuditWatch`): W3/W6 — a watermark only moves forward (after every step that updated
one); W6 — an audit proves no index for which it confirmed a finding, none at all when it could not
read a candidate, and once its apply answered, each proved index's W is at least what it proved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.derived.walk import INDEXES
from lightmetrics.derived.walk.state import watermark_pk
from lightmetrics.harness.sim.scheduler import Actor, SimCrash
from lightmetrics.harness.sim.world import World
from lightmetrics.operator_tools.audit_watermarks import apply_watermarks, plan_watermarks
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.protocol.manifests import IdentityConflictManifest, parse_record

_NS = 1_000_000_000


@dataclass
class AuditWatch:
    world: World
    seen: int = 0
    w: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._read(flag=False)

    def _read(self, *, flag: bool = True) -> None:
        for index in INDEXES:
            item = self.world.system.table._items.get((watermark_pk(index), "current"))
            if item is None or "w_ns" not in item:
                continue
            w, before = int(item["w_ns"]), self.w.get(index)
            if flag and before is not None and w < before:
                self.world.scheduler.flag(f"W3/W6: watermark#{index} moved backward: {before} -> {w} "
                                          f"(set by {item.get('set_by')})")
            self.w[index] = max(w, before or w)

    def step(self) -> None:
        lines = self.world.scheduler.trace[self.seen:]
        self.seen = len(self.world.scheduler.trace)
        if any(" UpdateItem watermark#" in line for line in lines):
            self._read()


def _entries(world: World, at_ns: int, ident: BatchIdentity, sha: str) -> dict[str, str]:
    codec = world.system.ctx.codec
    hour = UtcHour.of_unix_ns(at_ns)
    return {"accepted-by-time": codec.accepted_by_time(hour, ident), "accepted-by-blob": codec.accepted_by_blob(sha, ident)}


def candidates(world: World, upgraded: bool) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The inventory's candidates ``(index, entry key to confirm)`` and its unreadable records."""
    store, codec = world.system.store, world.system.ctx.codec
    listed = set(store.keys(codec.prefix))
    raw_shas = {codec.parse(k).sha256 for k in listed if k.startswith(codec.root(KeyKind.RAW_BLOBS_BY_TIME))}
    found: list[tuple[str, str]] = []
    unreadable = 0
    for key in sorted(k for k in listed if k.startswith(codec.accepted_root())):
        body = store.get(key) or b""
        try:
            m = parse_record(codec, key, body)
            at_ns, ident, sha, blob = m.accepted_at_unix_ns, m.identity, m.frame_sha256, m.raw_blob_key
        except Exception:  # noqa: BLE001 - a newer writer's record (or an invalid one)
            if not upgraded:
                unreadable += 1
                continue
            doc = json.loads(body)
            at_ns, sha, blob = int(doc["accepted_at_unix_ns"]), doc["frame_sha256"], doc["raw_blob_key"]
            ident = BatchIdentity.create(doc["agent_id"], doc["boot_id"], doc["seq_start"], doc["seq_end"])
        if codec.retention_tombstone("raw", UtcHour.of_unix_ns(at_ns)) in listed:
            continue  # an expired, reaped hour: nothing is indexed under a tombstone
        found += [(index, entry) for index, entry in _entries(world, at_ns, ident, sha).items() if entry not in listed]
        if sha not in raw_shas and blob in listed:
            found.append(("raw-blobs-by-time", blob))  # confirmed by HEAD of the blob and a fresh listing
    for key in sorted(k for k in listed if k.startswith(codec.quarantine_root())):
        q = IdentityConflictManifest.from_bytes(store.get(key) or b"")
        entry = codec.quarantine_by_blob(q.submitted_frame_sha256, q.identity)
        if entry not in listed:
            found.append(("quarantine-by-blob", entry))
    return found, {"unsupported-version": unreadable} if unreadable else {}


def _confirm(world: World, index: str, key: str) -> bool:
    """Still missing (a HEAD through the world's store; raises if the read fails)."""
    head = world.store.head(key)
    if index != "raw-blobs-by-time":
        return head is None
    codec = world.system.ctx.codec
    sha = codec.parse(key).sha256
    return head is not None and not any(codec.parse(k).sha256 == sha for k in
                                        world.system.store.keys(codec.root(KeyKind.RAW_BLOBS_BY_TIME)))


def audit(world: World, watch: AuditWatch, n: int, *, delay: int = 15) -> Any:
    rng = world.rng
    upgraded, back_s = rng.random() < 0.5, rng.choice((0, 600, 1800, 5400))  # an older report re-run: 5400
    wait = rng.randrange(delay) if delay else 0

    def body(actor: Actor) -> None:
        for _ in range(wait):
            world.scheduler.pause("Schedule")
        actor.crashed = False
        created_ns = world.clock.now_ns() - back_s * _NS
        found, unreadable = candidates(world, upgraded)
        missing: dict[str, int] = {}
        try:
            for index, key in found:
                if _confirm(world, index, key):
                    missing[index] = missing.get(index, 0) + 1
        except (SimCrash, Exception) as exc:  # noqa: BLE001 - the job failed: it commits nothing
            world.scheduler.note(f"audit {n} failed before its commit: {type(exc).__name__}")
            return
        plan = plan_watermarks({"creation_timestamp_ms": created_ns // 1_000_000},
                               world.system.settings.settle_s, missing, unreadable)
        world.scheduler.note(f"audit {n} committed: proved {sorted(plan['proved'])} withheld {sorted(plan['withheld'])}")
        bad = sorted(i for i in plan["proved"] if missing.get(i) or unreadable)
        if bad:
            world.scheduler.flag(f"W6: audit {n} proved {bad} with confirmed findings {missing} / unreadable {unreadable}")
        try:
            moved = apply_watermarks(world.table, plan, now_ns=world.clock_for(0).now_ns(), run_id=f"sim-{n}")
        except (SimCrash, Exception) as exc:  # noqa: BLE001 - a crash after the commit: the next audit moves them
            world.scheduler.note(f"audit {n} apply failed: {type(exc).__name__}")
            return
        world.scheduler.note(f"audit {n} moved {moved}")
        watch._read()
        items = world.system.table._items
        low = [i for i, w in plan["proved"].items() if int(items[(watermark_pk(i), "current")]["w_ns"]) < int(w)]
        if low:
            world.scheduler.flag(f"W6: audit {n}'s apply answered but {low} stayed below what it proved")
    return body


__all__ = ["AuditWatch", "audit", "candidates"]
