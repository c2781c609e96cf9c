"""The one lease implementation (lightmetrics.work.leases): take, renew, release and the fence, on moto's
DynamoDB, with real threads racing for one lease."""

from __future__ import annotations

import threading
import uuid
from decimal import Decimal
from typing import Any

import pytest
from reap_support import make_table, session

from lightmetrics.aws.control_table import ControlTable
from lightmetrics.jobs.kernel import Lease
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.control_store import Op, TransactionCancelled
from lightmetrics.work.leases import (
    Fence,
    Holder,
    LeaseHeld,
    LeaseItem,
    LeaseLost,
    lease_pk,
    lease_rule_broken,
    read,
    release,
    renewal,
    take,
)

_NS = 1_000_000_000
PK = lease_pk("test")


@pytest.fixture
def table(runtime: Any) -> ControlTable:
    name = f"leases-{uuid.uuid4().hex[:8]}"
    make_table(name)
    return ControlTable(session().client("dynamodb"), name)


def _take(table: ControlTable, owner: str, now_ns: int, lease_s: int = 60, **kw: Any) -> LeaseItem:
    return take(table, PK, read(table, PK), owner=owner, lease_seconds=lease_s, now_ns=now_ns, what="test", **kw)


def test_a_take_needs_the_lease_absent_or_expired_and_each_take_is_a_new_epoch(table: ControlTable) -> None:
    first = _take(table, "a", 0)
    assert (first.epoch, first.version) == (1, 1)
    with pytest.raises(LeaseHeld, match="held by epoch 1"):
        _take(table, "b", 30 * _NS)
    second = _take(table, "b", 61 * _NS)  # expired
    assert (second.epoch, second.owner) == (2, "b")
    # the old holder's renewal and release change nothing any more
    with pytest.raises(Exception):
        renewal(PK, "a", 1, 60, 62 * _NS).apply(table)
    with pytest.raises(Exception):
        release(PK, "a", 1, 62 * _NS).apply(table)
    assert table.get(PK, "lease")["owner"] == "b"


def test_a_renewal_between_the_read_and_the_take_keeps_the_lease_held(table: ControlTable) -> None:
    _take(table, "a", 0)
    stale = read(table, PK)  # read while it looked expired to a slow taker
    renewal(PK, "a", 1, 60, 59 * _NS).apply(table)  # the holder renews just in time
    with pytest.raises(LeaseHeld):
        take(table, PK, stale, owner="b", lease_seconds=60, now_ns=61 * _NS, what="test")


def test_a_released_lease_is_never_renewed_and_is_free_to_take_at_once(table: ControlTable) -> None:
    _take(table, "a", 0)
    release(PK, "a", 1, 5 * _NS).apply(table)
    with pytest.raises(Exception):
        renewal(PK, "a", 1, 60, 6 * _NS).apply(table)
    assert _take(table, "b", 6 * _NS).epoch == 2


def test_of_many_threads_taking_an_expired_lease_exactly_one_wins(table: ControlTable) -> None:
    _take(table, "old", 0)
    stale = read(table, PK)
    won: list[LeaseItem] = []
    held: list[int] = []
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        barrier.wait()
        try:
            won.append(take(table, PK, stale, owner=f"t{i}", lease_seconds=60, now_ns=100 * _NS, what="test"))
        except LeaseHeld:
            held.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(held) == 7
    assert table.get(PK, "lease")["owner"] == won[0].owner and won[0].epoch == 2


def test_a_resume_keeps_its_epoch_and_an_item_without_a_version_can_be_taken(table: ControlTable) -> None:
    table.put({"pk": PK, "sk": "lease", "owner": "legacy", "epoch": 4, "expires_at_ns": 0})
    assert _take(table, "a", 10 * _NS, epoch=4).epoch == 4
    release(PK, "a", 4, 11 * _NS).apply(table)
    assert _take(table, "b", 12 * _NS).epoch == 5


def test_the_fence_renews_at_most_once_an_interval_and_stops_a_holder_that_lost(table: ControlTable) -> None:
    clock = FrozenClock(0)
    _take(table, "a", 0)
    fence = Fence(table, PK, Holder("a", 1, 60), clock)
    fence()
    assert table.get(PK, "lease")["expires_at_ns"] == 60 * _NS
    clock.advance(5)
    fence()  # inside the interval: no write
    assert table.get(PK, "lease")["expires_at_ns"] == 60 * _NS
    release(PK, "a", 1, 6 * _NS).apply(table)
    with pytest.raises(LeaseLost, match="no longer owns"):
        fence.renew()


def test_a_renewal_guards_a_transaction_as_one_of_its_operations(table: ControlTable) -> None:
    _take(table, "a", 0)
    table.put({"pk": "checkpoint#test", "sk": "current", "n": 0})
    bump = Op("Update", "checkpoint#test", "current", "SET #n = :n", {"#n": "n"}, {":n": 1})
    table.transact([renewal(PK, "a", 1, 60, 1 * _NS), bump])
    assert table.get("checkpoint#test", "current")["n"] == 1
    with pytest.raises(TransactionCancelled) as lost:
        table.transact([renewal(PK, "b", 1, 60, 2 * _NS), Op("Update", "checkpoint#test", "current", "SET #n = :n",
                                                             {"#n": "n"}, {":n": 2})])
    assert lost.value.failed == [True, False] and table.get("checkpoint#test", "current")["n"] == 1


def test_the_process_lease_and_rule_l1(table: ControlTable) -> None:
    clock = FrozenClock(0)
    a = Lease(table, "test", "a", clock, 120).acquire()
    with pytest.raises(LeaseHeld):
        Lease(table, "test", "b", clock, 120).acquire()
    a.renew()
    a.release()
    b = Lease(table, "test", "b", clock, 120).acquire()
    assert b.epoch == 2
    with pytest.raises(LeaseLost):
        a.renew()
    assert lease_rule_broken(100, 60, "a step", "lease_s") is not None
    assert lease_rule_broken(120, 60, "a step", "lease_s") is None


def test_the_typed_lease_item_is_the_stored_item(table: ControlTable) -> None:
    """The control-store boundary: a lease read and written back is the item as stored, attribute for
    attribute (a take's, a released one's, a legacy one's without a version)."""
    _take(table, "a", 0, execution="arn:exec-1", scope="gc")
    taken = table.get(PK, "lease")
    assert LeaseItem.from_item(taken).to_item() == {k: int(v) if isinstance(v, Decimal) else v for k, v in taken.items()}
    release(PK, "a", 1, 5 * _NS).apply(table)
    released = read(table, PK)
    assert released is not None and released.released and released.released_at_ns == 5 * _NS
    assert (released.execution, released.scope, released.checkpoint_pk) == ("arn:exec-1", "gc", None)
    legacy = {"pk": PK, "sk": "lease", "owner": "legacy", "epoch": 4, "expires_at_ns": 0, "note": "kept"}
    assert LeaseItem.from_item(legacy).to_item() == legacy
    assert LeaseItem.from_item(legacy).version is None
