"""The accept algorithm: where a batch becomes accepted, exactly once per identity.

:func:`accept_batch` is the whole of docs/protocol.md §5 after authentication. Every caller — the ingest
Lambda, ``lmctl accept``, the local runtime and the demo's collectors — runs this function.
The numbered comments match the steps in ``docs/protocol.md``.

Invariants it protects:

* **I1 one acceptance** — only the conditional create of ``accepted/v1/<identity>.json`` accepts;
  a 412 there never becomes an acceptance.
* **I2 no false duplicate** — ``duplicate=true`` only after reading the stored manifest and
  seeing the same ``frame_sha256``.
* **I3 conflicts carry evidence** — ``identity_conflict`` is answered only once the quarantine
  manifest exists; otherwise 503 so the agent retries.
* **I4 no dangling manifest** — before answering, the blob the manifest names exists: if the
  blob PUT answered 412 (pre-existing, maybe being garbage-collected), a HEAD after the
  manifest create and, if gone, a re-PUT from the bytes in hand.
* **I5 nothing acknowledged early** — every 200 follows step 5's create or matching read.

Example:
    >>> result = accept_batch(ctx, identity, frame_bytes)        # doctest: +SKIP
    >>> result.status, result.http_status                         # doctest: +SKIP
    ('accepted', 200)
"""

from __future__ import annotations

import base64
import hashlib
import logging
import random
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from lightmetrics.protocol.cas import ConditionalCreateOutcome, CreateResult, create_object
from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.errors import FrameError, ManifestError, UnsupportedVersionError
from lightmetrics.protocol.frame import FRAME_VERSION, WIRE_VERSION, validate_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.protocol.manifests import AcceptedBatchManifest, IdentityConflictManifest
from lightmetrics.protocol.metrics import MetricsSink, NoMetrics
from lightmetrics.protocol.object_store import ObjectStore, StoreAccessError, TransientStoreError
from lightmetrics.protocol.retry import RetryPolicy

log = logging.getLogger(__name__)

RETRY_AFTER_S = 2
#: Object metadata on a conflict resolution record; HEAD reads the decision without a GET.
RESOLUTION_METADATA_KEY = "lm-resolution"


class AcceptStatus(str, Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    IDENTITY_CONFLICT = "identity_conflict"
    UNAVAILABLE = "unavailable"
    INVALID = "invalid"
    UNAUTHORIZED = "unauthorized"
    DENIED = "denied"


HTTP_STATUS = {
    AcceptStatus.ACCEPTED: 200,
    AcceptStatus.DUPLICATE: 200,
    AcceptStatus.IDENTITY_CONFLICT: 409,
    AcceptStatus.UNAVAILABLE: 503,
    AcceptStatus.INVALID: 400,
    AcceptStatus.UNAUTHORIZED: 401,
    AcceptStatus.DENIED: 403,
}

#: lmctl exit codes (README, "Exit codes"): 0 ok, 2 invalid input, 3 identity conflict, 4 unavailable.
EXIT_CODE = {
    AcceptStatus.ACCEPTED: 0,
    AcceptStatus.DUPLICATE: 0,
    AcceptStatus.IDENTITY_CONFLICT: 3,
    AcceptStatus.UNAVAILABLE: 4,
    AcceptStatus.INVALID: 2,
    AcceptStatus.UNAUTHORIZED: 2,
    AcceptStatus.DENIED: 2,
}


@dataclass
class AcceptResult:
    """The answer to one submission; :meth:`to_json` is the HTTP body and ``lmctl accept --json``."""

    status: AcceptStatus
    manifest_key: str | None = None
    blob_key: str | None = None
    frame_sha256: str | None = None
    existing_frame_sha256: str | None = None
    quarantine_key: str | None = None
    resolution: str | None = None
    reason: str | None = None
    retry_after_s: int | None = None
    http_status_override: int | None = None
    #: Steps taken, for logs and tests (not part of the wire body).
    trace: list[str] = field(default_factory=list)

    @property
    def duplicate(self) -> bool:
        return self.status is AcceptStatus.DUPLICATE

    @property
    def http_status(self) -> int:
        return self.http_status_override or HTTP_STATUS[self.status]

    @property
    def exit_code(self) -> int:
        return EXIT_CODE[self.status]

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"status": self.status.value, "duplicate": self.duplicate}
        for name in (
            "manifest_key",
            "blob_key",
            "frame_sha256",
            "existing_frame_sha256",
            "quarantine_key",
            "resolution",
            "reason",
            "retry_after_s",
        ):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body


@dataclass
class AcceptContext:
    """Everything :func:`accept_batch` needs besides the submission; build once per process."""

    store: ObjectStore
    codec: KeyCodec
    collector_id: str
    max_frame_bytes: int
    clock: Clock = DEFAULT_CLOCK
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    metrics: MetricsSink = field(default_factory=NoMetrics)
    rng: random.Random | None = None


