"""The cost contract (docs/protocol.md §8): exact S3 requests per accept, flat as history grows.

History is grown in one bucket from 10 to 100 to 1,000 accepted batches; at each depth a new,
a duplicate and two conflicting submissions are measured with the botocore request counter.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from conftest import ident, make_frame

from lightmetrics.acceptance.accept import AcceptStatus, accept_batch

DEPTHS = (10, 100, 1000)

EXPECTED = {
    # operation: (total, by API)
    "new": (2, {"s3.PutObject": 2}),
    "duplicate": (4, {"s3.PutObject": 2, "s3.GetObject": 1, "s3.HeadObject": 1}),
    # blob is new: 2 PUTs, GET, quarantine PUT, HEAD of the resolution record
    "conflict": (5, {"s3.PutObject": 3, "s3.GetObject": 1, "s3.HeadObject": 1}),
    # the conflicting blob was submitted before: + HEAD of the pre-existing blob
    "conflict_again": (6, {"s3.PutObject": 3, "s3.GetObject": 1, "s3.HeadObject": 2}),
}


def _grow(ctx, start: int, stop: int) -> None:  # type: ignore[no-untyped-def]
    def one(n: int) -> AcceptStatus:
        return accept_batch(ctx, ident(n, agent="history"), make_frame(ident(n, agent="history"))).status

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(one, range(start, stop))) == {AcceptStatus.ACCEPTED}


def test_request_counts_are_exact_and_flat_across_history(ctx, counter):  # type: ignore[no-untyped-def]
    measured: dict[int, dict[str, tuple[int, dict[str, int]]]] = {}
    have = 0
    for depth in DEPTHS:
        _grow(ctx, have, depth)
        have = depth
        i = ident(depth, agent="probe")
        row = {}
        for name, frame, status in (
            ("new", make_frame(i), AcceptStatus.ACCEPTED),
            ("duplicate", make_frame(i), AcceptStatus.DUPLICATE),
            ("conflict", make_frame(i, variant=9.0), AcceptStatus.IDENTITY_CONFLICT),
            ("conflict_again", make_frame(i, variant=9.0), AcceptStatus.IDENTITY_CONFLICT),
        ):
            with counter.operation(name) as op:
                assert accept_batch(ctx, i, frame).status is status
            row[name] = (op.total, dict(op.by_api))
        measured[depth] = row
    for depth in DEPTHS:
        assert measured[depth] == EXPECTED, f"at history depth {depth}"
    listed = ctx.store.list_keys("accepted/v1/agent=" + "history".encode().hex() + "/", limit=5000)
    assert len(listed) == DEPTHS[-1]
