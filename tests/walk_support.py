"""Test support for the walk's record checks (docs/protocol.md §13 W4, W5).

The walk places a record's hour by the ``LastModified`` its listing returns (S3's clock), which in
AWS lies within the boundary margin of the record's ``accepted_at_unix_ns``. Tests accept batches
on frozen clocks, while moto stamps ``LastModified`` with the real time; :func:`set_last_modified`
gives a seeded record the ``LastModified`` S3 would have given it, so history of many hours (and
reaped hours) can be written directly and cheaply.
"""

from __future__ import annotations

from datetime import datetime, timezone

_NS = 1_000_000_000


def set_last_modified(bucket: str, key: str, unix_ns: int) -> None:
    """Set the current version of ``bucket``/``key`` in the session's in-process moto server to
    ``LastModified = unix_ns`` (whole seconds, as S3 keeps it).

    >>> set_last_modified("lm-test-1", "accepted/v1/agent=61/boot=62/...json", T0_NS)  # doctest: +SKIP
    """
    from moto.s3.models import s3_backends

    stamp = datetime.fromtimestamp(unix_ns // _NS, tz=timezone.utc).replace(tzinfo=None)  # moto keeps naive UTC
    for account in list(s3_backends.keys()):
        buckets = s3_backends[account]["global"].buckets
        if bucket in buckets:
            obj = buckets[bucket].keys.get(key)
            if obj is None:
                raise KeyError(f"{key} is not in {bucket}")
            obj.last_modified = stamp
            return
    raise KeyError(f"bucket {bucket} is not in the in-process moto server")


def record_times_as_s3_would(bucket: str, results: list, accepted_at_ns: list[int]) -> None:  # type: ignore[type-arg]
    """Give each accepted record (``AcceptResult``) the ``LastModified`` of its acceptance time."""
    for result, at in zip(results, accepted_at_ns, strict=True):
        set_last_modified(bucket, result.manifest_key, at)
