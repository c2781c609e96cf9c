"""Latency and concurrency injection (issue 9 item 1): verified by counting, never by timing."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ident, make_frame

from lightmetrics.acceptance.accept import AcceptStatus, accept_batch
from lightmetrics.composition.services import s3_client
from lightmetrics.deployment.settings import Settings
from lightmetrics.harness.testing.faults import FaultRule
from lightmetrics.harness.testing.latency import LatencyInjector, install_from_env, settings_from_env
from lightmetrics.local.hosting import host_from_env
from lightmetrics.protocol.hosting import hosted


def test_in_flight_requests_never_exceed_the_cap_and_reach_it(s3, bucket):  # type: ignore[no-untyped-def]
    cap, callers = 3, 12
    full = threading.Event()
    holders: list[int] = []

    def sleep(_s: float) -> None:
        # Hold each slot until the cap is reached once, so reaching it is certain, not timing luck.
        holders.append(inj.inflight)
        if inj.inflight >= cap:
            full.set()
        assert full.wait(10)

    inj = LatencyInjector(delay_s=0.02, max_inflight=cap, sleep=sleep)
    inj.attach(s3)
    inj.attach(s3)  # idempotent: one wrapper, one slot per request

    def put(n: int) -> None:
        s3.put_object(Bucket=bucket, Key=f"k/{n}", Body=b"x", IfNoneMatch="*")

    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(put, range(callers)))
    assert inj.requests == callers and inj.delays == callers
    assert inj.peak_inflight == cap and max(holders) == cap and inj.inflight == 0
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == callers


def test_sequential_accept_pays_two_delays_one_at_a_time(s3, ctx, counter):  # type: ignore[no-untyped-def]
    order: list[str] = []
    inj = LatencyInjector(delay_s=0.02, max_inflight=8, sleep=lambda s: order.append(f"delay {s}"))
    inj.attach(s3)
    s3.meta.events.register("before-send", lambda event_name, **_: order.append(event_name.rsplit(".", 1)[-1]))
    i = ident(1)
    with counter.operation("accept") as op:
        assert accept_batch(ctx, i, make_frame(i)).status is AcceptStatus.ACCEPTED
    assert op.total == 2 and inj.requests == 2 and inj.delays == 2
    # each round trip is announced, then delayed, before the next one starts: 2 sequential round trips
    assert order == ["PutObject", "delay 0.02", "PutObject", "delay 0.02"]
    assert inj.peak_inflight == 1


def test_faults_answered_locally_get_no_latency_but_are_counted(s3, ctx, counter, faults):  # type: ignore[no-untyped-def]
    inj = LatencyInjector(delay_s=0.0, max_inflight=2)
    inj.attach(s3)
    faults.add(FaultRule(fault="503", operation="PutObject", key_contains="raw-blobs/v1/", times=1))
    i = ident(2)
    with counter.operation("accept") as op:
        assert accept_batch(ctx, i, make_frame(i)).status is AcceptStatus.ACCEPTED
    assert op.total == 3  # the refused attempt, then blob and manifest
    assert inj.requests == 2  # only what really went to S3


def test_env_configures_one_injector_per_process(runtime, bucket):  # type: ignore[no-untyped-def]
    assert settings_from_env({}) is None
    assert settings_from_env({"LM_INJECT_LATENCY_MS": "20", "LM_INJECT_MAX_INFLIGHT": "8"}) == (0.02, 8)
    assert settings_from_env({"LM_INJECT_LATENCY_MS": "5"}) == (0.005, 8)
    for bad in ({"LM_INJECT_LATENCY_MS": "fast"}, {"LM_INJECT_MAX_INFLIGHT": "0"}, {"LM_INJECT_LATENCY_MS": "-1"}):
        with pytest.raises(ValueError):
            settings_from_env(bad)
    env = {"LM_INJECT_LATENCY_MS": "0", "LM_INJECT_MAX_INFLIGHT": "4"}
    settings = Settings.from_env({}, bucket=bucket)
    with hosted(host_from_env(env)):  # a local host built from these variables (as a collector's is)
        a, b = s3_client(settings), s3_client(settings)
    inj = install_from_env(a, env)  # the same process-wide injector services.s3_client attached
    assert inj is not None and inj.max_inflight == 4 and install_from_env(b, env) is inj
    before = inj.requests
    a.head_bucket(Bucket=bucket)
    b.head_bucket(Bucket=bucket)
    assert inj.requests == before + 2


def test_a_window_counts_only_its_own_requests_and_their_peak_in_flight() -> None:
    """What the job benchmarks assert instead of timings: the peak in flight inside a block."""
    inj = LatencyInjector(delay_s=0.0, max_inflight=4)
    inside = threading.Barrier(3)

    def overlapped() -> None:
        inj.through(lambda: inside.wait(timeout=10))  # three calls hold their slots at once

    inj.through(lambda: None)  # before the windows: counted by the injector, by no window
    with inj.window() as outer:
        with inj.window() as one_at_a_time:
            inj.through(lambda: None)
            inj.through(lambda: None)
        with ThreadPoolExecutor(3) as pool:
            for f in [pool.submit(overlapped) for _ in range(3)]:
                f.result()
    assert one_at_a_time == {"requests": 2, "peak_inflight": 1}
    assert outer == {"requests": 5, "peak_inflight": 3}
    assert inj.requests == 6 and inj.peak_inflight == 3
