"""``lmctl bench indexer-cpu``: our own CPU per record and per invocation of the indexers.

The real SQS batch handler (:func:`lightmetrics.lambda_shell.sqs_batch.sqs_index_handler`:
Powertools batch processing, the records on its thread pool, the EMF flush) is fed real S3
ObjectCreated notifications in SQS events of 1, 10 and 100 records, over the in-memory adapters
(:mod:`lightmetrics.harness.testing.memory`): no socket, no SDK, no moto, so ``time.process_time``
(every thread of this process) counts the indexer's own CPU and the adapters' dictionary work.
Each invocation indexes records not indexed before (a fresh accepted batch each), as the event
path does. Per kind (the accepted-manifest indexer: 1 GET + 2 PUTs a record; the raw-blob
indexer: 1 HEAD + 1 PUT), invocation CPU ``c(b)`` at batch size ``b`` (the median of the
invocations) is split as ``fixed + b * per_record`` (:func:`fit`).

Not counted: the SDK's CPU per request (botocore's serialisation, SigV4 signing, response
parsing, TLS), which a Lambda pays and the in-memory adapters do not; :func:`sdk_cpu_per_request`
measures botocore's part separately (a stubbed send: no network, no server) so that it can be
added per request.

Example:
    >>> report = run_indexer_cpu(sizes=(1, 10), invocations=3)            # doctest: +SKIP
    >>> report["fit"]["per_record_ms"] > 0                                  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote_plus

from lightmetrics.acceptance.accept import AcceptStatus, accept_batch
from lightmetrics.derived.indexing import KIND_ACCEPTED, KIND_RAW_BLOB
from lightmetrics.harness.bench.workload import batch_frames
from lightmetrics.harness.testing.memory import MemorySystem, memory_system
from lightmetrics.lambda_shell.sqs_batch import sqs_index_handler
from lightmetrics.local.function_host import LambdaContext
from lightmetrics.local.pump import lambda_sqs_event

SIZES = (1, 10, 100)
_QUEUES = {KIND_ACCEPTED: "index-accepted", KIND_RAW_BLOB: "index-raw-blobs"}
_ARN = "arn:aws:sqs:us-east-1:123456789012:{}"
_METRICS_OFF = "POWERTOOLS_METRICS_DISABLED"


def _notification(bucket: str, key: str) -> str:
    """The body S3 sends to SQS for one created object (the fields parse_notification reads and
    the ones S3 adds, so the JSON parse costs what it costs in AWS)."""
    record = {"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
              "eventTime": "2025-11-24T16:00:00.000Z", "eventName": "ObjectCreated:Put",
              "s3": {"s3SchemaVersion": "1.0", "configurationId": "index",
                     "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
                     "object": {"key": quote_plus(key), "size": 512, "eTag": "0" * 32,
                                "sequencer": "0055AED6DCD90281E5"}}}
    return json.dumps({"Records": [record]})


def _accepted(system: MemorySystem, n: int, tag: str) -> list[tuple[str, str]]:
    """``n`` batches accepted (manifest key, blob key), not yet indexed."""
    out = []
    for ident, frame in batch_frames(f"cpu-{tag}", "boot-1", n):
        r = accept_batch(system.accept, ident, frame)
        if r.status is not AcceptStatus.ACCEPTED or not r.manifest_key or not r.blob_key:
            raise RuntimeError(f"accept failed while seeding the benchmark: {r.status}")
        out.append((r.manifest_key, r.blob_key))
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Metrics on, as in Lambda (the local runtime turns them off for the whole process), so the EMF
    line's serialisation is counted; the line itself is dropped, and the warning Powertools gives
    when an invocation added no metric."""
    before = os.environ.get(_METRICS_OFF)
    os.environ[_METRICS_OFF] = "false"
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if before is None:
            os.environ.pop(_METRICS_OFF, None)
        else:
            os.environ[_METRICS_OFF] = before


