"""Conditional writes of the control table whose answer may have been lost (docs/protocol.md §11.1).

A write can land while its answer is lost (a read timeout); the client then sends it again and the
retry fails the condition the first attempt's own write broke. So a failed condition is not yet
someone else's write: each write here carries a fresh request token (``write_token``), and when its
condition fails after the client retried the request the item is read back — if it holds this
call's token the write was ours and the call succeeds; otherwise :class:`WrittenByOther` (a
``ConditionFailed``) carries what is there.

Example:
    >>> from lightmetrics.harness.testing.memory.control_table import InMemoryControlTable
    >>> table = InMemoryControlTable()
    >>> put_own(table, {"pk": "p", "sk": "s", "n": 1}, condition="attribute_not_exists(pk)")["n"]
    1
    >>> put_own(table, {"pk": "p", "sk": "s", "n": 2}, condition="attribute_not_exists(pk)")
    Traceback (most recent call last):
    ...
    lightmetrics.protocol.own_writes.WrittenByOther: p/s: the condition failed and the item there is not this call's write
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from lightmetrics.protocol.control_store import ConditionFailed, ControlStore

#: the attribute holding the request token of the last write through this module
WRITE_TOKEN = "write_token"
_SET = re.compile(r"\bSET\b", re.IGNORECASE)


class WrittenByOther(ConditionFailed):
    """The condition failed and the item is not this call's write; ``current`` is what is there
    (None: no item), read when first asked unless the read-back already read it."""

    def __init__(self, pk: str, sk: str, read: Callable[[], dict[str, Any] | None]) -> None:
        super().__init__(f"{pk}/{sk}: the condition failed and the item there is not this call's write")
        self._read: Callable[[], dict[str, Any] | None] | None = read
        self._current: dict[str, Any] | None = None

    @property
    def current(self) -> dict[str, Any] | None:
        if self._read is not None:
            self._current, self._read = self._read(), None
        return self._current


def _settle(table: ControlStore, pk: str, sk: str, token: str, failed: ConditionFailed) -> dict[str, Any]:
    """After a failed condition: the item if it carries ``token`` (our write landed), else raise.
    Only a retried request can have failed against its own write: a first attempt's failure reads
    nothing here (a background job's repeated "already there" costs no extra request)."""
    if not failed.retried:
        raise WrittenByOther(pk, sk, lambda: table.get(pk, sk)) from None
    current = table.get(pk, sk)
    if current is not None and current.get(WRITE_TOKEN) == token:
        return current
    raise WrittenByOther(pk, sk, lambda: current) from None


def put_own(table: ControlStore, item: dict[str, Any], *, condition: str, names: dict[str, str] | None = None,
            values_for_condition: dict[str, Any] | None = None) -> dict[str, Any]:
    """Put ``item`` (with a fresh ``write_token``) on ``condition``; the item written. A failed
    condition of a retried request is read back (one ``GetItem``): this call's own write is a
    success, anything else raises :class:`WrittenByOther`."""
    token = uuid.uuid4().hex
    mine = {**item, WRITE_TOKEN: token}
    try:
        table.put(mine, condition=condition, names=names, values_for_condition=values_for_condition)
    except ConditionFailed as failed:
        _settle(table, str(item["pk"]), str(item["sk"]), token, failed)
    return mine


def with_token(expression: str) -> str:
    """``expression`` that also sets ``#lm_wt = :lm_wt`` (in its SET clause, or a new one).

    >>> with_token("SET #a = :a ADD #n :one")
    'SET #lm_wt = :lm_wt, #a = :a ADD #n :one'
    >>> with_token("ADD #n :one")
    'SET #lm_wt = :lm_wt ADD #n :one'
    """
    if _SET.search(expression):
        return _SET.sub("SET #lm_wt = :lm_wt,", expression, count=1)
    return "SET #lm_wt = :lm_wt " + expression


def update_own(table: ControlStore, pk: str, sk: str, expression: str, *, condition: str,
               names: dict[str, str] | None = None, values: dict[str, Any] | None = None,
               once: bool = False) -> dict[str, Any]:
    """:meth:`ControlStore.update` on ``condition`` that also writes a fresh ``write_token``; the
    item after it. A failed condition is read back as in :func:`put_own` (there the item read is
    returned). ``once``: the condition also requires the item not to hold this call's token, so an
    update that is not idempotent (an ``ADD``) is applied once even when a retry of a landed
    request would pass ``condition`` again: the retry fails, is read back, and is this call's."""
    token = uuid.uuid4().hex
    if once:
        condition = f"({condition}) AND (attribute_not_exists(#lm_wt) OR #lm_wt <> :lm_wt)"
    try:
        return table.update(pk, sk, with_token(expression), names={**(names or {}), "#lm_wt": WRITE_TOKEN},
                            values={**(values or {}), ":lm_wt": token}, condition=condition)
    except ConditionFailed as failed:
        return _settle(table, pk, sk, token, failed)


__all__ = ["WRITE_TOKEN", "WrittenByOther", "put_own", "update_own", "with_token"]
