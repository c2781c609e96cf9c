"""The object-store port: what the protocol needs from object storage, and the errors it raises.

The accept algorithm and every background job talk to :class:`ObjectStore`; the adapter that ships
is :class:`lightmetrics.aws.s3_store.S3ObjectStore` (boto3). A batch delete's :class:`DeleteOutcome`
raises a refused key's error as the adapter makes it (for S3, botocore's ``ClientError``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from lightmetrics.protocol.cas import ConditionalCreateOutcome
from lightmetrics.protocol.errors import LightmetricsError, ResourceAccessError


class TransientStoreError(LightmetricsError):
    """A read failed in a way that may succeed on retry (timeout, 5xx, throttling, 409)."""


class StoreAccessError(ResourceAccessError):
    """S3 refused the request: the bucket does not exist, access is denied, or another
    non-retryable client error. Never a missing key (that is ``None``)."""

    def __init__(self, bucket: str, problem: str, setting: str = "LM_BUCKET") -> None:
        super().__init__("bucket", bucket, setting, problem)


@dataclass(frozen=True)
class ListPage:
    """One ``ListObjectsV2`` response: keys (with sizes and ``LastModified``) in key order, common
    prefixes, and whether more follow (``next_token`` continues a listing with a delimiter).

    ``last_modified_ns[i]`` is ``keys[i]``'s ``LastModified`` in Unix ns: S3's clock, whole seconds,
    when the object's PUT began (the walk places a record's hour by it, docs/protocol.md §13 W4)."""

    keys: list[str]
    sizes: list[int]
    prefixes: list[str]
    truncated: bool
    next_token: str | None = None
    last_modified_ns: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ObjectHead:
    key: str
    size: int
    last_modified_unix_s: float
    etag: str
    metadata: dict[str, str] = field(default_factory=dict)
    version_id: str | None = None
    #: base64 SHA-256 of the whole object, as S3 stored it at upload; None when the HEAD did not ask
    #: for it, the object was written without one, or S3 holds only a composite (multipart) checksum
    checksum_sha256_b64: str | None = None


@dataclass(frozen=True)
class ObjectVersion:
    """One version of a key, or one delete marker (``ListObjectVersions``)."""

    key: str
    version_id: str
    last_modified: datetime
    delete_marker: bool


@dataclass
class DeleteOutcome:
    """What batch delete requests said, per ``(key, version id asked or None)``.

    ``deleted`` maps each deleted object to the delete marker placed (a delete without a version
    id in a versioned bucket) or None; ``errors`` maps each refused one to ``(code, message)``. A
    key the response names in neither is an error ``Missing`` (never assumed deleted).
    ``error_of(key, code, message)`` is the adapter's error a single delete of the key would have
    raised, so callers classify a refused key as they would that delete.

    >>> out = DeleteOutcome(lambda k, c, m: KeyError(f"{k}: {c}"), errors={("k", None): ("SlowDown", "")})
    >>> out.error_for("k", None), out.error_for("k", None, tolerate=("SlowDown",))
    (KeyError('k: SlowDown'), None)
    """

    error_of: Callable[[str, str, str], Exception] = field(repr=False, compare=False)
    deleted: dict[tuple[str, str | None], str | None] = field(default_factory=dict)
    errors: dict[tuple[str, str | None], tuple[str, str]] = field(default_factory=dict)

    def error_for(self, key: str, version_id: str | None, *, tolerate: tuple[str, ...] = ()) -> Exception | None:
        """The per-key error as a single delete of it would have raised it, or None if it was
        deleted or its code is in ``tolerate``."""
        err = self.errors.get((key, version_id))
        if err is None or err[0] in tolerate:
            return None
        return self.error_of(key, *err)


class ObjectStore(Protocol):
    """Everything the core and the background jobs need from object storage: conditional create,
    GET (whole or a byte range), HEAD, LIST (pages, keys, key ranges), the versions of a key, and deletes.

    Deletes are never retried by the store: a repeated delete without a version id would place a
    second delete marker. Reads are retried on transient failures.
    """

    bucket: str

    def put_if_absent(
        self,
        key: str,
        body: bytes,
        *,
        metadata: dict[str, str] | None = None,
        content_type: str = "application/json",
        checksum_sha256_b64: str | None = None,
    ) -> tuple[ConditionalCreateOutcome, str]: ...

    def get(self, key: str) -> bytes | None: ...

    def get_range(self, key: str, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` of ``key`` (one ranged GET; an ``end`` past the object's end
        reads to its end), or None if the key is missing. ``0 <= start < end`` and ``start`` below
        the object's size: a start at or past it is S3's ``InvalidRange``, a
        :class:`StoreAccessError`."""
        ...

    def lines_from(self, key: str, offset: int) -> Generator[bytes, None, None]: ...

    def head(self, key: str, *, checksum: bool = False) -> ObjectHead | None: ...

    def require_bucket(self, prefix: str) -> None: ...

    def list_page(self, prefix: str, *, max_keys: int = 1000, start_after: str | None = None,
                  delimiter: str | None = None, continuation_token: str | None = None) -> ListPage: ...

    def list_keys(self, prefix: str, *, limit: int = 1000) -> list[str]: ...

    def list_modified(self, prefix: str, *, limit: int = 1000, start_after: str | None = None,
                      end_at: str | None = None) -> list[tuple[str, int]]: ...

    def versions_of(self, key: str) -> list[ObjectVersion]: ...

    def delete(self, key: str) -> None: ...

    def delete_objects(self, objects: list[tuple[str, str | None]], *, fence: Callable[[], None] | None = None,
                       after_request: Callable[[], None] | None = None) -> DeleteOutcome: ...
