"""What every benchmark target shares: the runtime with latency injected, repeated figures, output.

:class:`BenchEnv` owns one embedded runtime (moto in this process) and sets ``LM_INJECT_LATENCY_MS``
/ ``LM_INJECT_MAX_INFLIGHT`` and makes this process a local host with them
(:mod:`lightmetrics.local.hosting`), so every S3 client built through :mod:`lightmetrics.composition.services` —
collectors' accept contexts, indexers, the walk's Lambda tasks — pays the injected round trip.
Seeding history uses :meth:`BenchEnv.raw_s3` (no injection): it is set-up, not the measurement.
:meth:`BenchEnv.one_request_at_a_time` is the sequential baseline of the background jobs that
have no separate sequential implementation (the reconciler, the reaps): S3 clients built inside it
get the same injected delay with a cap of one request in flight, so the job's own code runs its
own requests one after another — the same steps, the same request count, no overlap.

:class:`Figures` collects one value per repeat for each named figure and summarizes it as median,
min, max and relative spread. :func:`write_report` writes ``<out>/<target>.json`` and
``<out>/<target>.png``.

Example:
    >>> with BenchEnv(latency_ms=20, max_inflight=8) as env:           # doctest: +SKIP
    ...     system = env.system()
    ...     figures = Figures(); figures.add("accept.batches_per_s", 123.0)
    ...     write_report("accept", {"figures": figures.summary()}, "bench-out")
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from lightmetrics.aws.s3_store import s3_client_config
from lightmetrics.harness.testing.latency import ENV_LATENCY_MS, ENV_MAX_INFLIGHT, LatencyInjector, process_injector
from lightmetrics.local.environment import QUIET_POWERTOOLS, local_environment
from lightmetrics.local.hosting import host_from_env, install_from_env
from lightmetrics.local.server import LocalRuntime
from lightmetrics.local.system import LocalSystem, RuntimeSession
from lightmetrics.protocol.clock import Clock, SystemClock
from lightmetrics.protocol.hosting import Host, install


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class Figures:
    """Named figures, one value per repeated run."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = defaultdict(list)

    def add(self, name: str, value: float) -> None:
        self.values[name].append(float(value))

    def median(self, name: str) -> float:
        return statistics.median(self.values[name]) if self.values.get(name) else 0.0

    def summary(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, vals in self.values.items():
            med = statistics.median(vals)
            out[name] = {"median": round(med, 4), "min": round(min(vals), 4), "max": round(max(vals), 4),
                         "spread": round((max(vals) - min(vals)) / med, 3) if med else 0.0, "runs": len(vals)}
        return out


class BenchEnv:
    """An embedded runtime with S3 latency injected for the whole process, and fresh systems on it."""

    def __init__(self, *, latency_ms: float = 20.0, max_inflight: int = 8, runtime: LocalRuntime | None = None) -> None:
        self.latency_ms = latency_ms
        self.max_inflight = max_inflight
        self.rtt_s = latency_ms / 1000.0
        self._own_runtime = runtime is None
        self.runtime = runtime or LocalRuntime(port=0)
        self._saved: dict[str, str | None] = {}
        self._saved_host: Host | None = None
        self.systems: list[LocalSystem] = []

    def __enter__(self) -> Self:
        if self._own_runtime:
            self.runtime.start()
        env = {**local_environment(self.runtime.endpoint_url, {}), **QUIET_POWERTOOLS,
               ENV_LATENCY_MS: str(self.latency_ms), ENV_MAX_INFLIGHT: str(self.max_inflight)}
        for k, v in env.items():
            self._saved[k] = os.environ.get(k)
            os.environ[k] = v
        # This process hosts functions too: its clients get the injector through the host; child
        # processes (collectors) install the same host from the variables above.
        self._saved_host = install_from_env()
        return self

    def __exit__(self, *_exc: Any) -> None:
        for s in self.systems:
            s.stop()
        if self._saved_host is not None:
            install(self._saved_host)
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self._own_runtime:
            self.runtime.stop()

    @property
    def injector(self) -> LatencyInjector:
        """The process-wide injector every services-built S3 client of this run goes through."""
        return process_injector(self.rtt_s, self.max_inflight)

    @property
    def session(self) -> RuntimeSession:
        return RuntimeSession(self.runtime)

    def raw_s3(self) -> Any:
        """An S3 client with no injected latency (for seeding history)."""
        return self.runtime.boto3_client("s3", config=s3_client_config(max_pool=32, component="bench-seed"))

    @contextmanager
    def one_request_at_a_time(self) -> Iterator[LatencyInjector]:
        """S3 clients built inside this block (by this thread or any other: the host is the
        process's) pay the same injected delay with at most ONE request in flight; yields that
        injector. Clients built before keep their own cap.

        Example:
            >>> with env.one_request_at_a_time():                     # doctest: +SKIP
            ...     system.reconciler(system.work_context()).run()     # the same run, sequential
        """
        previous = install(host_from_env({**os.environ, ENV_MAX_INFLIGHT: "1"}))
        try:
            yield process_injector(self.rtt_s, 1)
        finally:
            install(previous)

    def system(self, *, notifications: bool = False, clock: Clock | None = None, **overrides: Any) -> LocalSystem:
        tag = uuid.uuid4().hex[:10]
        system = LocalSystem(self.runtime, bucket=f"lm-bench-{tag}", table=f"lm-bench-{tag}",
                             secret_name=f"lm-bench/{tag}", queue_name_prefix=f"bench{tag}-",
                             clock=clock or SystemClock(), overrides=overrides).provision()
        system.notifications(notifications)
        self.systems.append(system)
        return system

    def effective_rtt(self, system: LocalSystem, samples: int = 15) -> float:
        """Median seconds of one conditional PUT on one caller through an injected client: the
        injected delay plus this machine's own per-request cost (moto, botocore, CPU contention).
        Dividing a wall-clock by it estimates sequential round trips."""
        from lightmetrics.composition.services import s3_client

        assert system.settings is not None
        client = s3_client(system.settings, session=self.session, component="bench-rtt")
        run = uuid.uuid4().hex[:8]
        times = []
        for k in range(samples):
            t0 = time.perf_counter()
            client.put_object(Bucket=system.bucket, Key=f"bench-rtt/{run}/{k}", Body=b"x", IfNoneMatch="*")
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def describe(self) -> dict[str, Any]:
        return {"injected_rtt_ms": self.latency_ms, "max_inflight": self.max_inflight, "cpus": os.cpu_count(),
                "runtime": "moto server in the benchmark process (shares its GIL and cores)"}


def write_report(target: str, report: dict[str, Any], out_dir: str | Path,
                 bars: list[tuple[str, dict[str, Any], dict[str, Any] | None]], ylabel: str,
                 baseline_label: str = "baseline") -> dict[str, str]:
    """Write ``<target>.json`` and ``<target>.png`` (one bar pair per row: measured vs baseline,
    whiskers = min..max over the repeats). ``bars``: (label, measured summary, baseline summary)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / f"{target}.json", out / f"{target}.png"
    report = {**report, "files": {"json": str(json_path), "png": str(png_path)}}
    json_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    _chart(png_path, f"lmctl bench {target}", bars, ylabel, report.get("environment", {}), baseline_label)
    return report["files"]


def _chart(path: Path, title: str, bars: list[tuple[str, dict[str, Any], dict[str, Any] | None]], ylabel: str,
           env: dict[str, Any], baseline_label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(bars) + 2), 4.5), dpi=100)
    width = 0.38
    for i, (_label, measured, baseline) in enumerate(bars):
        for offset, summary, colour, name in ((-width / 2, measured, "tab:blue", "lightmetrics"),
                                              (width / 2, baseline, "tab:grey", baseline_label)):
            if not summary:
                continue
            med = summary["median"]
            err = [[med - summary["min"]], [summary["max"] - med]]
            ax.bar(i + offset, med, width, color=colour, yerr=err, capsize=3, label=name if i == 0 else None)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} (RTT {env.get('injected_rtt_ms')} ms, cap {env.get('max_inflight')})", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    if bars:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
