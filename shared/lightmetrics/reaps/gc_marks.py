"""A GC page's ``marks#`` items: one page's intents or marks, split under DynamoDB's item size limit.

Each marked page has its own items ``checkpoint#reap``/``marks#<epoch>#<page>#<part>`` (written
*before* its delete markers, state ``intent``, then ``marked``; deleted once settled), as many
parts as keep each item under :data:`MARKS_ITEM_MAX_BYTES` (rule G-I6). The epoch keeps a new
reap's pages apart from marks a crashed older epoch left to settle. A key range of an hour reaped in
parallel (:mod:`lightmetrics.reaps.retention_ranges`) has its own pages: ``marks#<epoch>#r<range>.<pass>#<page>#<part>``,
so two range tasks never write one item, and every reap still finds them under ``marks#``.

Example::

    >>> page_prefix(3, 12)
    'marks#000003#00000012#'
    >>> range_page_prefix(3, 2, 1, 12)
    'marks#000003#r0002.01#00000012#'
    >>> [len(p) for p in split_marks([{"s": "x"}] * 3, {}, budget=80)]
    [2, 1]
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from lightmetrics.protocol.control_store import ControlStore, Op, plain
from lightmetrics.protocol.identity import BatchIdentity, hex_to_id
from lightmetrics.reaps.gc_proof import DELETE_CONFLICT_RESOLVED, DELETE_HOUR_TOMBSTONED, DELETE_UNREFERENCED
from lightmetrics.reaps.params import CHECKPOINT_PK

# -- the stored form of a mark (rule G-I7): short names, string values, nothing derivable -------------
_REASON_CODES = {DELETE_UNREFERENCED: "u", DELETE_HOUR_TOMBSTONED: "t", DELETE_CONFLICT_RESOLVED: "c"}
_REASONS = {v: k for k, v in _REASON_CODES.items()}


def encode_mark(m: dict[str, Any]) -> dict[str, str]:
    """A mark as a marks item stores it: ``s`` sha, ``v`` captured version, ``m`` marker version,
    ``t`` hour of the blob's ``raw-blobs-by-time`` hint (hours since the epoch), ``r`` reason code,
    then either ``h`` (the record's tombstoned hour, rule G-R1) or the identity ``a``/``b``/``q``.
    The blob key (from ``s``) and the time marked (the item's) are not stored.

    >>> encode_mark({"sha": "ab" * 32, "version_id": "v1", "marker_version_id": None, "lm_unix_s": 7200,
    ...              "reason": "hour-tombstoned", "record_hour": "1970-01-01T02"})["h"]
    '1970-01-01T02'
    """
    out = {"s": m["sha"], "t": str(int(m["lm_unix_s"]) // 3600), "r": _REASON_CODES[m["reason"]]}
    if m.get("version_id"):
        out["v"] = m["version_id"]
    if m.get("marker_version_id"):
        out["m"] = m["marker_version_id"]
    if m.get("record_hour"):
        out["h"] = m["record_hour"]
    else:
        out.update(a=m["agent_hex"], b=m["boot_hex"], q=f"{m['seq_start']}-{m['seq_end']}")
    return out


def decode_mark(stored: dict[str, Any], codec: Any, marked_at_ns: int) -> dict[str, Any]:
    """The mark :func:`encode_mark` stored, as the collector uses it (``marked_at_ns``: the time its
    item records, never earlier than the marker). A mark written by the previous version (long
    names, its own ``marked_at_ns``) is returned as it is: a rolling deploy settles it unchanged."""
    if "sha" in stored:
        return dict(stored)
    sha = str(stored["s"])
    m: dict[str, Any] = {"key": codec.raw_blob(sha), "sha": sha, "version_id": stored.get("v"),
                         "marker_version_id": stored.get("m"), "marked_at_ns": int(marked_at_ns),
                         "lm_unix_s": int(stored["t"]) * 3600, "reason": _REASONS[str(stored["r"])]}
    if stored.get("h"):
        m["record_hour"] = str(stored["h"])
    else:
        start, _, end = str(stored["q"]).partition("-")
        m.update(agent_hex=str(stored["a"]), boot_hex=str(stored["b"]), seq_start=int(start), seq_end=int(end))
    return m


def identity_from_mark(m: dict[str, Any]) -> BatchIdentity:
    return BatchIdentity.create(hex_to_id(m["agent_hex"], "agent"), hex_to_id(m["boot_hex"], "boot"),
                                int(m["seq_start"]), int(m["seq_end"]))


MARKS_PREFIX = "marks#"
#: Budget of one ``marks#`` item, under DynamoDB's 400 KB item limit (names + values, rule G-I6):
#: a page's marks are split over as many items as this needs.
MARKS_ITEM_MAX_BYTES = 300_000


def dynamodb_item_bytes(item: dict[str, Any]) -> int:
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


def split_marks(marks: list[dict[str, Any]], fields: dict[str, Any], *, budget: int) -> list[list[dict[str, Any]]]:
    """``marks`` in consecutive parts, each an item (``fields`` plus its part of the marks) of at most
    ``budget`` bytes (:func:`dynamodb_item_bytes`); at least one part."""
    # The sort key at its longest: a range's page (range_page_prefix) and its part number.
    base = dynamodb_item_bytes({**fields, "pk": CHECKPOINT_PK, "sk": MARKS_PREFIX + "0" * 32, "marks": []})
    parts: list[list[dict[str, Any]]] = [[]]
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



def decode_marks_item(item: dict[str, Any], codec: Any) -> dict[str, Any]:
    """One ``marks#`` item (plain values), its marks decoded (:func:`decode_mark`;
    an older version's marks as they are)."""
    item = plain(item)
    at = int(item.get("marked_at_ns") or item.get("created_at_ns") or 0)
    item["marks"] = [decode_mark(m, codec, at) for m in item.get("marks") or []]
    return item


def read_marks_items(table: ControlStore, codec: Any) -> list[dict[str, Any]]:
    """The recorded pages' items (every epoch's, every range's), their marks decoded."""
    # The marks prefix only: the partition also holds a cursor per audit run and each scope's last
    # retention outcome, which would make every read grow with history.
    return [decode_marks_item(item, codec) for item in table.query(CHECKPOINT_PK, sk_prefix=MARKS_PREFIX)]


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


def page_ops(epoch: int, page: int, marks: list[dict[str, Any]], fields: dict[str, Any],
             replaces: list[str], *, prefix: str | None = None) -> list[Op]:
    """Puts of one page's items (``fields`` plus a part of ``marks`` each, rule G-I6), and deletes
    of the items in ``replaces`` that they do not overwrite; ``prefix``: the page's own (a range's,
    :func:`range_page_prefix`) instead of :func:`page_prefix`."""
    prefix = prefix or page_prefix(epoch, page)
    parts = split_marks([encode_mark(m) for m in marks], fields, budget=MARKS_ITEM_MAX_BYTES)
    sks = [f"{prefix}{i:03d}" for i in range(len(parts))]
    return ([Op("Put", CHECKPOINT_PK, sk, item={**fields, "marks": part}) for sk, part in zip(sks, parts)]
            + [Op("Delete", CHECKPOINT_PK, sk) for sk in replaces if sk not in sks])


__all__ = ["MARKS_ITEM_MAX_BYTES", "MARKS_PREFIX", "decode_marks_item", "dynamodb_item_bytes", "page_of", "page_ops",
           "page_prefix", "range_page_prefix", "read_marks_items", "split_marks"]
