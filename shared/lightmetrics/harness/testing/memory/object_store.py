"""An in-memory :class:`~lightmetrics.protocol.object_store.ObjectStore`: the S3 semantics our code relies on.

Conditional create (``If-None-Match: *``: 412, reported as ``EXISTS`` — a delete marker is no
object), versions and delete markers (a ``DeleteObject`` without a version id places a marker on a
versioned bucket — as AWS does, also on a key that never existed, where moto places none; with a
version id, it removes exactly that version), ``ListObjectsV2`` in UTF-8 byte order
with prefix, delimiter (common prefixes count towards ``MaxKeys``), ``StartAfter`` and opaque
continuation tokens, ``ListObjectVersions``, ``DeleteObjects`` with per-key results, ranged reads
(``InvalidRange`` at the end), lower-cased user metadata, MD5 ETags, and ``LastModified`` from an
injectable clock (HEAD and listings in whole seconds, versions in milliseconds, as S3 reports them).

Errors take the S3 adapter's own paths: an injected error (:meth:`InMemoryObjectStore.fail`) is a
botocore ``ClientError`` classified by :mod:`lightmetrics.aws.s3_store`'s functions — a PUT becomes its
:class:`~lightmetrics.protocol.cas.ConditionalCreateOutcome`, a read is retried under ``read_policy`` and
ends as ``TransientStoreError`` or ``StoreAccessError``, a delete raises it. ``requests`` counts
calls by S3 operation, retries included. ``tests/test_memory_contract.py`` runs the same tests
against this store and moto's S3.

Example:
    >>> store = InMemoryObjectStore()
    >>> store.put_if_absent("k", b"{}")[0].value, store.put_if_absent("k", b"{}")[0].value
    ('created', 'exists')
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from lightmetrics.aws.errors import is_not_found, is_transient
from lightmetrics.aws.s3_deletes import DELETE_BATCH_MAX, delete_error
from lightmetrics.aws.s3_store import bucket_refusal, classify_put_error, refused_request
from lightmetrics.protocol.cas import ConditionalCreateOutcome
from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.object_store import (
    DeleteOutcome,
    ListPage,
    ObjectHead,
    ObjectVersion,
    StoreAccessError,
    TransientStoreError,
)
from lightmetrics.protocol.retry import RetryPolicy

_NS = 1_000_000_000
_T = TypeVar("_T")
#: A read policy that retries at once (tests count attempts, never wait).
NO_WAIT = RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0, sleep=lambda _s: None)
_STATUS = {"AccessDenied": 403, "NoSuchBucket": 404, "NoSuchKey": 404, "PreconditionFailed": 412,
           "ConditionalRequestConflict": 409, "InternalError": 500, "ServiceUnavailable": 503, "SlowDown": 503}


def s3_error(operation: str, code: str, message: str = "", status: int | None = None) -> ClientError:
    """The ``ClientError`` botocore raises for an S3 error answer."""
    return ClientError({"Error": {"Code": code, "Message": message or code},
                        "ResponseMetadata": {"HTTPStatusCode": status or _STATUS.get(code, 400)}}, operation)


@dataclass
class _Version:
    version_id: str
    modified_ns: int
    body: bytes | None = None  # None: a delete marker
    metadata: dict[str, str] = field(default_factory=dict)
    content_type: str = "binary/octet-stream"
    checksum: str | None = None

    @property
    def marker(self) -> bool:
        return self.body is None


@dataclass
class _Fault:
    operation: str
    code: str
    key_contains: str | None
    times: int
    landed: bool  # the request is applied, then the caller sees the error (a timeout after landing)


class InMemoryObjectStore:
    """:class:`~lightmetrics.protocol.object_store.ObjectStore` in memory (thread-safe); see the module docstring."""

    def __init__(self, bucket: str = "lm-memory", *, clock: Clock | None = None, versioned: bool = True,
                 exists: bool = True, read_policy: RetryPolicy | None = None) -> None:
        self.bucket = bucket
        self.clock = clock or DEFAULT_CLOCK
        self.versioned, self.exists = versioned, exists
        self.read_policy = read_policy or NO_WAIT
        self.requests: Counter[str] = Counter()
        self._keys: dict[str, list[_Version]] = {}  # oldest first
        self._lock = threading.RLock()
        self._faults: list[_Fault] = []
        self._next_version = 0
        #: called with the key after every change of a key's versions (the simulation's incremental checks)
        self.on_change: Callable[[str], None] | None = None

    # -- test controls -------------------------------------------------------------------------------
    def fail(self, operation: str, code: str, *, key_contains: str | None = None, times: int = 1,
             landed: bool = False) -> None:
        """The next ``times`` (-1: every) calls of S3 ``operation`` (``PutObject``, ``GetObject``,
        ``HeadObject``, ``ListObjectsV2``, ``ListObjectVersions``, ``DeleteObject``, ``DeleteObjects``)
        whose key contains ``key_contains`` answer ``code`` (``RequestTimeout`` stands for a timeout).
        ``DeleteObjects`` with ``key_contains`` fails only the matching keys, in the response, as S3
        does. ``landed``: the request is applied first."""
        self._faults.append(_Fault(operation, code, key_contains, times, landed))

    def clear_faults(self) -> None:
        self._faults.clear()

    def set_last_modified(self, key: str, unix_ns: int) -> None:
        """Back-date the current version of ``key`` (history written directly, as S3 would have)."""
        with self._lock:
            self._current(key, required=True).modified_ns = unix_ns  # type: ignore[union-attr]

    def keys(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` whose current version is an object, in S3's order (no request)."""
        with self._lock:
            return sorted((k for k in self._keys if k.startswith(prefix) and self._current(k)), key=str.encode)

    # -- plumbing ------------------------------------------------------------------------------------
    def _request(self, operation: str, key: str = "", *, landed: bool | None = None) -> _Fault | None:
        """Count one request; the fault it hits, if any (``landed`` filters by that kind)."""
        self.requests[operation] += 1
        for f in self._faults:
            if f.operation == operation and f.times != 0 and (f.key_contains is None or f.key_contains in key) \
                    and (landed is None or f.landed == landed) and not (operation == "DeleteObjects" and f.key_contains):
                if f.times > 0:
                    f.times -= 1
                return f
        return None

    def _key_fault(self, key: str) -> str | None:
        """The error code of a per-key ``DeleteObjects`` fault matching ``key`` (no request counted)."""
        for f in self._faults:
            if f.operation == "DeleteObjects" and f.key_contains is not None and f.key_contains in key and f.times != 0:
                f.times -= 1 if f.times > 0 else 0
                return f.code
        return None

    def _raise_if(self, operation: str, key: str = "", *, missing_bucket: str = "NoSuchBucket") -> _Fault | None:
        """Raise what S3 answers before applying the request; return a landed fault to raise after."""
        if not self.exists:
            self.requests[operation] += 1
            raise s3_error(operation, missing_bucket, "The specified bucket does not exist", 404)
        fault = self._request(operation, key)
        if fault is not None and not fault.landed:
            raise s3_error(operation, fault.code)
        return fault

    def _current(self, key: str, *, required: bool = False) -> _Version | None:
        versions = self._keys.get(key) or []
        current = versions[-1] if versions and not versions[-1].marker else None
        if current is None and required:
            raise KeyError(f"{key} is not in {self.bucket}")
        return current

    def _new_version(self, key: str, **kw: Any) -> _Version:
        self._next_version += 1
        v = _Version(f"v{self._next_version:012d}" if self.versioned else "null", self.clock.now_ns(), **kw)
        if self.versioned:
            self._keys.setdefault(key, []).append(v)
        else:
            self._keys[key] = [v]
        if self.on_change is not None:
            self.on_change(key)
        return v

    def _read(self, operation: str, key: str, fn: Callable[[], _T]) -> _T | None:
        """The S3 adapter's read discipline over :meth:`_raise_if` + ``fn``."""
        last: Exception | None = None
        for _attempt in self.read_policy.attempts():
            try:
                with self._lock:
                    self._raise_if(operation, key, missing_bucket="404" if operation == "HeadObject" else "NoSuchBucket")
                    return fn()
            except ClientError as exc:
                refused = bucket_refusal(exc, self.bucket, key=key)
                if refused is not None:
                    raise refused from exc
                if is_not_found(exc):
                    return None
                if not is_transient(exc):
                    raise StoreAccessError(self.bucket, refused_request(exc, key)) from exc
                last = exc
        raise TransientStoreError(f"reading {key} failed after {self.read_policy.max_attempts} attempts: {last}")

    # -- writes --------------------------------------------------------------------------------------
    def put_if_absent(self, key: str, body: bytes, *, metadata: dict[str, str] | None = None,
                      content_type: str = "application/json",
                      checksum_sha256_b64: str | None = None) -> tuple[ConditionalCreateOutcome, str]:
        with self._lock:
            try:
                fault = self._raise_if("PutObject", key)
                if self._current(key) is not None:
                    raise s3_error("PutObject", "PreconditionFailed",
                                   "At least one of the pre-conditions you specified did not hold")
                if checksum_sha256_b64 and checksum_sha256_b64 != base64.b64encode(hashlib.sha256(body).digest()).decode():
                    raise s3_error("PutObject", "BadDigest", "The SHA256 you specified did not match the calculated checksum.")
                self._new_version(key, body=bytes(body), metadata={k.lower(): v for k, v in (metadata or {}).items()},
                                  content_type=content_type, checksum=checksum_sha256_b64)
                if fault is not None:
                    raise s3_error("PutObject", fault.code)
            except ClientError as exc:
                return classify_put_error(exc, self.bucket, key)
        return ConditionalCreateOutcome.CREATED, ""

    def delete(self, key: str) -> None:
        """One ``DeleteObject`` without a version id (a delete marker on a versioned bucket)."""
        with self._lock:
            fault = self._raise_if("DeleteObject", key)
            self._delete_one(key, None)
            if fault is not None:
                raise s3_error("DeleteObject", fault.code)

    def _delete_one(self, key: str, version_id: str | None) -> str | None:
        """Apply one delete; the marker it placed, if any."""
        if version_id is None:
            if self.versioned:  # as on AWS, a marker even on a key never held (moto places none)
                return self._new_version(key).version_id
            if self._keys.pop(key, None) is not None and self.on_change is not None:
                self.on_change(key)
            return None
        versions = self._keys.get(key) or []
        self._keys[key] = [v for v in versions if v.version_id != version_id]
        if not self._keys[key]:
            del self._keys[key]
        if self.on_change is not None:
            self.on_change(key)
        return None

    def delete_objects(self, objects: list[tuple[str, str | None]], *, fence: Callable[[], None] | None = None,
                       after_request: Callable[[], None] | None = None) -> DeleteOutcome:
        """As :func:`lightmetrics.aws.s3_store.delete_objects`: one request per ``DELETE_BATCH_MAX``, in order,
        ``fence`` before and ``after_request`` after each; per-key errors in the outcome."""
        pending = list(dict.fromkeys(objects))
        out = DeleteOutcome(delete_error)
        for start in range(0, len(pending), DELETE_BATCH_MAX):
            chunk = pending[start:start + DELETE_BATCH_MAX]
            if fence is not None:
                fence()
            with self._lock:
                self._raise_if("DeleteObjects")
                for key, version in chunk:
                    code = self._key_fault(key)
                    if code is not None:
                        out.errors[(key, version)] = (code, f"injected {code}")
                        continue
                    out.deleted[(key, version)] = self._delete_one(key, version)
            if after_request is not None:
                after_request()
        return out

    # -- reads ---------------------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        def op() -> bytes:
            v = self._current(key)
            if v is None:
                raise s3_error("GetObject", "NoSuchKey", "The specified key does not exist.")
            return bytes(v.body or b"")
        return self._read("GetObject", key, op)

    def get_range(self, key: str, start: int, end: int) -> bytes | None:
        """As S3's ``GetObject`` with ``Range: bytes=start-(end-1)``: clipped at the object's end;
        a start at or past it is ``InvalidRange`` (416)."""
        if not 0 <= start < end:
            raise ValueError(f"byte range [{start}, {end}) of {key} is empty or negative")

        def op() -> bytes:
            v = self._current(key)
            if v is None:
                raise s3_error("GetObject", "NoSuchKey", "The specified key does not exist.")
            body = v.body or b""
            if start >= len(body):
                raise s3_error("GetObject", "InvalidRange", "The requested range is not satisfiable", 416)
            return bytes(body[start:end])
        return self._read("GetObject", key, op)

    def lines_from(self, key: str, offset: int) -> Generator[bytes, None, None]:
        with self._lock:
            self._raise_if("GetObject", key)
            v = self._current(key)
            if v is None:
                raise s3_error("GetObject", "NoSuchKey", "The specified key does not exist.")
            body = v.body or b""
        if offset >= len(body):
            return  # S3: InvalidRange, which the adapter reads as the object's end
        yield from body[offset:].splitlines(keepends=True)

    def head(self, key: str, *, checksum: bool = False) -> ObjectHead | None:
        def op() -> ObjectHead:
            v = self._current(key)
            if v is None:
                raise s3_error("HeadObject", "404", "Not Found", 404)
            body = v.body or b""
            return ObjectHead(key=key, size=len(body), last_modified_unix_s=float(v.modified_ns // _NS),
                              etag=hashlib.md5(body).hexdigest(), metadata=dict(v.metadata),
                              version_id=v.version_id if self.versioned else None,
                              checksum_sha256_b64=v.checksum if checksum else None)
        return self._read("HeadObject", key, op)

    def require_bucket(self, prefix: str) -> None:
        self.list_page(prefix, max_keys=1)

    def list_page(self, prefix: str, *, max_keys: int = 1000, start_after: str | None = None,
                  delimiter: str | None = None, continuation_token: str | None = None) -> ListPage:
        return self._read("ListObjectsV2", prefix,
                          lambda: self._list(prefix, max_keys, start_after, delimiter, continuation_token)) \
            or ListPage([], [], [], False)

    def _list(self, prefix: str, max_keys: int, start_after: str | None, delimiter: str | None,
              token: str | None) -> ListPage:
        marker = base64.urlsafe_b64decode(token.encode()).decode() if token else (start_after or "")
        keys: list[str] = []
        sizes: list[int] = []
        modified: list[int] = []
        prefixes: list[str] = []
        last, truncated = "", False
        for key in self.keys(prefix):
            if key.encode() <= marker.encode() or (token and delimiter and marker.endswith(delimiter)
                                                   and key.startswith(marker)):
                continue
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            item = key[:cut + len(delimiter or "")] if cut >= 0 else key
            if item == last:
                continue  # a common prefix already returned
            if len(keys) + len(prefixes) >= max_keys:
                truncated = True
                break
            last = item
            if cut >= 0:
                prefixes.append(item)
            else:
                v = self._current(key)
                assert v is not None
                keys.append(key)
                sizes.append(len(v.body or b""))
                modified.append(v.modified_ns // _NS * _NS)
        next_token = base64.urlsafe_b64encode(last.encode()).decode() if truncated else None
        return ListPage(keys, sizes, prefixes, truncated, next_token, modified)

    def list_keys(self, prefix: str, *, limit: int = 1000) -> list[str]:
        return [key for key, _ in self.list_modified(prefix, limit=limit)]

    def list_modified(self, prefix: str, *, limit: int = 1000, start_after: str | None = None,
                      end_at: str | None = None) -> list[tuple[str, int]]:
        """As the S3 adapter's: pages of at most 1,000, stopping at the first key past ``end_at``."""
        entries: list[tuple[str, int]] = []
        token: str | None = None
        while len(entries) < limit:
            page = self.list_page(prefix, max_keys=min(1000, limit - len(entries)),
                                  start_after=None if token else start_after, continuation_token=token)
            for key, modified in zip(page.keys, page.last_modified_ns):
                if end_at is not None and key > end_at:
                    return entries
                entries.append((key, modified))
            token = page.next_token
            if not token:
                break
        return entries

    def versions_of(self, key: str) -> list[ObjectVersion]:
        def op() -> list[ObjectVersion]:
            versions = list(reversed(self._keys.get(key) or []))  # newest first, as S3 lists them
            return [ObjectVersion(key, v.version_id, _datetime_ms(v.modified_ns), marker)
                    for marker in (False, True) for v in versions if v.marker == marker]
        return self._read("ListObjectVersions", key, op) or []


def _datetime_ms(unix_ns: int) -> datetime:
    ms = unix_ns // 1_000_000
    return datetime.fromtimestamp(ms // 1000, tz=timezone.utc).replace(microsecond=(ms % 1000) * 1000)


__all__ = ["InMemoryObjectStore", "NO_WAIT", "s3_error"]
