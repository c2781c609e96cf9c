"""The simulation's checks, read straight from the in-memory adapters (no request, no fault).

:func:`safety` states the rules: no identity acknowledged with two hashes; every acknowledged
batch has its record with that hash and its blob; no blob a record names is gone for good (an
expired, tombstoned hour's are retention's to delete); none is hidden while no reap runs.
:class:`SafetyWatch` applies them after every step to what the step changed (the keys the in-memory
store reports changed, the new acknowledgements, a reap starting or ending) and calls :func:`safety`
for the findings only when one of them fails: the same verdict at every step for a fraction of the time.
:func:`quiescence` runs once every job has run to completion with faults off: the invariant
catalogue through ``verify`` (strict), and liveness — no blocker open, the reap lease released,
the expired hour reaped. A record a newer writer wrote (planted, :mod:`~lightmetrics.harness.sim.world`)
must keep its blob like any other, and is expected to stay blocked.
"""

from __future__ import annotations

from typing import Any

from lightmetrics.harness.sim.reap_world import awaiting_settle, reap_liveness
from lightmetrics.harness.sim.world import Ack, World
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.keys import UtcHour
from lightmetrics.protocol.manifests import parse_record
from lightmetrics.reaps.params import LEASE_PK
from lightmetrics.work import leases


def _blob_state(world: World, blob_key: str) -> str:
    """``present``, ``hidden`` (only delete markers on top of a version) or ``gone``."""
    versions = world.system.store._keys.get(blob_key) or []
    if versions and not versions[-1].marker:
        return "present"
    return "hidden" if any(not v.marker for v in versions) else "gone"


def _tombstoned(world: World, accepted_at_ns: int) -> bool:
    hour = UtcHour.of_unix_ns(accepted_at_ns)
    if hour not in world.tombstoned:  # a tombstone is permanent: "yes" is kept
        if world.system.store._current(world.system.ctx.codec.retention_tombstone("raw", hour)) is None:
            return False
        world.tombstoned.add(hour)
    return True


def _record(world: World, key: str) -> Any:
    current = world.system.store._current(key)
    if current is None:
        return None
    cached = world.parsed.get(key)  # a version is immutable: parse it once (the checks run every step)
    if cached is not None and cached[0] == current.version_id:
        return cached[1]
    try:
        record = parse_record(world.system.ctx.codec, key, current.body or b"")
    except Exception:  # noqa: BLE001 - an unreadable record is verify's finding, not a crash of the check
        record = None
    world.parsed[key] = (current.version_id, record)
    return record


def safety(world: World, *, reap_running: bool) -> list[str]:
    found: list[str] = []
    codec = world.system.ctx.codec
    acked: dict[str, str] = {}
    for ack in world.acks:
        mid = ack.identity.manifest_id
        if acked.setdefault(mid, ack.frame_sha256) != ack.frame_sha256:
            found.append(f"identity accepted twice: {mid} acknowledged as {acked[mid]} and {ack.frame_sha256}")
        record = _record(world, codec.accepted(ack.identity))
        if record is None:
            found.append(f"acknowledged batch without its record: {mid} ({ack.actor})")
        elif record.frame_sha256 != ack.frame_sha256:
            found.append(f"acknowledged batch's record holds another hash: {mid}")
    for key, blob_key in world.newer_records.items():  # no reader may take it for "no record"
        state = _blob_state(world, blob_key)
        if state == "gone" or (state == "hidden" and not reap_running):
            found.append(f"blob a newer writer's record names {state}: {blob_key} (record {key})")
    for key in world.system.store.keys(codec.accepted_root()):
        record = _record(world, key)
        if record is None:
            continue
        state = _blob_state(world, record.raw_blob_key)  # present, mostly: the tombstone is read only if not
        if state == "present" or _tombstoned(world, record.accepted_at_unix_ns):
            continue
        if state == "gone":
            found.append(f"blob a record names deleted: {record.raw_blob_key} (record {key})")
        elif state == "hidden" and not reap_running and not awaiting_settle(world, record.raw_blob_key):
            found.append(f"blob a record names left hidden with no reap running: {record.raw_blob_key}")
    return found