def blob_metadata(identity: BatchIdentity) -> dict[str, str]:
    """The identity a blob belongs to, as S3 user metadata (ASCII-only, so hex ids)."""
    return {
        "lm-agent-hex": identity.agent_hex,
        "lm-boot-hex": identity.boot_hex,
        "lm-seq-start": str(identity.seq_start),
        "lm-seq-end": str(identity.seq_end),
    }


def _put_blob(ctx: AcceptContext, identity: BatchIdentity, blob_key: str, frame_bytes: bytes) -> CreateResult:
    """Conditionally create the raw blob; S3 verifies the bytes against the SHA-256 we send."""
    return create_object(
        ctx.store,
        blob_key,
        frame_bytes,
        policy=ctx.policy,
        metadata=blob_metadata(identity),
        content_type="application/vnd.lightmetrics.frame",
        checksum_sha256_b64=base64.b64encode(hashlib.sha256(frame_bytes).digest()).decode(),
        rng=ctx.rng,
    )


def _unavailable(result: AcceptResult, reason: str) -> AcceptResult:
    result.status = AcceptStatus.UNAVAILABLE
    result.reason = reason
    result.retry_after_s = RETRY_AFTER_S
    return result


def accept_batch(ctx: AcceptContext, identity: BatchIdentity, frame_bytes: bytes) -> AcceptResult:
    """Run the accept algorithm for an authenticated submission (docs/protocol.md §5, steps 2-8)."""
    result = AcceptResult(status=AcceptStatus.UNAVAILABLE)
    try:
        return _accept(ctx, identity, frame_bytes, result)
    except (TransientStoreError, StoreAccessError) as exc:
        # Step 8: S3 unreachable or retries exhausted. Nothing was acknowledged.
        return _unavailable(result, f"object store unavailable: {exc}")


def _accept(ctx: AcceptContext, identity: BatchIdentity, frame_bytes: bytes, result: AcceptResult) -> AcceptResult:
    # Step 2: validate. Invalid input writes nothing.
    try:
        validate_frame(frame_bytes, identity, max_frame_bytes=ctx.max_frame_bytes)
    except FrameError as exc:
        result.status = AcceptStatus.INVALID
        result.reason = str(exc)
        return result

    # Step 3: the content hash is over the exact validated bytes.
    sha = hashlib.sha256(frame_bytes).hexdigest()
    blob_key = ctx.codec.raw_blob(sha)
    manifest_key = ctx.codec.accepted(identity)
    result.frame_sha256, result.blob_key, result.manifest_key = sha, blob_key, manifest_key

    # Step 4: the content-addressed blob. 412 = it already exists (continue); 409/5xx/timeout
    # are retried inside create_object and prove nothing.
    blob = _put_blob(ctx, identity, blob_key, frame_bytes)
    result.trace.append(f"blob:{blob.outcome.value}")
    if not blob.outcome.is_final:
        return _unavailable(result, f"raw blob write did not complete ({blob.detail})")
    blob_preexisted = blob.outcome is ConditionalCreateOutcome.EXISTS

    # Step 5: the acceptance record. Its conditional create is the only moment of acceptance.
    manifest = AcceptedBatchManifest(
        agent_id=identity.agent_id,
        boot_id=identity.boot_id,
        seq_start=identity.seq_start,
        seq_end=identity.seq_end,
        frame_sha256=sha,
        frame_bytes=len(frame_bytes),
        raw_blob_key=blob_key,
        accepted_at_unix_ns=ctx.clock.now_ns(),
        collector_id=ctx.collector_id,
        wire_version=WIRE_VERSION,
        frame_version=FRAME_VERSION,
    )
    manifest_bytes = manifest.to_bytes()
    created = create_object(ctx.store, manifest_key, manifest_bytes, policy=ctx.policy, rng=ctx.rng)
    result.trace.append(f"manifest:{created.outcome.value}")

    if created.outcome is ConditionalCreateOutcome.CREATED:
        result.status = AcceptStatus.ACCEPTED
    elif created.outcome is ConditionalCreateOutcome.EXISTS:
        ours = manifest_bytes if created.ambiguous_before else None
        if not _classify_existing(ctx, identity, ours, sha, len(frame_bytes), result):
            return result
    else:
        # 409/timeout/5xx on every attempt: we do not know, so we do not answer 200 (I5).
        return _unavailable(result, f"acceptance record write did not complete ({created.detail})")

    # Step 6: the accept side of the GC handshake (I4).
    if blob_preexisted and not _ensure_blob(ctx, identity, blob_key, frame_bytes, result):
        return result
    ctx.metrics.add_metric(name=f"Accept_{result.status.value}", unit="Count", value=1)
    return result


