"""A GC page's ``marks#`` items: one page's intents or marks, split under DynamoDB's item size limit.

A mark (:class:`Mark`) and an item (:class:`MarksItem`) are typed records, converted to and from
the stored form here, at the control-store boundary; the stored form is compact (rule G-I7) and
unchanged by the conversion.

Each marked page has its own items ``checkpoint#reap#marks#<shard>``/``marks#<epoch>#<page>#<part>``
(written *before* its delete markers, state ``intent``, then ``marked``; deleted once settled), as
many parts as keep each item under :data:`MARKS_ITEM_MAX_BYTES` (rule G-I6). The epoch keeps a new
reap's pages apart from marks a crashed older epoch left to settle. A key range of an hour reaped in
parallel (:mod:`lightmetrics.reaps.retention_ranges`) has its own pages: ``marks#<epoch>#r<range>.<pass>#<page>#<part>``,
so two range tasks never write one item. The shard (:func:`marks_shard`) is a function of the page
alone, so the page's writers and its settle find its items by key; a reader of every pending mark
reads the :data:`MARKS_SHARDS` partitions and the previous version's ``checkpoint#reap``
(:data:`LEGACY_MARKS_PK`, docs/protocol.md §17 E8): :func:`read_marks_items`. The keys:
:mod:`lightmetrics.reaps.marks_keys`.

Example::

    >>> [len(p) for p in split_marks([{"s": "x"}] * 3, {}, budget=89)]
    [2, 1]
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from lightmetrics.protocol.control_store import ControlStore, Op, counts_of, optional, plain
from lightmetrics.protocol.identity import BatchIdentity, hex_to_id
from lightmetrics.reaps.gc_proof import DELETE_CONFLICT_RESOLVED, DELETE_HOUR_TOMBSTONED, DELETE_UNREFERENCED
from lightmetrics.reaps.marks_keys import (
    LEGACY_MARKS_PK,
    MARKS_PK_PREFIX,
    MARKS_PREFIX,
    MARKS_SHARDS,
    MarksKey,
    marks_pk,
    marks_pks,
    marks_shard,
    page_of,
    page_prefix,
    pending_keys,
    range_page_prefix,
    shard_pk,
)
from lightmetrics.reaps.state import MarkState, PageOutcome
from lightmetrics.work.pool import map_in_context

# -- the stored form of a mark (rule G-I7): short names, string values, nothing derivable -------------
_REASON_CODES = {DELETE_UNREFERENCED: "u", DELETE_HOUR_TOMBSTONED: "t", DELETE_CONFLICT_RESOLVED: "c"}
_REASONS = {v: k for k, v in _REASON_CODES.items()}


@dataclass(frozen=True)
class Mark:
    """One blob on its way through the delete-marker handshake, as the collector uses it
    (:meth:`~lightmetrics.reaps.gc.BlobCollector.intent`): its key and hash, the version captured by
    the proof (purged later), the delete marker's version once placed, when it was marked, the
    blob's ``LastModified``, the proof's reason, and what the settle re-checks — the record's
    tombstoned hour (rule G-R1) or else the batch identity. Stored compactly (:meth:`stored`).

    >>> m = Mark("lm/raw-blobs/v1/ab", "ab", "v1", None, 5, 7200, "hour-tombstoned", record_hour="1970-01-01T02")
    >>> m.stored()
    {'s': 'ab', 't': '2', 'r': 't', 'v': 'v1', 'h': '1970-01-01T02'}
    >>> m.placed("m1").marker_version_id
    'm1'
    """

    key: str
    sha: str
    version_id: str | None
    marker_version_id: str | None
    marked_at_ns: int
    lm_unix_s: int
    reason: str
    record_hour: str | None = None
    agent_hex: str | None = None
    boot_hex: str | None = None
    seq_start: int | None = None
    seq_end: int | None = None

    def identity(self) -> BatchIdentity:
        """The batch identity the mark carries (a mark proven by a record's tombstoned hour has none)."""
        if self.agent_hex is None or self.boot_hex is None or self.seq_start is None or self.seq_end is None:
            raise KeyError(f"the mark of {self.key} carries no identity (record hour {self.record_hour})")
        return BatchIdentity.create(hex_to_id(self.agent_hex, "agent"), hex_to_id(self.boot_hex, "boot"),
                                    int(self.seq_start), int(self.seq_end))

    def placed(self, marker_version_id: str) -> Mark:
        """This mark with its delete marker placed (``marker_version_id``)."""
        return replace(self, marker_version_id=marker_version_id)

    def at(self, marked_at_ns: int) -> Mark:
        """This mark, marked at ``marked_at_ns``."""
        return replace(self, marked_at_ns=int(marked_at_ns))

    def stored(self) -> dict[str, str]:
        """The mark as a marks item stores it: ``s`` sha, ``v`` captured version, ``m`` marker version,
        ``t`` hour of the blob's ``raw-blobs-by-time`` hint (hours since the epoch), ``r`` reason code,
        then either ``h`` (the record's tombstoned hour, rule G-R1) or the identity ``a``/``b``/``q``.
        The blob key (from ``s``) and the time marked (the item's) are not stored."""
        out = {"s": self.sha, "t": str(int(self.lm_unix_s) // 3600), "r": _REASON_CODES[self.reason]}
        if self.version_id:
            out["v"] = self.version_id
        if self.marker_version_id:
            out["m"] = self.marker_version_id
        if self.record_hour:
            out["h"] = self.record_hour
        else:
            out.update(a=str(self.agent_hex), b=str(self.boot_hex), q=f"{self.seq_start}-{self.seq_end}")
        return out

    @classmethod
    def of(cls, stored: Mapping[str, Any], codec: Any, marked_at_ns: int) -> Mark:
        """The mark :meth:`stored` stored (``marked_at_ns``: the time its item records, never earlier
        than the marker). A mark written by the previous version (long names, its own
        ``marked_at_ns``) is read as it is: a rolling deploy settles it unchanged."""
        if "sha" in stored:
            return cls._of_long(stored, marked_at_ns)
        sha = str(stored["s"])
        mark = cls(str(codec.raw_blob(sha)), sha, stored.get("v"), stored.get("m"), int(marked_at_ns),
                   int(stored["t"]) * 3600, _REASONS[str(stored["r"])])
        if stored.get("h"):
            return replace(mark, record_hour=str(stored["h"]))
        start, _, end = str(stored["q"]).partition("-")
        return replace(mark, agent_hex=str(stored["a"]), boot_hex=str(stored["b"]), seq_start=int(start),
                       seq_end=int(end))

    @classmethod
    def _of_long(cls, m: Mapping[str, Any], marked_at_ns: int) -> Mark:
        return cls(key=str(m["key"]), sha=str(m["sha"]), version_id=m.get("version_id"),
                   marker_version_id=m.get("marker_version_id"),
                   marked_at_ns=int(m.get("marked_at_ns", marked_at_ns)), lm_unix_s=int(m["lm_unix_s"]),
                   reason=str(m["reason"]), record_hour=m.get("record_hour") or None, agent_hex=m.get("agent_hex"),
                   boot_hex=m.get("boot_hex"), seq_start=optional(m, "seq_start", int), seq_end=optional(m, "seq_end", int))


def encode_mark(m: Mark) -> dict[str, str]:
    """A mark as a marks item stores it (:meth:`Mark.stored`, rule G-I7).

    >>> encode_mark(Mark("k", "ab" * 32, "v1", None, 0, 7200, "hour-tombstoned", record_hour="1970-01-01T02"))["h"]
    '1970-01-01T02'
    """
    return m.stored()


def decode_mark(stored: Mapping[str, Any], codec: Any, marked_at_ns: int) -> Mark:
    """The mark :func:`encode_mark` stored (:meth:`Mark.of`)."""
    return Mark.of(stored, codec, marked_at_ns)


#: Budget of one ``marks#`` item, under DynamoDB's 400 KB item limit (names + values, rule G-I6):
#: a page's marks are split over as many items as this needs.
MARKS_ITEM_MAX_BYTES = 300_000


def dynamodb_item_bytes(item: Mapping[str, Any]) -> int:
    """An upper bound of an item's size as DynamoDB counts it against its 400 KB limit: attribute
    names plus values; a number at its 21-byte maximum; a list or map 3 bytes plus 1 per element."""

    def size(v: Any) -> int:
        if isinstance(v, str):
            return len(v.encode())
        if isinstance(v, (bytes, bytearray)):
            return len(v)
        if v is None or isinstance(v, bool):
            return 1
        if isinstance(v, (int, float, Decimal)):
            return 21
        if isinstance(v, (list, tuple, set)):
            return 3 + sum(1 + size(x) for x in v)
        if isinstance(v, dict):
            return 3 + sum(1 + len(str(k).encode()) + size(x) for k, x in v.items())
        raise TypeError(f"no DynamoDB size for {type(v).__name__}")

    return sum(len(k.encode()) + size(v) for k, v in item.items())


def split_marks(marks: list[dict[str, str]], fields: Mapping[str, Any], *, budget: int) -> list[list[dict[str, str]]]:
    """Stored ``marks`` in consecutive parts, each an item (``fields`` plus its part of the marks) of at
    most ``budget`` bytes (:func:`dynamodb_item_bytes`); at least one part."""
    # The sort key at its longest: a range's page (range_page_prefix) and its part number.
    base = dynamodb_item_bytes({**fields, "pk": shard_pk(MARKS_SHARDS - 1), "sk": MARKS_PREFIX + "0" * 32, "marks": []})
    parts: list[list[dict[str, str]]] = [[]]
    used = base
    for m in marks:
        one = dynamodb_item_bytes({"m": m})  # 1 + the mark's map: its bytes as a list element
        if base + one > budget:
            raise ValueError(f"one mark of {one} bytes does not fit a marks item of {budget} bytes: {m.get('s')}")
        if used + one > budget and parts[-1]:
            parts.append([])
            used = base
        parts[-1].append(m)
        used += one
    return parts


_ITEM_FIELDS = ("pk", "sk", "state", "epoch", "owner", "cursor", "more", "counts", "created_at_ns", "marked_at_ns", "marks")


@dataclass(frozen=True)
class MarksItem:
    """One ``marks#`` item (``pk``/``sk``: :func:`marks_pk`, or an old writer's :data:`LEGACY_MARKS_PK`):
    its state, its writer's epoch and owner, when it was written (``created_at_ns`` an intent,
    ``marked_at_ns`` recorded marks), its part of the page's marks and, for a GC page's intent, what
    the page moves the summary on to (``outcome``; stored as ``cursor``, ``more`` and ``counts``,
    GC's ``through`` among the counts). A page's items share all but ``pk``, ``sk`` and ``marks``:
    :func:`page_ops` writes a page from one item without them. Converted to and from the stored
    item here (:meth:`of`, :meth:`stored`); ``None``: not stored; an attribute this version does
    not know is kept in ``extra``.

    >>> from lightmetrics.protocol.keys import KeyCodec
    >>> raw = {"pk": "checkpoint#reap#marks#00", "sk": "marks#000003#00000000#000", "epoch": 3, "owner": "o",
    ...        "state": "marked", "marked_at_ns": 9, "marks": [{"s": "ab" * 32, "t": "2", "r": "u",
    ...        "a": "0a", "b": "0b", "q": "1-2"}]}
    >>> item = MarksItem.of(raw, KeyCodec("lm/"))
    >>> item.state.value, item.marks[0].sha == "ab" * 32, item.marks[0].marked_at_ns, item.stored() == raw
    ('marked', True, 9, True)
    >>> item.key
    ('checkpoint#reap#marks#00', 'marks#000003#00000000#000')
    """

    state: MarkState | None  # None: an item of a version before intents (its marks recorded)
    marks: tuple[Mark, ...] = ()
    sk: str = ""
    pk: str = ""  # where it was read ("": not read; a new page's is marks_pk(sk))
    epoch: int | None = None
    owner: str | None = None
    created_at_ns: int | None = None
    marked_at_ns: int | None = None
    outcome: PageOutcome | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def intent(self) -> bool:
        """Recorded before its markers: some may be placed (rule L3)."""
        return self.state is MarkState.INTENT

    @property
    def key(self) -> MarksKey:
        """The item's table key: the partition it was read from (an old writer's:
        :data:`LEGACY_MARKS_PK`), its sort key."""
        return (self.pk or marks_pk(self.sk), self.sk)

    @property
    def at_ns(self) -> int:
        """The time the item records for its marks (never earlier than their markers)."""
        return int(self.marked_at_ns or self.created_at_ns or 0)

    @classmethod
    def of(cls, raw: Mapping[str, Any], codec: Any) -> MarksItem:
        """The stored item ``raw``, its marks decoded (:meth:`Mark.of`; an older version's as they are)."""
        item = plain(dict(raw))
        at = int(item.get("marked_at_ns") or item.get("created_at_ns") or 0)
        outcome = None
        if "cursor" in item:
            counts = dict(item.get("counts") or {})
            through = counts.pop("through", None)
            outcome = PageOutcome(str(item["cursor"]), bool(item["more"]), counts_of(counts), through)

        return cls(state=optional(item, "state", MarkState), marks=tuple(Mark.of(m, codec, at) for m in item.get("marks") or []),
                   sk=str(item.get("sk") or ""), pk=str(item.get("pk") or ""), epoch=optional(item, "epoch", int),
                   owner=optional(item, "owner", str),
                   created_at_ns=optional(item, "created_at_ns", int), marked_at_ns=optional(item, "marked_at_ns", int),
                   outcome=outcome,
                   extra={k: v for k, v in item.items() if k not in _ITEM_FIELDS})

    def attributes(self) -> dict[str, Any]:
        """The stored attributes the page's items share (all but ``sk`` and ``marks``)."""
        out = dict(self.extra)
        for name, value in (("epoch", self.epoch), ("owner", self.owner),
                            ("state", self.state.value if self.state is not None else None)):
            if value is not None:
                out[name] = value
        if self.outcome is not None:
            counts: dict[str, int | str] = dict(self.outcome.counts)
            if self.outcome.through:
                counts["through"] = self.outcome.through  # stored with the counts (the items' format)
            out.update(cursor=self.outcome.cursor, more=self.outcome.more, counts=counts)
        for name, at in (("created_at_ns", self.created_at_ns), ("marked_at_ns", self.marked_at_ns)):
            if at is not None:
                out[name] = at
        return out

    def stored(self) -> dict[str, Any]:
        """The item as the table holds it."""
        key = {"pk": self.pk} if self.pk else {}
        return {**key, **self.attributes(), "sk": self.sk, "marks": [m.stored() for m in self.marks]}


def decode_marks_item(item: Mapping[str, Any], codec: Any) -> MarksItem:
    """One ``marks#`` item, its marks decoded (:meth:`MarksItem.of`)."""
    return MarksItem.of(item, codec)


def stored_marks_items(table: ControlStore, *, pool: Executor | None = None) -> list[dict[str, Any]]:
    """Every ``marks#`` item as stored (every epoch's, every range's, an old writer's too): one Query
    of the ``marks#`` prefix per partition (:func:`marks_pks`), however long the history and however
    many marks are pending.

    ``pool``: a reader that holds no reap lease (the audit's driver) reads the previous version's
    partition first, then the shards all at once on ``pool`` (two round trips, not 33). A new writer
    moves an old writer's item to its shard in one transaction (:func:`page_ops`) and never back
    (§17 E8), so an item moved during this read is in the first Query's answer or in its shard's."""
    # The marks prefix only: the previous version's partition also holds a cursor per audit run and
    # each scope's last retention outcome, which would make every read grow with history.
    def read(pk: str) -> list[dict[str, Any]]:
        return table.query(pk, sk_prefix=MARKS_PREFIX)

    if pool is None:  # a reaper: its lease keeps every writer of marks away while it reads
        return [item for pk in marks_pks() for item in read(pk)]
    first = read(LEGACY_MARKS_PK)
    shards = [pk for pk in marks_pks() if pk != LEGACY_MARKS_PK]
    return first + [item for items in map_in_context(pool, read, shards) for item in items]


def read_marks_items(table: ControlStore, codec: Any, *, pool: Executor | None = None) -> list[MarksItem]:
    """The recorded pages' items (:func:`stored_marks_items`), their marks decoded."""
    return [MarksItem.of(item, codec) for item in stored_marks_items(table, pool=pool)]


def any_marks_item(table: ControlStore) -> bool:
    """Whether a ``marks#`` item is left anywhere (rule G-I8): a Query of one item per partition,
    stopping at the first found."""
    return any(table.query(pk, sk_prefix=MARKS_PREFIX, limit=1) for pk in marks_pks())


def page_items(table: ControlStore, codec: Any, prefix: str) -> list[MarksItem]:
    """The items of one page (``prefix``): its shard's, and an old writer's of the same page (a
    rolling deploy's, §17): two Queries of the page's prefix."""
    return [MarksItem.of(item, codec) for pk in (marks_pk(prefix), LEGACY_MARKS_PK)
            for item in table.query(pk, sk_prefix=prefix)]


def page_ops(epoch: int, page: int, marks: list[Mark], fields: MarksItem, replaces: list[MarksKey], *,
             prefix: str | None = None) -> list[Op]:
    """Puts of one page's items (``fields``' :meth:`~MarksItem.attributes` plus a part of ``marks``
    each, rule G-I6) under the page's shard (:func:`marks_pk`), and deletes of the items in
    ``replaces`` (keys) that they do not overwrite — an old writer's under :data:`LEGACY_MARKS_PK`
    among them; ``prefix``: the page's own (a range's, :func:`range_page_prefix`) instead of
    :func:`page_prefix`."""
    prefix = prefix or page_prefix(epoch, page)
    pk = marks_pk(prefix)
    attributes = fields.attributes()
    parts = split_marks([m.stored() for m in marks], attributes, budget=MARKS_ITEM_MAX_BYTES)
    keys = [(pk, f"{prefix}{i:03d}") for i in range(len(parts))]
    return ([Op("Put", pk, sk, item={**attributes, "marks": part}) for (pk, sk), part in zip(keys, parts)]
            + [Op("Delete", *key) for key in replaces if tuple(key) not in keys])


__all__ = ["LEGACY_MARKS_PK", "MARKS_ITEM_MAX_BYTES", "MARKS_PK_PREFIX", "MARKS_PREFIX", "MARKS_SHARDS", "Mark",
           "MarksItem", "MarksKey", "any_marks_item", "decode_mark", "decode_marks_item", "dynamodb_item_bytes",
           "encode_mark", "marks_pk", "marks_pks", "marks_shard", "page_items", "page_of", "page_ops", "page_prefix",
           "pending_keys", "range_page_prefix", "read_marks_items", "shard_pk", "split_marks", "stored_marks_items"]
