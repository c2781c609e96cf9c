"""What an AWS error answer means for the caller: retry it later, or stop and say why.

One classification for every adapter (S3, DynamoDB) and for :func:`lightmetrics.work.units.run_unit`:
throttling (``SlowDown``, ``Throttling*``, ``ProvisionedThroughputExceededException``,
``RequestLimitExceeded``), server errors (5xx, ``InternalError``, ``ServiceUnavailable``), timeouts
(``RequestTimeout``), 409/429 and a transaction conflict are **transient**: the same request may
succeed later. Everything else a service answers — ``AccessDenied``, ``NoSuchBucket``,
``ValidationException``, ``ResourceNotFoundException``, a malformed request — is **permanent**: a
retry sends the same request to the same answer, so the work stops at once with
:func:`describe`'s message instead of spending its retry budget. A connection that failed or timed
out (botocore's own errors, ``OSError``) is transient.

Example:
    >>> err = ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
    ...                    "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")
    >>> is_transient(err), describe(err)
    (True, 'PutObject answered SlowDown (503): Please reduce your request rate.')
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

#: Error codes that say "try again later" whatever their HTTP status (a RequestTimeout is a 400).
TRANSIENT_CODES = frozenset({
    # S3
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeTooSkewed", "Throttling",
    "ThrottlingException", "OperationAborted", "ConditionalRequestConflict",
    # DynamoDB (a TransactionCanceledException reaches here only without a failed condition: a conflict)
    "ProvisionedThroughputExceededException", "RequestLimitExceeded", "InternalServerError",
    "TransactionConflictException", "TransactionInProgressException", "TransactionCanceledException",
    # SQS (its throttling answers 403)
    "RequestThrottled",
})
#: Statuses that are transient whatever the code: server errors, a conflicting request, too many requests.
TRANSIENT_STATUSES = frozenset({409, 429})


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_not_found(exc: ClientError) -> bool:
    """A missing key (404; a HEAD's 404 has no code)."""
    return http_status(exc) == 404 or error_code(exc) in ("NoSuchKey", "404", "NotFound")


def is_transient(exc: BaseException) -> bool:
    """Whether the same request may succeed later (module docstring)."""
    if isinstance(exc, ClientError):
        status = http_status(exc)
        return status >= 500 or status in TRANSIENT_STATUSES or error_code(exc) in TRANSIENT_CODES
    return isinstance(exc, (BotoCoreError, OSError))


def describe(exc: ClientError) -> str:
    """One line for a blocker or an operator: the operation, the code, the status and the message."""
    message = str(exc.response.get("Error", {}).get("Message", "")).strip()
    return f"{exc.operation_name} answered {error_code(exc)} ({http_status(exc)})" + (f": {message}" if message else "")


def refused_access(exc: ClientError) -> str:
    """``refused access: <code> (<message>)``: the message names the action refused, and the principal."""
    message = str(exc.response.get("Error", {}).get("Message", "")).strip()
    return f"refused access: {error_code(exc)}" + (f" ({message})" if message else "")


__all__ = ["TRANSIENT_CODES", "TRANSIENT_STATUSES", "describe", "error_code", "http_status", "is_not_found",
           "is_transient", "refused_access"]
