"""The S3 adapter of the object-store port (:mod:`lightmetrics.protocol.object_store`).

The accept algorithm and every background job talk to :class:`~lightmetrics.protocol.object_store.ObjectStore`;
the only implementation that ships is :class:`S3ObjectStore` (boto3), used against AWS and against
the embedded moto server alike. Error classification lives here, in one place; batch deletes in
:mod:`lightmetrics.aws.s3_deletes`.

Example:
    >>> store = S3ObjectStore(boto3.client("s3"), "my-bucket")       # doctest: +SKIP
    >>> store.put_if_absent("k", b"{}")                               # doctest: +SKIP
    (<ConditionalCreateOutcome.CREATED: 'created'>, '')
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from lightmetrics.aws.errors import error_code, http_status, is_not_found, is_transient
from lightmetrics.aws.s3_deletes import delete_objects
from lightmetrics.protocol.cas import ConditionalCreateOutcome
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


def bucket_refusal(exc: Exception, bucket: str, setting: str = "LM_BUCKET", *, key: str | None = None) -> StoreAccessError | None:
    """The error for an S3 answer that refuses us — the bucket does not exist (``NoSuchBucket``)
    or a 403 — or None. Any S3 client (a raw boto3 one too) maps its errors here, so a missing
    bucket is never mistaken for an empty listing or a missing key. ``setting`` names what
    configured the bucket. A 403 names the operation and ``key`` (the object or prefix asked
    for): a denial may cover one key or last only until a policy propagates, so it is about this
    request, never "the bucket refused access" (docs/protocol.md §11 O4)."""
    if not isinstance(exc, ClientError) or is_transient(exc):
        return None  # a 403 that is transient (RequestTimeTooSkewed) is retried, as aws.errors says
    status, code = http_status(exc), error_code(exc)
    if code == "NoSuchBucket":
        return StoreAccessError(bucket, "does not exist", setting)
    if status == 403 or code in ("AccessDenied", "AllAccessDisabled"):
        return StoreAccessError(bucket, refused_request(exc, key), setting)
    return None


def refused_request(exc: ClientError, key: str | None) -> str:
    """``refused GetObject <key>: 403 AccessDenied (<message>)`` — what was asked, of what, and the answer
    (whose message names the principal and the action refused)."""
    asked = f"{exc.operation_name} {key}" if key is not None else exc.operation_name
    message = str(exc.response.get("Error", {}).get("Message", "")).strip()
    detail = f" ({message})" if message and message not in ("Access Denied", "Forbidden") else ""
    return f"refused {asked}: {http_status(exc)} {error_code(exc)}".strip() + detail


def classify_put_error(exc: Exception, bucket: str, key: str | None = None) -> tuple[ConditionalCreateOutcome, str]:
    """Map one failed conditional PUT of ``key`` to its outcome (see :mod:`lightmetrics.protocol.cas`)."""
    if isinstance(exc, ClientError):
        status, code = http_status(exc), error_code(exc)
        if status == 412 or code == "PreconditionFailed":
            return ConditionalCreateOutcome.EXISTS, code or "412"
        if status == 409 or code == "ConditionalRequestConflict":
            return ConditionalCreateOutcome.CONFLICT, code or "409"
        if is_transient(exc):
            return ConditionalCreateOutcome.UNKNOWN, f"{status} {code}".strip()
        raise bucket_refusal(exc, bucket, key=key) or StoreAccessError(bucket, refused_request(exc, key)) from exc
    if isinstance(exc, (BotoConnectionError, HTTPClientError, BotoCoreError, OSError)):
        return ConditionalCreateOutcome.UNKNOWN, type(exc).__name__
    raise exc


def s3_client_config(timeout_s: int = 5, max_pool: int = 50, component: str = "core") -> BotoConfig:
    """botocore config for the core: our own retries only, so every attempt is classified.

    botocore's retry layer would hide 409s and timeouts from the CAS rules; one attempt per
    call keeps the request counts deterministic. ``component`` tags the User-Agent
    (``lm-component/<name>``) so request totals can be split by component server-side.
    """
    return BotoConfig(
        user_agent_extra=f"lm-component/{component}",
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        max_pool_connections=max_pool,
        # S3 verifies ChecksumSHA256 that we send; avoid botocore adding a second checksum.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


class S3ObjectStore:
    """:class:`ObjectStore` on a boto3 S3 client.

    Reads retry transient failures with the given policy; conditional creates do not (the
    CAS layer owns that loop, because each outcome means something different).
    """

    def __init__(
        self, client: Any, bucket: str, *, read_policy: RetryPolicy | None = None, rng: random.Random | None = None
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.read_policy = read_policy or RetryPolicy()
        self._rng = rng

    def put_if_absent(
        self,
        key: str,
        body: bytes,
        *,
        metadata: dict[str, str] | None = None,
        content_type: str = "application/json",
        checksum_sha256_b64: str | None = None,
    ) -> tuple[ConditionalCreateOutcome, str]:
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": key,
            "Body": body,
            "IfNoneMatch": "*",
            "ContentType": content_type,
        }
        if metadata:
            kwargs["Metadata"] = metadata
        if checksum_sha256_b64:
            # S3 keeps the given SHA-256 either way; naming the algorithm too makes moto keep it
            # as S3 does, so the reconciler's checksum check (D3) runs locally as in AWS.
            kwargs["ChecksumSHA256"] = checksum_sha256_b64
            kwargs["ChecksumAlgorithm"] = "SHA256"
        try:
            self.client.put_object(**kwargs)
        except Exception as exc:  # classified below; anything unexpected re-raises
            return classify_put_error(exc, self.bucket, key)
        return ConditionalCreateOutcome.CREATED, ""

    def _read(self, fn: Callable[[], _T], key: str) -> _T | None:
        last: Exception | None = None
        for _attempt in self.read_policy.attempts(self._rng):
            try:
                return fn()
            except ClientError as exc:
                refused = bucket_refusal(exc, self.bucket, key=key)  # before the 404 test: NoSuchBucket is a 404 too
                if refused is not None:
                    raise refused from exc
                if is_not_found(exc):
                    return None
                if not is_transient(exc):
                    raise StoreAccessError(self.bucket, refused_request(exc, key)) from exc
                last = exc
            except Exception as exc:
                if not is_transient(exc):
                    raise
                last = exc
        raise TransientStoreError(f"reading {key} failed after {self.read_policy.max_attempts} attempts: {last}")

    def get(self, key: str) -> bytes | None:
        def op() -> bytes:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

        return self._read(op, key)

    def get_range(self, key: str, start: int, end: int) -> bytes | None:
        if not 0 <= start < end:
            raise ValueError(f"byte range [{start}, {end}) of {key} is empty or negative")

        def op() -> bytes:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"].read())

        return self._read(op, key)

    def lines_from(self, key: str, offset: int) -> Generator[bytes, None, None]:
        """The object's lines (each with its line end) from byte ``offset``, read only as far as the
        caller iterates (close the generator to stop early); none when ``offset`` is its end."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={offset}-")["Body"]
        except ClientError as exc:
            if error_code(exc) == "InvalidRange":  # the offset is the object's end
                return
            raise
        try:
            yield from body.iter_lines(keepends=True)
        finally:
            body.close()

    def head(self, key: str, *, checksum: bool = False) -> ObjectHead | None:
        """HEAD ``key``; ``checksum=True`` also asks for its stored checksum (``ChecksumMode``:
        the same one request)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if checksum:
            kwargs["ChecksumMode"] = "ENABLED"

        def op() -> ObjectHead:
            r = self.client.head_object(**kwargs)
            sha = r.get("ChecksumSHA256")
            if sha and (r.get("ChecksumType") == "COMPOSITE" or "-" in sha):
                sha = None  # a checksum of part checksums, not of the object's bytes
            return ObjectHead(
                key=key,
                size=int(r.get("ContentLength", 0)),
                last_modified_unix_s=r["LastModified"].timestamp(),
                etag=str(r.get("ETag", "")).strip('"'),
                metadata=dict(r.get("Metadata", {})),
                version_id=r.get("VersionId"),
                checksum_sha256_b64=sha or None,
            )

        return self._read(op, key)

    def require_bucket(self, prefix: str) -> None:
        """Raise :class:`StoreAccessError` unless the bucket exists and lets us list ``prefix``.

        One LIST of at most one key. A HEAD cannot tell (its 404 has no body, so a missing bucket
        looks like a missing key), and HeadBucket needs ``s3:ListBucket`` without a prefix
        condition, which the functions' roles do not have. Commands that would otherwise start
        work on a bucket through HEADs alone check it here first.
        """
        self.list_page(prefix, max_keys=1)

    def list_page(
        self,
        prefix: str,
        *,
        max_keys: int = 1000,
        start_after: str | None = None,
        delimiter: str | None = None,
        continuation_token: str | None = None,
    ) -> ListPage:
        """One page of ``ListObjectsV2`` (transient failures retried like every read)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": max_keys}
        if start_after:
            kwargs["StartAfter"] = start_after
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if continuation_token:
            kwargs["ContinuationToken"] = continuation_token
        page = self._read(lambda: self.client.list_objects_v2(**kwargs), prefix) or {}
        contents = page.get("Contents", [])
        return ListPage(
            keys=[o["Key"] for o in contents],
            sizes=[int(o.get("Size", 0)) for o in contents],
            prefixes=[p["Prefix"] for p in page.get("CommonPrefixes", [])],
            truncated=bool(page.get("IsTruncated")),
            next_token=page.get("NextContinuationToken"),
            last_modified_ns=[int(o["LastModified"].timestamp()) * _NS for o in contents],
        )

    def list_keys(self, prefix: str, *, limit: int = 1000) -> list[str]:
        """Keys under ``prefix`` in key order, at most ``limit`` (paginated)."""
        return [key for key, _ in self.list_modified(prefix, limit=limit)]

    def list_modified(self, prefix: str, *, limit: int = 1000, start_after: str | None = None,
                      end_at: str | None = None) -> list[tuple[str, int]]:
        """``(key, LastModified in Unix ns)`` under ``prefix`` in key order, at most ``limit``:
        keys after ``start_after`` and up to ``end_at`` (inclusive) when given. The listing stops at
        the first page that passes ``end_at``, so a key range costs its own pages (plus at most one).

        LastModified is S3's clock (whole seconds): when the object's PUT began.
        """
        entries: list[tuple[str, int]] = []
        token: str | None = None
        while len(entries) < limit:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix,
                                      "MaxKeys": min(1000, limit - len(entries))}
            if token:
                kwargs["ContinuationToken"] = token
            elif start_after:
                kwargs["StartAfter"] = start_after
            page = self._read(lambda: self.client.list_objects_v2(**kwargs), prefix)
            for obj in (page or {}).get("Contents", []):
                if end_at is not None and obj["Key"] > end_at:
                    return entries
                entries.append((obj["Key"], int(obj["LastModified"].timestamp()) * _NS))
            token = (page or {}).get("NextContinuationToken")
            if not token:
                break
        return entries


    def versions_of(self, key: str) -> list[ObjectVersion]:
        """The versions and delete markers of exactly ``key`` (one ``ListObjectVersions``)."""
        r = self._read(lambda: self.client.list_object_versions(Bucket=self.bucket, Prefix=key), key) or {}
        return [ObjectVersion(v["Key"], v["VersionId"], v["LastModified"], marker)
                for marker, group in ((False, r.get("Versions", [])), (True, r.get("DeleteMarkers", [])))
                for v in group if v["Key"] == key]

    def delete(self, key: str) -> None:
        """One ``DeleteObject`` without a version id (a delete marker on a versioned bucket)."""
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def delete_objects(self, objects: list[tuple[str, str | None]], *, fence: Callable[[], None] | None = None,
                       after_request: Callable[[], None] | None = None) -> DeleteOutcome:
        """:func:`delete_objects` on this bucket."""
        return delete_objects(self.client, self.bucket, objects, fence=fence, after_request=after_request)
