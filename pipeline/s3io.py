"""S3 from inside Spark executors, with boto3 and the core's key codec (no Hadoop S3A jars).

A job describes its bucket once as an :class:`S3Access` (a small picklable value); every Python
worker builds its own boto3 client from it, configured like the core's (one HTTP attempt per
call, our own retries, ``lm-component/<name>`` in the User-Agent) and caches it per process. On
EMR Serverless the client finds the job role's credentials through the default chain; locally
``endpoint_url`` points at the embedded runtime (moto).

Every client carries a :class:`Tally`: a count of responses by ``<operation> <HTTP status>``
(``PutObject 412``), so a job can report — and a test can assert — exactly what it asked S3 and
what S3 answered, including the requests made inside executors.

Example:
    >>> access = S3Access.from_settings(settings)                     # doctest: +SKIP
    >>> with task_tally() as tally:                                  # doctest: +SKIP
    ...     store(access).get("accepted/v1/...")
    >>> tally.counts                                                 # doctest: +SKIP
    Counter({'GetObject 200': 1})
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from lightmetrics.aws.s3_store import S3ObjectStore, bucket_refusal, s3_client_config
from lightmetrics.protocol.cas import ConditionalCreateOutcome, create_object, landed_earlier
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.protocol.object_store import ObjectStore
from lightmetrics.protocol.retry import RetryPolicy


@dataclass(frozen=True)
class S3Access:
    """Where and how a job reaches the authority bucket (picklable: shipped to executors)."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    timeout_s: int = 5
    max_attempts: int = 5
    component: str = "pipeline"
    #: with ``access_key``: a role's temporary credentials (locally, the pipeline job role's)
    session_token: str | None = None
    #: An object store to reach the bucket through instead of a boto3 client (the in-memory store of
    #: a test or of the deterministic simulation); never compared, and not for shipping to executors.
    object_store: ObjectStore | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_settings(cls, settings: Any, *, component: str = "pipeline", endpoint_url: str | None = None,
                      bucket: str | None = None) -> "S3Access":
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        key = secret = token = None
        if endpoint:  # the local runtime: ship its (dummy) credentials to the workers explicitly
            key, secret = os.environ.get("AWS_ACCESS_KEY_ID", "testing"), os.environ.get("AWS_SECRET_ACCESS_KEY", "testing")
            token = os.environ.get("AWS_SESSION_TOKEN")
            region = region or "us-east-1"
        return cls(bucket=bucket or settings.bucket, prefix=settings.prefix, endpoint_url=endpoint, region=region,
                   access_key=key, secret_key=secret, timeout_s=settings.s3_timeout_s,
                   max_attempts=settings.s3_max_attempts, component=component, session_token=token if key else None)

    def with_bucket(self, bucket: str) -> "S3Access":
        return replace(self, bucket=bucket)

    @property
    def codec(self) -> KeyCodec:
        return KeyCodec(self.prefix)

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(max_attempts=self.max_attempts)


# ----------------------------------------------------------------------------------- tallies


@dataclass
class Tally:
    """Responses by ``"<Operation> <status>"`` (``"error"`` for no HTTP response)."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, other: "Tally | dict[str, int]") -> None:
        self.counts.update(other.counts if isinstance(other, Tally) else other)

    def total(self, operation: str | None = None) -> int:
        return sum(n for k, n in self.counts.items() if operation is None or k.split(" ")[0] == operation)

    def statuses(self, operation: str) -> Counter[str]:
        return Counter({k.split(" ", 1)[1]: n for k, n in self.counts.items() if k.split(" ")[0] == operation})

    def to_json(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))


_lock = threading.Lock()
_current: Tally | None = None  # the running task's tally (a Python worker runs one task at a time)
_clients: dict[S3Access, Any] = {}


def _on_response(http_response: Any = None, model: Any = None, **_: Any) -> None:
    tally = _current
    if tally is None or model is None:
        return
    status = getattr(http_response, "status_code", None)
    with _lock:
        tally.counts[f"{model.name} {status if status is not None else 'error'}"] += 1


@contextmanager
def task_tally() -> Iterator[Tally]:
    """Count every S3 response of this process's clients while the block runs."""
    global _current
    tally = Tally()
    previous, _current = _current, tally
    try:
        yield tally
    finally:
        _current = previous


def client(access: S3Access) -> Any:
    """A boto3 S3 client for ``access``, one per process (thread-safe to share)."""
    with _lock:
        c = _clients.get(access)
        if c is None:
            import boto3

            kwargs: dict[str, Any] = {"config": s3_client_config(access.timeout_s, max_pool=64, component=access.component)}
            if access.endpoint_url:
                kwargs["endpoint_url"] = access.endpoint_url
            if access.region:
                kwargs["region_name"] = access.region
            if access.access_key:
                kwargs["aws_access_key_id"] = access.access_key
                kwargs["aws_secret_access_key"] = access.secret_key
                kwargs["aws_session_token"] = access.session_token
            c = boto3.session.Session().client("s3", **kwargs)
            c.meta.events.register("after-call.s3", _on_response)
            _clients[access] = c
        return c


