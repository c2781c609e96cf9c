"""Shared fixtures: one embedded runtime (moto server) per test session, a fresh bucket per test."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from ministack_support import MiniStackRuntime

from lightmetrics.acceptance.accept import AcceptContext
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.aws.s3_store import s3_client_config
from lightmetrics.composition.services import accept_context
from lightmetrics.deployment.settings import Settings
from lightmetrics.harness.testing.faults import FaultInjector
from lightmetrics.local.environment import local_environment
from lightmetrics.local.function_code import import_functions
from lightmetrics.local.server import LocalRuntime
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.frame import Sample, encode_frame
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.retry import RetryPolicy

# functions/ is the Lambda code asset, not an installed package: tests import it under its Lambda name
import_functions()

T0_NS = 1_764_000_000_000_000_000  # 2025-11-24T16:00:00Z, a fixed test time


#: The backends a storage test can run on (docs/reliability.md, "Backends the suite runs on"). A module
#: sets ``BACKENDS = ALL_BACKENDS`` (or a test is marked ``@pytest.mark.backends(...)``) and every test of it
#: that uses ``runtime`` runs once per backend, its id naming the backend; others run on moto only.
ALL_BACKENDS = ("moto", "ministack")


@contextlib.contextmanager
def _environment_of(endpoint_url: str) -> Iterator[None]:
    """The process environment pointed at one backend (``AWS_ENDPOINT_URL`` and the rest), restored after."""
    saved = dict(os.environ)
    os.environ.update(local_environment(endpoint_url, {}))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def moto_runtime() -> Iterator[LocalRuntime]:
    rt = LocalRuntime(port=0).start()
    try:
        with _environment_of(rt.endpoint_url):
            yield rt
    finally:
        rt.stop()


@pytest.fixture(scope="session")
def ministack_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniStackRuntime]:
    rt = MiniStackRuntime(tmp_path_factory.mktemp("ministack")).start()
    try:
        yield rt
    finally:
        rt.stop()


@pytest.fixture(scope="session")
def runtime(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The backend a test runs on: moto's server unless the test is parametrized (see ALL_BACKENDS).
    On MiniStack the process environment points at it (AWS_ENDPOINT_URL) until the next moto test."""
    moto = request.getfixturevalue("moto_runtime")  # started first: it sets the session's environment
    if getattr(request, "param", "moto") == "moto":
        yield moto
        return
    rt = request.getfixturevalue("ministack_runtime")
    with _environment_of(rt.endpoint_url):
        yield rt


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "backends(*names): run this test on each named backend (moto, ministack)")
    config.addinivalue_line("markers", "sim_background: collects a result of the simulation's background runs "
                            "(tests/sim_support.py); such tests run last")


# --------------------------------------------------------------------------- the simulation in the background

_SIM_BACKGROUND: list[Any] = []  # the one sim_support.Background of this session, once started


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests collecting the background runs' results go last: the runs have the session to finish."""
    items.sort(key=lambda item: item.get_closest_marker("sim_background") is not None)  # stable


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the simulation's background runs on the idle core when a selected test will collect them."""
    if session.config.option.collectonly or _SIM_BACKGROUND:
        return
    if any(item.get_closest_marker("sim_background") for item in session.items):
        from sim_support import Background

        _SIM_BACKGROUND.append(Background())


@pytest.fixture(scope="session")
def sim_background() -> Any:
    assert _SIM_BACKGROUND, "the background runs start when a sim_background test is selected"
    return _SIM_BACKGROUND[0]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SIM_BACKGROUND:
        terminalreporter.section("deterministic simulation (background runs, tests/sim_support.py)")
        for line in _SIM_BACKGROUND[0].summary_lines():
            terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _SIM_BACKGROUND:
        _SIM_BACKGROUND.pop().stop()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("backends")
    backends = marker.args if marker else getattr(metafunc.module, "BACKENDS", None)
    if backends and "runtime" in metafunc.fixturenames:
        # scope="function": tests keep their written order (each on moto, then MiniStack) instead of pytest
        # regrouping the whole session by backend; switching costs only the environment swap below
        metafunc.parametrize("runtime", list(backends), indirect=True, ids=list(backends), scope="function")


def on_ministack(runtime: Any) -> bool:
    return getattr(runtime, "name", "") == "ministack"