def _invocation_cpu(kind: str, size: int, invocations: int, warmup: int) -> list[float]:
    """CPU seconds of each measured invocation of the ``kind`` indexer at ``size`` records."""
    system = memory_system()
    batches = _accepted(system, size * (invocations + warmup), f"{kind[6:]}-{size}")
    keys = [m if kind == KIND_ACCEPTED else b for m, b in batches]
    queue = _QUEUES[kind]
    handler = sqs_index_handler(kind=kind, queue=queue, settings_factory=lambda: system.settings,
                                work_context_factory=lambda s, **kw: system.ctx)
    out = []
    for i in range(invocations + warmup):
        chunk = keys[i * size:(i + 1) * size]
        event = lambda_sqs_event([{"MessageId": f"m-{i}-{k}", "ReceiptHandle": "r",
                                   "Body": _notification(system.settings.bucket, key),
                                   "Attributes": {"ApproximateReceiveCount": 1}}
                                  for k, key in enumerate(chunk)], _ARN.format(queue))
        context = LambdaContext(queue)
        with _quiet():
            t0 = time.process_time()
            answer = handler(event, context)
            spent = time.process_time() - t0
        if answer.get("batchItemFailures"):
            raise RuntimeError(f"{queue}: records failed in the benchmark: {answer['batchItemFailures']}")
        if i >= warmup:  # the first invocation builds the container (imports, settings, pools)
            out.append(spent)
    return out


def fit(points: dict[int, float]) -> dict[str, float]:
    """``cpu = fixed + size * per_record`` through the smallest and the largest size's (size, CPU
    seconds): the largest gives the slope its span, the smallest the fixed part least diluted (a
    least-squares fit lets the largest size's noise set the intercept).

    Example:
        >>> f = fit({1: 0.003, 10: 0.012, 100: 0.102})
        >>> round(f["per_record_ms"], 3), round(f["fixed_ms"], 3)
        (1.0, 2.0)
    """
    lo, hi = min(points), max(points)
    slope = (points[hi] - points[lo]) / (hi - lo)
    return {"per_record_ms": slope * 1000, "fixed_ms": (points[lo] - slope * lo) * 1000}


def sdk_cpu_per_request(requests: int = 200) -> float:
    """botocore's CPU per S3 request (build, sign, parse a reply) in ms, its send stubbed: what a
    Lambda adds per request to the adapters-only figure, less TLS."""
    import boto3
    from botocore.awsrequest import AWSResponse

    class _Raw(io.BytesIO):
        def stream(self, **_kw: Any) -> Iterator[bytes]:
            yield self.read()

    def send(request: Any, **_kw: Any) -> AWSResponse:
        return AWSResponse(request.url, 200, {"ETag": '"0"', "x-amz-version-id": "v1"}, _Raw(b""))

    client = boto3.session.Session().client("s3", region_name="us-east-1", aws_access_key_id="bench",
                                            aws_secret_access_key="bench")  # noqa: S106 - never sent
    client.meta.events.register("before-send.s3", send)
    client.put_object(Bucket="b", Key="warm", Body=b"{}")
    t0 = time.process_time()
    for k in range(requests):
        client.put_object(Bucket="b", Key=f"accepted-by-time/date=2025-11-24/hour=16/{k:08d}.json",
                          Body=b'{"manifest_key": "accepted/v1/..."}' * 8, IfNoneMatch="*")
    return (time.process_time() - t0) / requests * 1000


def _machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run_indexer_cpu(*, sizes: tuple[int, ...] = SIZES, invocations: int = 20, warmup: int = 1,
                    kinds: tuple[str, ...] = (KIND_ACCEPTED, KIND_RAW_BLOB),
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Per kind and size: median CPU ms per invocation and per record; per kind the fit
    (fixed + per record); ``fit``: the two indexers' mean (each accepted batch is one record on
    each queue), the figures the cost model's defaults come from."""
    if len(set(sizes)) < 2:
        raise ValueError("at least two batch sizes are needed to split fixed from per-record CPU")
    kinds_out: dict[str, Any] = {}
    for kind in kinds:
        rows = []
        medians: dict[int, float] = {}
        for size in sizes:
            if progress:
                progress(f"{kind} at {size} record(s) a batch")
            cpu = _invocation_cpu(kind, size, invocations, warmup)
            medians[size] = statistics.median(cpu)
            rows.append({"batch_size": size, "invocations": len(cpu),
                         "cpu_ms_per_invocation": medians[size] * 1000,
                         "cpu_ms_per_record": medians[size] * 1000 / size,
                         "min_ms": min(cpu) * 1000, "max_ms": max(cpu) * 1000})
        kinds_out[kind] = {"rows": rows, "fit": fit(medians)}
    mean = {f: statistics.fmean(k["fit"][f] for k in kinds_out.values()) for f in ("per_record_ms", "fixed_ms")}
    return {"target": "indexer-cpu", "clock": "time.process_time (every thread of this process)",
            "machine": _machine(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "params": {"sizes": list(sizes), "invocations": invocations, "warmup": warmup},
            "kinds": kinds_out, "fit": mean, "sdk_cpu_ms_per_request": sdk_cpu_per_request()}
