"""Where the reap's ``marks#`` items live (docs/protocol.md §15 G-I10, §17 E8): their sort keys
(a GC page's, a key range's), the marks shard a page's items go to, every partition a reader of
pending marks reads, and the keys of a recorded page. No I/O (the items themselves:
:mod:`lightmetrics.reaps.gc_marks`).

Example::

    >>> page_prefix(3, 12)
    'marks#000003#00000012#'
    >>> range_page_prefix(3, 2, 1, 12)
    'marks#000003#r0002.01#00000012#'
    >>> marks_pk(page_prefix(3, 12)), marks_pk(range_page_prefix(3, 2, 1, 12) + "000")
    ('checkpoint#reap#marks#12', 'checkpoint#reap#marks#14')
"""

from __future__ import annotations

from lightmetrics.reaps.params import CHECKPOINT_PK
from lightmetrics.reaps.state import PendingPage

MARKS_PREFIX = "marks#"
MarksKey = tuple[str, str]  # (pk, sk) of one marks item
#: Partitions the marks items are spread over (docs/protocol.md §15 G-I10): retention writes each
#: mark three times (intent, marked, settled: 2 WRU per KB each) — 6 x 172 B = 1.01 WRU a batch,
#: 10,080 WCU/s at 10,000 batches/s; 32 partitions take 315 WCU/s each, under half of one
#: partition's 1,000.
MARKS_SHARDS = 32
MARKS_PK_PREFIX = "checkpoint#reap#marks#"
#: Where the previous version kept every marks item: still read (a rolling deploy's old writer),
#: never written (docs/protocol.md §17 E8).
LEGACY_MARKS_PK = CHECKPOINT_PK


def shard_pk(shard: int) -> str:
    """The partition key of marks shard ``shard``.

    >>> shard_pk(7)
    'checkpoint#reap#marks#07'
    """
    return f"{MARKS_PK_PREFIX}{int(shard):02d}"


def marks_shard(sk: str) -> int:
    """The shard of a page's items, from its sort key (or page prefix) alone: a GC page's by its
    page number, a key range's by its range plus its page number, so one range's pages, and any
    number of ranges at once, spread over every shard alike.

    >>> marks_shard("marks#000003#00000033#001"), marks_shard("marks#000003#r0031.01#00000002#")
    (1, 1)
    """
    parts = sk.split("#")  # marks, epoch, [r<range>.<pass>,] page, part (or "" after a prefix)
    try:
        if parts[0] + "#" != MARKS_PREFIX:
            raise ValueError(sk)
        if parts[2].startswith("r"):
            r, page = int(parts[2][1:].partition(".")[0]), int(parts[3])
        else:
            r, page = 0, int(parts[2])
    except (IndexError, ValueError):
        raise ValueError(f"not a marks item's sort key: {sk!r}") from None
    return (r + page) % MARKS_SHARDS


def marks_pk(sk: str) -> str:
    """The partition key this version writes the item ``sk`` (or a page prefix's items) under."""
    return shard_pk(marks_shard(sk))


def marks_pks() -> tuple[str, ...]:
    """Every partition a marks item may be under: the shards, then the previous version's."""
    return (*(shard_pk(i) for i in range(MARKS_SHARDS)), LEGACY_MARKS_PK)


def pending_keys(page: PendingPage) -> list[MarksKey]:
    """The keys of a recorded page's items: under its shard, or where the previous version put them.

    >>> pending_keys(PendingPage("marks#000001#r0001.01#00000002#", 1, 0, sharded=False))
    [('checkpoint#reap', 'marks#000001#r0001.01#00000002#000')]
    """
    pk = marks_pk(page.prefix) if page.sharded else LEGACY_MARKS_PK
    return [(pk, sk) for sk in page.sks()]


def page_prefix(epoch: int, page: int) -> str:
    """The sort-key prefix of page ``page``'s items in reap epoch ``epoch``."""
    # The epoch keeps a new reap's pages apart from marks a crashed older epoch left to settle.
    return f"{MARKS_PREFIX}{int(epoch):06d}#{page:08d}#"


def range_page_prefix(epoch: int, r: int, passes: int, page: int) -> str:
    """The sort-key prefix of page ``page`` of key range ``r`` in pass ``passes`` over an hour."""
    return f"{MARKS_PREFIX}{int(epoch):06d}#r{int(r):04d}.{int(passes):02d}#{int(page):08d}#"


def page_of(sk: str) -> str:
    """The page prefix of an item's sort key (its part number cut off)."""
    return sk[:sk.rfind("#") + 1]


__all__ = ["LEGACY_MARKS_PK", "MARKS_PK_PREFIX", "MARKS_PREFIX", "MARKS_SHARDS", "MarksKey", "marks_pk", "marks_pks",
           "marks_shard", "page_of", "page_prefix", "pending_keys", "range_page_prefix", "shard_pk"]