def make_bucket(runtime: LocalRuntime, versioned: bool = True) -> str:
    name = f"lm-test-{uuid.uuid4().hex[:12]}"
    s3 = runtime.boto3_client("s3")
    s3.create_bucket(Bucket=name)
    if versioned:
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


@pytest.fixture
def bucket(runtime: LocalRuntime) -> str:
    return make_bucket(runtime)


@pytest.fixture
def settings(bucket: str) -> Settings:
    return Settings.from_env({}, bucket=bucket, collector_id="collector-test")


@pytest.fixture
def counter() -> RequestCounter:
    return RequestCounter()


@pytest.fixture
def s3(runtime: LocalRuntime, counter: RequestCounter):  # type: ignore[no-untyped-def]
    client = boto3.session.Session().client("s3", endpoint_url=runtime.endpoint_url, config=s3_client_config())
    counter.attach(client)
    return client


@pytest.fixture
def faults(s3) -> FaultInjector:  # type: ignore[no-untyped-def]
    return FaultInjector(s3)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0_NS)


class RecordingMetrics:
    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def add_metric(self, name: str, unit: object, value: float) -> None:
        self.values[name] = self.values.get(name, 0) + value


@pytest.fixture
def metrics() -> RecordingMetrics:
    return RecordingMetrics()


FAST = RetryPolicy(max_attempts=4, base_delay_s=0.0, max_delay_s=0.0, sleep=lambda _s: None)


@pytest.fixture
def ctx(s3, settings: Settings, clock: FrozenClock, metrics: RecordingMetrics) -> AcceptContext:  # type: ignore[no-untyped-def]
    return accept_context(settings, client=s3, clock=clock, metrics=metrics, policy=FAST)


def make_frame(identity: BatchIdentity, variant: float = 0.0, n: int = 3, compress: bool = False) -> bytes:
    samples = [
        Sample(metric="cpu", labels={"host": "h1", "core": str(i)}, ts_unix_ns=T0_NS + i, value=float(i) + variant)
        for i in range(n)
    ]
    return encode_frame(identity, samples, compress=compress)


def ident(n: int = 0, agent: str = "agent-a", boot: str = "boot-1") -> BatchIdentity:
    return BatchIdentity.create(agent, boot, n * 10, n * 10 + 9)


def consume_all(sqs, url: str) -> int:  # type: ignore[no-untyped-def]
    """Receive and delete every message of a queue (PurgeQueue is limited to once a minute)."""
    n = 0
    while True:
        msgs = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30).get("Messages", [])
        if not msgs:
            return n
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                                                         for i, m in enumerate(msgs)])
        n += len(msgs)


# --------------------------------------------------------------------------- CDK (tests/test_infra.py)

#: Context of the session's one synth: a non-empty namespace, so every ARN/filter check means something.
INFRA_TEST_CONTEXT = {"prefix": "lm-test/"}


@pytest.fixture(scope="session")
def cdk_synth(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The CDK app synthesized ONCE per test session: ``.app``, ``.stack``, ``.template``
    (``aws_cdk.assertions.Template``), ``.json`` (the template dict), ``.annotations``, ``.outdir``."""
    import sys
    import types
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)  # the infra/ package lives at the repo root
    os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "18,20")
    from aws_cdk.assertions import Annotations, Template

    from infra.app import build_app
    from infra.components.layer import refresh_shared_package

    refresh_shared_package()  # as `make layer` would: the layer's lightmetrics copy follows shared/
    outdir = tmp_path_factory.mktemp("cdk-out")
    app, stack = build_app(INFRA_TEST_CONTEXT, outdir=str(outdir))
    template = Template.from_stack(stack)
    return types.SimpleNamespace(
        app=app,
        stack=stack,
        template=template,
        json=template.to_json(),
        annotations=Annotations.from_stack(stack),
        outdir=outdir,
        context=dict(INFRA_TEST_CONTEXT),
    )


# --------------------------------------------------------------------------- Spark (tests/test_pipeline*.py)


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """ONE local SparkSession per test run (local[2], Arrow on), with a 1 MB driver result limit so
    no pipeline job can quietly collect a key set."""
    from lightmetrics_pipeline.session import get_spark

    session = get_spark("lightmetrics-tests", conf={"spark.driver.maxResultSize": "1m"})
    yield session
    session.stop()