class SafetyWatch:
    """:func:`safety` after every step, incrementally. A rule can only start failing where the step
    changed something: a key's versions (a record, a blob, a tombstone), an acknowledgement, or the
    reaps' running state; each is re-checked on that change, and the whole of :func:`safety` then
    gives the findings (so a false alarm costs time, never a verdict). A rule added to :func:`safety`
    needs its trigger here; until it has one, the whole check every ``FULL_EVERY`` steps still finds
    its violation, a few steps late (tests/test_sim.py holds the two to the same verdict at every step)."""

    FULL_EVERY = 100

    def __init__(self, world: World) -> None:
        self.world, self.codec = world, world.system.ctx.codec
        self.root = self.codec.accepted_root()
        self.changes: list[str] = []
        self.acks_seen = 0
        self.acked: dict[str, str] = {}
        self.acks_by_key: dict[str, list[Ack]] = {}
        self.blob_of: dict[str, str] = {}  # record key -> the blob it names (records that parse)
        self.records_of: dict[str, dict[str, None]] = {}  # blob key -> the records naming it
        self.newer = {blob: key for key, blob in world.newer_records.items()}
        self.running: bool | None = None
        self.checks = 0
        for key in world.system.store.keys(self.root):
            self._index(key)
        world.system.store.on_change = self.changes.append

    def _index(self, key: str) -> None:
        old = self.blob_of.pop(key, None)
        if old is not None:
            self.records_of[old].pop(key, None)
        record = _record(self.world, key)
        if record is not None:
            self.blob_of[key] = record.raw_blob_key
            self.records_of.setdefault(record.raw_blob_key, {})[key] = None

    def _record_ok(self, key: str) -> bool:
        record = _record(self.world, key)
        if record is None or _tombstoned(self.world, record.accepted_at_unix_ns):
            return True
        return self._blob_ok(record.raw_blob_key)

    def _blob_ok(self, blob_key: str) -> bool:
        state = _blob_state(self.world, blob_key)
        return state == "present" or (state == "hidden" and bool(self.running))

    def _ack_ok(self, ack: Ack) -> bool:
        record = _record(self.world, self.codec.accepted(ack.identity))
        return record is not None and record.frame_sha256 == ack.frame_sha256

    def check(self, *, reap_running: bool) -> list[str]:
        ok = True
        for ack in self.world.acks[self.acks_seen:]:
            mid = ack.identity.manifest_id
            ok &= self.acked.setdefault(mid, ack.frame_sha256) == ack.frame_sha256 and self._ack_ok(ack)
            self.acks_by_key.setdefault(self.codec.accepted(ack.identity), []).append(ack)
        self.acks_seen = len(self.world.acks)
        n = len(self.changes)
        changed = list(dict.fromkeys(self.changes[:n]))
        del self.changes[:n]
        for key in changed:
            if key.startswith(self.root):
                self._index(key)
        if reap_running != self.running:  # a reap ended: every hidden blob counts now
            self.running = reap_running
            changed = list(self.blob_of) + list(self.newer) + changed
        for key in changed:
            if key.startswith(self.root):
                ok &= self._record_ok(key) and all(self._ack_ok(a) for a in self.acks_by_key.get(key, ()))
            ok &= all(self._record_ok(r) for r in self.records_of.get(key, ()))
            ok &= key not in self.newer or self._blob_ok(key)
        self.checks += 1
        if ok and self.checks % self.FULL_EVERY:
            return []
        return safety(self.world, reap_running=reap_running)


def quiescence(world: World) -> list[str]:
    found = safety(world, reap_running=False)
    ctx = world.system.ctx
    report = verify(ctx, strict=True, workers=1)
    # A newer writer's record is the operator's to act on (upgrade the readers, §17 E2): its
    # unsupported-version finding and its blocker are the protocol's answer, not a defect.
    expected = set(world.newer_records)
    found += [f"verify: {v.rule} {' '.join(v.keys)}" for v in report.violations if not expected & set(v.keys)]
    found += [f"liveness: blocker left open: {b.kind} {b.object_key}" for b in ctx.blockers.list(status="open")
              if b.object_key not in expected]
    lease = leases.read(ctx.table, LEASE_PK)
    if leases.is_live(lease, world.clock.now_ns()):
        found.append(f"liveness: the reap lease is held after every reap ended: {lease}")
    return found + reap_liveness(world, world.reaps)


__all__ = ["SafetyWatch", "quiescence", "safety"]