def _classify_existing(
    ctx: AcceptContext,
    identity: BatchIdentity,
    our_bytes: bytes | None,
    sha: str,
    size: int,
    result: AcceptResult,
) -> bool:
    """Step 5 on 412: read the stored record and decide duplicate / ours / conflict."""
    stored = ctx.store.get(result.manifest_key or "")
    result.trace.append("manifest:get")
    if stored is None:
        # 412 then 404: acceptance records are never deleted. Alarm, and do not guess.
        ctx.metrics.add_metric(name="InvariantViolation", unit="Count", value=1)
        log.error("invariant violation: %s answered 412 then 404", result.manifest_key)
        _unavailable(result, "invariant violation: acceptance record answered 412 then 404")
        return False
    if our_bytes is not None and stored == our_bytes:
        # An earlier attempt of this call timed out but landed (same bytes, same accepted_at
        # and collector): this call accepted. Only checked after an ambiguous attempt, so
        # a genuine second submission is never mistaken for our own write.
        result.status = AcceptStatus.ACCEPTED
        return True
    try:
        existing = AcceptedBatchManifest.from_bytes(stored)
    except UnsupportedVersionError as exc:
        # A newer collector wrote the record (a rolling deploy): this one cannot compare hashes, so
        # it neither acknowledges nor conflicts; the agent retries and a newer collector answers.
        log.error("acceptance record %s is newer than this collector: %s", result.manifest_key, exc)
        _unavailable(result, f"the acceptance record was written by a newer version ({exc})")
        return False
    except ManifestError as exc:
        ctx.metrics.add_metric(name="InvariantViolation", unit="Count", value=1)
        log.error("invariant violation: unreadable acceptance record %s: %s", result.manifest_key, exc)
        _unavailable(result, f"invariant violation: unreadable acceptance record ({exc})")
        return False
    if existing.frame_sha256 == sha:
        result.status = AcceptStatus.DUPLICATE
        return True
    return _record_conflict(ctx, identity, existing, sha, size, result)


def _record_conflict(
    ctx: AcceptContext,
    identity: BatchIdentity,
    existing: AcceptedBatchManifest,
    sha: str,
    size: int,
    result: AcceptResult,
) -> bool:
    """Write the quarantine evidence, then answer 409 (I3); 503 if the evidence is not durable."""
    quarantine_key = ctx.codec.quarantine(identity, sha)
    evidence = IdentityConflictManifest(
        agent_id=identity.agent_id,
        boot_id=identity.boot_id,
        seq_start=identity.seq_start,
        seq_end=identity.seq_end,
        accepted_manifest_key=result.manifest_key or "",
        accepted_raw_blob_key=existing.raw_blob_key,
        accepted_frame_sha256=existing.frame_sha256,
        submitted_raw_blob_key=result.blob_key or "",
        submitted_frame_sha256=sha,
        submitted_frame_bytes=size,
        observed_at_unix_ns=ctx.clock.now_ns(),
        collector_id=ctx.collector_id,
        accepted_collector_id=existing.collector_id,
    )
    written = create_object(ctx.store, quarantine_key, evidence.to_bytes(), policy=ctx.policy, rng=ctx.rng)
    result.trace.append(f"quarantine:{written.outcome.value}")
    result.existing_frame_sha256 = existing.frame_sha256
    if not written.outcome.is_final:
        ctx.metrics.add_metric(name="ConflictEvidenceWriteFailed", unit="Count", value=1)
        _unavailable(result, "identity conflict detected but its evidence could not be recorded; retry")
        return False
    result.status = AcceptStatus.IDENTITY_CONFLICT
    result.quarantine_key = quarantine_key
    result.resolution = _resolution(ctx, identity, sha, result)
    result.reason = (
        f"identity {identity} was accepted with frame {existing.frame_sha256[:12]}..., "
        f"this frame is {sha[:12]}...; keep the batch parked for an operator"
    )
    return True


def _resolution(ctx: AcceptContext, identity: BatchIdentity, sha: str, result: AcceptResult) -> str:
    key = ctx.codec.conflict_resolution(identity, sha)
    try:
        head = ctx.store.head(key)
    except (TransientStoreError, StoreAccessError):
        head = None  # unknown is reported as unresolved: the agent keeps the batch parked
    result.trace.append("resolution:head")
    if head is None:
        return "unresolved"
    decision = head.metadata.get(RESOLUTION_METADATA_KEY, "")
    return decision if decision in ("accept_existing", "deny_identity") else "unresolved"


def _ensure_blob(
    ctx: AcceptContext, identity: BatchIdentity, blob_key: str, frame_bytes: bytes, result: AcceptResult
) -> bool:
    """Step 6: a pre-existing blob may have been collected meanwhile; put it back if so."""
    head = ctx.store.head(blob_key)
    result.trace.append("blob:head")
    if head is not None:
        return True
    again = _put_blob(ctx, identity, blob_key, frame_bytes)
    result.trace.append(f"blob-restore:{again.outcome.value}")
    ctx.metrics.add_metric(name="BlobRestoredAfterGc", unit="Count", value=1)
    if not again.outcome.is_final:
        status = result.status
        _unavailable(result, "raw blob vanished after acceptance and could not be restored yet; retry")
        log.warning("blob %s missing for %s (%s); restore pending", blob_key, identity, status.value)
        return False
    return True
