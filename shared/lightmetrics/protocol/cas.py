"""Conditional create (``If-None-Match: *``): the only compare-and-swap this system uses.

One attempt is classified by the store adapter into a :class:`ConditionalCreateOutcome`;
:func:`create_object` adds bounded, jittered retries for the outcomes that say nothing about
existence. The rules (docs/protocol.md §5, steps 4-5):

* ``CREATED``  (200/201) — this call created the object.
* ``EXISTS``   (412)     — an object is current at the key: durable evidence of existence.
* ``CONFLICT`` (409)     — a concurrent conditional write is in flight: retry; *not* existence.
* ``UNKNOWN``  (timeout, 5xx, connection error) — the write may or may not have landed: retry;
  a retry that answers 412 may be our own earlier attempt, so callers that care read the key.

Example:
    >>> result = create_object(store, "k", b"v", policy=NO_WAIT)   # doctest: +SKIP
    >>> result.outcome is ConditionalCreateOutcome.CREATED            # doctest: +SKIP
    True
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from lightmetrics.protocol.retry import RetryPolicy

if TYPE_CHECKING:
    from lightmetrics.protocol.object_store import ObjectStore


class ConditionalCreateOutcome(str, Enum):
    CREATED = "created"
    EXISTS = "exists"
    CONFLICT = "conflict"
    UNKNOWN = "unknown"

    @property
    def is_final(self) -> bool:
        """True when the outcome proves the state of the key (created or existing)."""
        return self in (ConditionalCreateOutcome.CREATED, ConditionalCreateOutcome.EXISTS)


@dataclass(frozen=True)
class CreateResult:
    outcome: ConditionalCreateOutcome
    attempts: int
    detail: str = ""
    #: True if an earlier attempt of this call ended CONFLICT/UNKNOWN (it may have landed).
    ambiguous_before: bool = False


def create_object(
    store: "ObjectStore",
    key: str,
    body: bytes,
    *,
    policy: RetryPolicy,
    metadata: dict[str, str] | None = None,
    content_type: str = "application/json",
    checksum_sha256_b64: str | None = None,
    rng: random.Random | None = None,
) -> CreateResult:
    """Conditionally create ``key``; retry CONFLICT/UNKNOWN up to ``policy.max_attempts``.

    Returns the last outcome. A non-final outcome after the last attempt means the caller
    does not know whether the object exists and must not claim either.
    """
    ambiguous = False
    outcome, detail, attempt = ConditionalCreateOutcome.UNKNOWN, "", 0
    for attempt in policy.attempts(rng):
        outcome, detail = store.put_if_absent(
            key, body, metadata=metadata, content_type=content_type, checksum_sha256_b64=checksum_sha256_b64
        )
        if outcome.is_final:
            return CreateResult(outcome, attempt, detail, ambiguous)
        ambiguous = True
    return CreateResult(outcome, attempt, detail, ambiguous)


def landed_earlier(store: "ObjectStore", key: str, body: bytes, result: CreateResult) -> bool:
    """True if ``result`` is ``EXISTS`` after an attempt of this call whose answer was lost and the
    object holds ``body``: this call's own create landed (docs/protocol.md §11.1 CW3). Reads the
    object only in that case (one GET), so the happy path costs nothing."""
    return (result.outcome is ConditionalCreateOutcome.EXISTS and result.ambiguous_before
            and store.get(key) == body)
