"""Short ids for the human tables of ``lmctl blockers`` and ``lmctl conflicts`` (issue 27 item 4).

A table row shows the shortest prefix (at least :data:`MIN_SHORT`) of a hex token that no other
listed row's token starts with, like git's abbreviated hashes; the commands resolve it against the
same rows ``list`` reads. Long ids do not fit a 100-column terminal (a conflict id is 117
characters, a blocker's work key is a kind and an S3 key); ``--output wide`` prints them whole.

>>> shortest_unique_prefixes({"a": "0123456789ab", "b": "0123456799cd", "c": "ffff000011"})
{'a': '012345678', 'b': '012345679', 'c': 'ffff0000'}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.table import Table

# the id forms and their resolver are the admin API's too (one implementation): re-exported here
from lightmetrics.admin.blocker_ids import MIN_SHORT, closest, hex_token, is_short_id
from lightmetrics.cli.output import cell_text

#: What a human table may be, in columns, by default (``--output wide`` has no bound).
TABLE_COLUMNS = 100


def shortest_unique_prefixes(tokens: Mapping[str, str], min_len: int = MIN_SHORT) -> dict[str, str]:
    """For each name, the shortest prefix (at least ``min_len``) of its token that no other token starts with."""
    ordered = sorted(set(tokens.values()))
    out = {}
    for name, token in tokens.items():
        others = [t for t in ordered if t != token]
        n = min_len
        while n < len(token) and any(o.startswith(token[:n]) for o in others):
            n += 1
        out[name] = token[:n]
    return out


def elide(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start and its end, "…" between them.

    >>> elide("agent-0123456789/boot-1", 16)
    'agent-0…9/boot-1'
    """
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def compact_grid(title: str, columns: Sequence[tuple[str, int | None]], rows: Iterable[Sequence[Any]], *,
                 fill: str | None = None, elide_fill: bool = False) -> Table:
    """A table whose columns are at most their given width (None: as wide as its widest cell) and
    the ``fill`` column whatever is left of :data:`TABLE_COLUMNS` (at least 8); a longer cell ends
    in "…" (or, with ``elide_fill``, a fill cell keeps its start and end: :func:`elide`)."""
    cells = [[cell_text(v) for v in row] for row in rows]
    natural = [max([len(header), *(len(row[i]) for row in cells)]) for i, (header, _) in enumerate(columns)]
    widths = [n if cap is None else min(n, cap) for n, (_, cap) in zip(natural, columns)]
    table = Table(title=title, title_justify="left")
    for i, (header, cap) in enumerate(columns):
        if header == fill:  # borders and padding: 3 per column and 1
            cap = max(8, TABLE_COLUMNS - 1 - 3 * len(columns) - sum(widths) + widths[i])
            if elide_fill:
                for row in cells:
                    row[i] = elide(row[i], cap)
        table.add_column(header, justify="right" if header[:1].isdigit() or header.startswith("#") else "left",
                         no_wrap=True, overflow="ellipsis", max_width=cap)
    for row in cells:
        table.add_row(*row)
    return table


__all__ = ["MIN_SHORT", "TABLE_COLUMNS", "closest", "compact_grid", "elide", "hex_token", "is_short_id",
           "shortest_unique_prefixes"]