def store(access: S3Access) -> ObjectStore:
    """The object store of ``access``: the one it carries, else the S3 adapter over this process's client."""
    if access.object_store is not None:
        return access.object_store
    return S3ObjectStore(client(access), access.bucket, read_policy=access.policy)


@contextmanager
def s3_errors(bucket: str, setting: str = "LM_BUCKET") -> Iterator[None]:
    """Calls of a raw client (not through :func:`store`) inside the block: a missing bucket or
    denied access raises :class:`~lightmetrics.protocol.object_store.StoreAccessError` naming it and ``setting``."""
    from botocore.exceptions import ClientError

    try:
        yield
    except ClientError as exc:
        refused = bucket_refusal(exc, bucket, setting)
        if refused is None:
            raise
        raise refused from exc


def put_if_absent(access: S3Access, key: str, body: bytes, content_type: str = "application/json") -> str:
    """Conditionally create ``key``: ``"created"`` (also when an attempt of this call landed and
    lost its answer, docs/protocol.md §11.1 CW3) or ``"exists"``; anything else raises."""
    st = store(access)
    result = create_object(st, key, body, policy=access.policy, content_type=content_type)
    if result.outcome is ConditionalCreateOutcome.CREATED or landed_earlier(st, key, body, result):
        return "created"
    if result.outcome is ConditionalCreateOutcome.EXISTS:
        return "exists"
    raise RuntimeError(f"conditional create of {key} did not complete: {result.outcome.value} {result.detail}")


def list_all(access: S3Access, prefix: str, *, delimiter: str | None = None) -> tuple[list[tuple[str, int]], list[str]]:
    """Every ``(key, size)`` under ``prefix`` and, with a delimiter, the common prefixes."""
    st = store(access)
    keys: list[tuple[str, int]] = []
    prefixes: list[str] = []
    token: str | None = None
    while True:
        page = st.list_page(prefix, delimiter=delimiter, continuation_token=token)
        keys.extend(zip(page.keys, page.sizes))
        prefixes.extend(page.prefixes)
        if not (page.truncated and page.next_token):
            return keys, prefixes
        token = page.next_token




# ------------------------------------------------------------------------ executor helpers


def counter_accumulator(spark: Any) -> Any:
    """A Spark accumulator of ``Counter`` (executors add their tallies; the driver reads the sum)."""
    from pyspark.accumulators import AccumulatorParam

    class _CounterParam(AccumulatorParam):  # type: ignore[type-arg]
        def zero(self, value: Counter[str]) -> Counter[str]:
            return Counter()

        def addInPlace(self, a: Counter[str], b: Counter[str]) -> Counter[str]:
            a.update(b)
            return a

    return spark.sparkContext.accumulator(Counter(), _CounterParam())


def row_mapper(fn: Any, columns: list[str], accumulator: Any, *, workers: int = 16, tag: str | None = None) -> Any:
    """A ``mapInPandas`` function: ``fn(row dict) -> list of output row dicts``, run on a thread
    pool per batch (S3 latency bound), every S3 response tallied into ``accumulator``. With
    ``tag``, each input row's ``tag`` column (comma-separated names) is counted as
    ``"candidate <name>"`` in the accumulator too."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from concurrent.futures import ThreadPoolExecutor

        import pandas as pd

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lm-pipeline") as pool:
            for pdf in batches:
                records = pdf.to_dict("records")
                with task_tally() as tally:
                    results = list(pool.map(fn, records))
                counts = Counter(tally.counts)
                if tag is not None:
                    for r in records:
                        for name in str(r[tag]).split(","):
                            counts[f"candidate {name}"] += 1
                accumulator.add(counts)
                rows = [r for rs in results for r in rs]
                yield pd.DataFrame(rows, columns=columns) if rows else pandas_frame({c: [] for c in columns})

    return run


def pandas_frame(columns: dict[str, Any]) -> Any:
    """A pandas frame for ``mapInPandas`` output; empty columns get an explicit object dtype
    (an untyped empty list makes pyarrow hand Spark a ChunkedArray it cannot take)."""
    import pandas as pd

    return pd.DataFrame({k: (pd.Series([], dtype=object) if len(v) == 0 else v) for k, v in columns.items()})


__all__ = ["S3Access", "Tally", "client", "counter_accumulator", "list_all", "pandas_frame", "put_if_absent", "row_mapper",
           "s3_errors", "store", "task_tally"]
