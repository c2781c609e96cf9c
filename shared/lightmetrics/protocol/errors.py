"""Typed errors of the lightmetrics core.

Every error a caller can cause maps to one exception class here, so handlers and the CLI
can turn it into a precise HTTP status or exit code without parsing messages.
"""

from __future__ import annotations


class LightmetricsError(Exception):
    """Base class of every error raised by the lightmetrics core."""


class InvalidIdentityError(LightmetricsError, ValueError):
    """An agent id, boot id or sequence range is not allowed (HTTP 400, exit 2)."""


class KeyLayoutError(LightmetricsError, ValueError):
    """An object key does not belong to the documented layout."""


class FrameError(LightmetricsError, ValueError):
    """A byte string is not a valid Lightmetrics frame v1 (HTTP 400, exit 2)."""


class ManifestError(LightmetricsError, ValueError):
    """A stored manifest does not validate against its schema."""


class UnsupportedVersionError(ManifestError):
    """A stored object was written by a newer version (its schema or marker version is higher than
    this reader knows). Never read as "absent": callers keep what it may reference and block."""


class ConfigError(LightmetricsError, ValueError):
    """Configuration is missing or invalid; raised at start, before any work."""


class AuthError(LightmetricsError):
    """Authentication failed. ``status`` is the HTTP status to answer (401 or 403)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


class ResourceAccessError(LightmetricsError):
    """A configured bucket, table or queue does not exist, or refuses us (access denied).

    A configuration error (exit 2), never read as "empty": a listing of a missing bucket is not a
    bucket without keys. ``resource`` names it (``"bucket lm-prod"``), ``setting`` the variable
    that configures it (``LM_BUCKET``).
    """

    def __init__(self, kind: str, name: str, setting: str, problem: str) -> None:
        self.resource, self.setting = f"{kind} {name}", setting
        super().__init__(f"{kind} {name} ({setting}) {problem}")


class SegmentError(LightmetricsError, ValueError):
    """A v2 index segment or sealed part that a reader must not use (docs/protocol.md §9.1).

    Never skipped: a blocker of kind ``kind`` (work key ``<kind>:<key>``) that keeps its hour open.
    ``key`` names the object, ``reason`` says what is wrong with it.
    """

    kind = "segment"

    def __init__(self, key: str, reason: str) -> None:
        self.key, self.reason = key, reason
        super().__init__(f"{key}: {reason}")


class SegmentLayoutError(SegmentError):
    """V-D4: the key, the body or an entry is outside the v2 layout (digest, schema, hour, part)."""


class SegmentConflictError(SegmentError):
    """V-D7: two unequal entries for one entry key; ``key`` and ``other`` name both sources."""

    kind = "segment-conflict"

    def __init__(self, key: str, reason: str, other: str) -> None:
        self.other = other
        super().__init__(key, f"{reason} (and in {other})")


class SealError(SegmentError):
    """A sealed part (``.lmseal``) whose bytes are not a valid seal v1: magic, checksum, order."""
