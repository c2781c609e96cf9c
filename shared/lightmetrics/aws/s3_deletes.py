"""S3's DeleteObjects for the adapter: up to 1,000 keys a request, fenced, and its per-key outcome.

:func:`delete_objects` is what :meth:`lightmetrics.aws.s3_store.S3ObjectStore.delete_objects`
sends; it answers the port's :class:`~lightmetrics.protocol.object_store.DeleteOutcome`, whose
per-key errors :func:`delete_error` makes botocore's ``ClientError`` so callers classify a refused
key like a single DeleteObject.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from lightmetrics.protocol.object_store import DeleteOutcome

# --- DeleteObjects: up to 1,000 keys a request ------------------------------------------------------
#: S3's limit of keys per DeleteObjects request.
DELETE_BATCH_MAX = 1000
#: HTTP status a per-key DeleteObjects error would have had as a single DeleteObject (the response
#: carries only the code); anything else is a client error (400).
_DELETE_ERROR_STATUS = {"AccessDenied": 403, "NoSuchKey": 404, "NoSuchVersion": 404, "InternalError": 500,
                        "ServiceUnavailable": 503, "SlowDown": 503, "RequestTimeout": 400}


def delete_error(key: str, code: str, message: str) -> ClientError:
    """A per-key DeleteObjects error as the ``ClientError`` a single DeleteObject of ``key`` would
    have raised (so callers classify it as one: transient, access denied, ...).

    >>> delete_error("k", "SlowDown", "Please reduce your request rate.").response["ResponseMetadata"]["HTTPStatusCode"]
    503
    """
    return ClientError({"Error": {"Code": code, "Message": f"{key}: {message}"},
                        "ResponseMetadata": {"HTTPStatusCode": _DELETE_ERROR_STATUS.get(code, 400)}}, "DeleteObjects")


def delete_objects(client: Any, bucket: str, objects: list[tuple[str, str | None]], *,
                   fence: Any = None, after_request: Any = None) -> DeleteOutcome:
    """Delete ``(key, version id or None)`` pairs with one DeleteObjects per ``DELETE_BATCH_MAX``,
    in the order given (a pair twice is sent once). ``fence()`` runs right before each request
    (docs/protocol.md §13 L2: it raises if the lease is lost, and nothing more is sent);
    ``after_request()`` right after each (a crash point). Verbose mode: a delete without a version
    id reports the marker it placed. A request that fails raises (never retried here: a repeated
    marker request would place a second marker); per-key failures are in the outcome's ``errors``.

    Example:
        >>> out = delete_objects(s3, "b", [("k", None)], fence=fence)          # doctest: +SKIP
        >>> out.deleted[("k", None)]                                            # doctest: +SKIP
        'marker-version-id'
    """
    pending = list(dict.fromkeys(objects))
    out = DeleteOutcome(delete_error)
    for start in range(0, len(pending), DELETE_BATCH_MAX):
        chunk = pending[start:start + DELETE_BATCH_MAX]
        spec = [{"Key": k, "VersionId": v} if v else {"Key": k} for k, v in chunk]
        if fence is not None:
            fence()
        r = client.delete_objects(Bucket=bucket, Delete={"Objects": spec, "Quiet": False})
        asked = set(chunk)

        def pair_of(d: dict[str, Any]) -> tuple[str, str | None]:
            # S3 may echo no VersionId for a delete that asked none (and place a marker): by key then
            pair = (d["Key"], d.get("VersionId") or None)
            return pair if pair in asked else (d["Key"], None)

        for d in r.get("Deleted") or []:
            out.deleted[pair_of(d)] = d.get("DeleteMarkerVersionId") or None
        for e in r.get("Errors") or []:
            out.errors[pair_of(e)] = (str(e.get("Code", "")), str(e.get("Message", "")))
        for pair in chunk:
            if pair not in out.deleted and pair not in out.errors:
                out.errors[pair] = ("Missing", "not in the DeleteObjects response")
        if after_request is not None:
            after_request()
    return out


__all__ = ["DELETE_BATCH_MAX", "delete_error", "delete_objects"]
