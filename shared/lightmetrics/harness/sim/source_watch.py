"""After every step: no derived entry whose source is absent (rule ``derived-without-source``),
outside the windows the protocol allows.

An ``accepted-by-time`` or ``accepted-by-blob`` entry's source is its acceptance record; a
``quarantine-by-blob`` entry's, its quarantine manifest. Both are written before any entry names
them (the entries are derived from their S3 events or from listing them) and are never deleted
(docs/protocol.md §16 R-I1; quarantine manifests are evidence), so the protocol allows no window:
such an entry with its source absent is a violation at the step that made it so. A record planted
as vanished (the reaps' history, R-I5) is the exception the history names.

``raw-blobs-by-time`` entries name blobs, which GC and retention delete before the entry (the
handshake's settle, retention's step order): that window is the reaps', and ``verify`` at
quiescence holds those entries to their sources.

Example:
    >>> watch = SourceWatch(world)                                      # doctest: +SKIP
    >>> watch.check()                                                  # doctest: +SKIP
    []
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from lightmetrics.protocol.errors import KeyLayoutError
from lightmetrics.protocol.keys import KeyKind

_RECORD_SOURCED = (KeyKind.ACCEPTED_BY_TIME, KeyKind.ACCEPTED_BY_BLOB)


class SourceWatch:
    """Re-checks the entries a step created and the sources a step removed; ``exempt``: source keys
    whose absence the planted history arranged."""

    def __init__(self, world: Any, exempt: Collection[str] = ()) -> None:
        self.store, self.codec = world.system.store, world.system.ctx.codec
        self.exempt = set(exempt)
        self.roots = tuple(self.codec.root(k) for k in (*_RECORD_SOURCED, KeyKind.QUARANTINE_BY_BLOB))
        self.source_roots = (self.codec.accepted_root(), self.codec.quarantine_root())
        self.entries_of: dict[str, dict[str, None]] = {}  # source key -> entries naming it
        self.changes: list[str] = []
        chained = self.store.on_change

        def on_change(key: str) -> None:
            if chained is not None:
                chained(key)
            self.changes.append(key)

        self.store.on_change = on_change
        for root in self.roots:
            for key in self.store.keys(root):
                self._source(key)

    def _source(self, entry: str) -> str | None:
        """The source ``entry`` names (and remember it), None for a key outside the layout (verify's
        ``bad-key``)."""
        try:
            parsed = self.codec.parse(entry)
        except KeyLayoutError:
            return None
        if parsed.identity is None:
            return None
        if parsed.kind in _RECORD_SOURCED:
            source = self.codec.accepted(parsed.identity)
        elif parsed.kind is KeyKind.QUARANTINE_BY_BLOB and parsed.sha256 is not None:
            source = self.codec.quarantine(parsed.identity, parsed.sha256)
        else:
            return None
        self.entries_of.setdefault(source, {})[entry] = None
        return source

    def _present(self, key: str) -> bool:
        return self.store._current(key) is not None

    def check(self) -> list[str]:
        found: list[str] = []
        changed, self.changes = list(dict.fromkeys(self.changes)), []
        for key in changed:
            if key.startswith(self.roots) and self._present(key):
                source = self._source(key)
                if source is not None and source not in self.exempt and not self._present(source):
                    found.append(f"derived entry without its source: {key} names {source}, which does not exist")
            elif key.startswith(self.source_roots) and key not in self.exempt and not self._present(key):
                found += [f"derived entry without its source: {entry} names {key}, which was deleted"
                          for entry in self.entries_of.get(key, ()) if self._present(entry)]
        return found


__all__ = ["SourceWatch"]
