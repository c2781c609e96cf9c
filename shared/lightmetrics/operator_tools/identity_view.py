"""Read-only views of one identity, for ``lmctl show`` and the admin surface.

Example:
    >>> describe_identity(store, KeyCodec(), ident)["accepted"]      # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
from typing import Any

from lightmetrics.protocol.errors import FrameError, ManifestError
from lightmetrics.protocol.frame import decode_frame, summarize_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.protocol.manifests import AcceptedBatchManifest, IdentityConflictManifest
from lightmetrics.protocol.object_store import ObjectStore


def describe_identity(store: ObjectStore, codec: KeyCodec, identity: BatchIdentity) -> dict[str, Any]:
    """Manifest, blob state (present, size, hash check), frame summary and recorded conflicts."""
    manifest_key = codec.accepted(identity)
    info: dict[str, Any] = {"identity": str(identity), "manifest_key": manifest_key, "accepted": False}
    raw = store.get(manifest_key)
    if raw is not None:
        info["accepted"] = True
        try:
            manifest = AcceptedBatchManifest.from_bytes(raw)
        except ManifestError as exc:
            info["manifest_error"] = str(exc)
        else:
            info["manifest"] = manifest.model_dump(mode="json", by_alias=True)
            info["blob"], info["frame"] = _blob_state(store, manifest)
    info["conflicts"] = []
    for key in store.list_keys(codec.quarantine(identity, "0" * 64).rsplit("/", 1)[0] + "/"):
        body = store.get(key)
        if body is None:
            continue
        try:
            info["conflicts"].append(IdentityConflictManifest.from_bytes(body).model_dump(mode="json", by_alias=True))
        except ManifestError as exc:
            info["conflicts"].append({"key": key, "error": str(exc)})
    return info


def _blob_state(store: ObjectStore, manifest: AcceptedBatchManifest) -> tuple[dict[str, Any], dict[str, Any] | None]:
    data = store.get(manifest.raw_blob_key)
    if data is None:
        return {"key": manifest.raw_blob_key, "present": False}, None
    digest = hashlib.sha256(data).hexdigest()
    blob = {
        "key": manifest.raw_blob_key,
        "present": True,
        "bytes": len(data),
        "sha256_matches": digest == manifest.frame_sha256,
    }
    try:
        frame = summarize_frame(decode_frame(data), data)
    except FrameError as exc:
        frame = {"error": str(exc)}
    return blob, frame
