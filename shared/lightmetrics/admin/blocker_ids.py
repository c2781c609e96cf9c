"""What an operator may type to name one blocker, and the one resolver ``lmctl blockers`` and the admin API share.

A blocker is named by its work key (``kind:object``), the start of it, the object alone (when
one blocker, or one open blocker, is about it), or its short id: a start (at least
:data:`MIN_SHORT` hex characters) of the work key's sha256, as the ``id`` column of
``lmctl blockers list`` shows it. A start several blockers share is refused naming them
(:class:`AmbiguousBlocker`); nothing matching is refused with the closest work keys
(:class:`UnknownBlocker`) — never a guess.

>>> from lightmetrics.work.blockers import Blocker
>>> known = [Blocker("index-accepted:accepted/v1/a", "index-accepted", "accepted/v1/a", "", "open", "event", 0, 0)]
>>> resolve_work_key(known, "accepted/v1/a")
'index-accepted:accepted/v1/a'
>>> resolve_work_key(known, hex_token("index-accepted:accepted/v1/a")[:8])
'index-accepted:accepted/v1/a'
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Iterable, Sequence

from lightmetrics.protocol.errors import LightmetricsError
from lightmetrics.work.blockers import Blocker

#: The fewest hex characters a short id has (32 bits: a clash among a page's rows is a remote chance,
#: and a prefix of several is refused, never guessed).
MIN_SHORT = 8


class AmbiguousBlocker(LightmetricsError, ValueError):
    """What was given names several blockers; ``candidates`` are their work keys (sorted)."""

    def __init__(self, message: str, candidates: list[str]) -> None:
        super().__init__(message)
        self.candidates = candidates


class UnknownBlocker(LightmetricsError, LookupError):
    """What was given names no blocker; ``suggestions`` are the closest work keys, best first."""

    def __init__(self, message: str, suggestions: list[str]) -> None:
        super().__init__(message)
        self.suggestions = suggestions


def hex_token(text: str) -> str:
    """A stable hex token for an id that is not hex itself (a blocker's work key): its sha256."""
    return hashlib.sha256(text.encode()).hexdigest()


def is_short_id(text: str) -> bool:
    """Whether ``text`` can be a short id: 4 to 64 hex characters."""
    return 4 <= len(text) <= 64 and all(c in "0123456789abcdef" for c in text.lower())


def closest(text: str, names: Iterable[str], n: int = 3) -> list[str]:
    """The names most like ``text`` (difflib), best first."""
    return difflib.get_close_matches(text, sorted(set(names)), n=n, cutoff=0.6)


def resolve_work_key(known: Sequence[Blocker], text: str) -> str:
    """The work key ``text`` names among ``known`` (every blocker, whatever its status): the work key
    itself; the object alone when exactly one blocker — the open one, if any is open — is about it;
    else the one blocker whose work key or short id starts with ``text``."""
    if any(b.work_key == text for b in known):
        return text
    about = [b for b in known if b.object_key == text]
    chosen = [b for b in about if b.status == "open"] or about
    if len(chosen) == 1:
        return str(chosen[0].work_key)
    if chosen:
        names = sorted(str(b.work_key) for b in chosen)
        raise AmbiguousBlocker(f"several blockers are about {text!r}: {', '.join(names)}; give one "
                               f"WORK_KEY (kind:object)", names)
    short = text.lower() if is_short_id(text) else None
    starts = sorted({str(b.work_key) for b in known if b.work_key.startswith(text)
                     or (short and hex_token(b.work_key).startswith(short))})
    if len(starts) == 1:
        return starts[0]
    if starts:
        raise AmbiguousBlocker(f"several blockers start with {text!r}: {', '.join(starts)}; give more of it", starts)
    close = closest(text, {b.work_key for b in known})
    if not close:  # an object key with a typo: compare it with the objects, answer their work keys
        by_object = {b.object_key: b.work_key for b in known}
        close = [by_object[o] for o in closest(text, by_object)]
    hint = f"did you mean {' or '.join(close)}?" if close else "see `lmctl blockers list`"
    raise UnknownBlocker(f"no blocker {text!r} (WORK_KEY is kind:object, or the object alone); {hint}", close)


__all__ = ["MIN_SHORT", "AmbiguousBlocker", "UnknownBlocker", "closest", "hex_token", "is_short_id",
           "resolve_work_key"]
