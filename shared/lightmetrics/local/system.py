"""The whole system on the embedded runtime: resources, configuration, event pump, schedules.

``lmctl local up``, ``lmctl demo`` and the tests all assemble the system here, from the one
resource spec: provision the bucket, control table, token secret, index queues with their DLQs
and the bucket notifications; build the settings every component reads; run the indexers behind
an :class:`~lightmetrics.local.pump.EventPump` and the reconciler and DLQ sweeper on a
:class:`~lightmetrics.local.pump.Scheduler`.

Example:
    >>> system = LocalSystem(runtime, bucket="b-1", table="t-1").provision()      # doctest: +SKIP
    >>> system.start(reconcile_every_s=5)                                          # doctest: +SKIP
    >>> system.drain(); system.stop()                                              # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lightmetrics.blocker_actions import sweep_dlqs
from lightmetrics.clock import DEFAULT_CLOCK, Clock
from lightmetrics.config import Settings
from lightmetrics.indexing import KIND_ACCEPTED, KIND_QUARANTINE, KIND_RAW_BLOB
from lightmetrics.local.environment import QUIET_POWERTOOLS, local_environment
from lightmetrics.local.provision import provision, queue_urls_setting
from lightmetrics.local.pump import EventPump, Route, Scheduler, drain
from lightmetrics.local.server import LocalRuntime
from lightmetrics.reconcile import Reconciler, SqsCountProbe
from lightmetrics.resources import SPEC, ResourceSpec
from lightmetrics.services import work_context
from lightmetrics.sqs_batch import sqs_index_handler
from lightmetrics.work import WorkContext

#: which indexer serves which queue of the spec
QUEUE_KIND = {"index-accepted": KIND_ACCEPTED, "index-raw-blobs": KIND_RAW_BLOB, "index-quarantine": KIND_QUARANTINE}


class LocalSystem:
    def __init__(
        self,
        runtime: LocalRuntime,
        *,
        bucket: str = "lightmetrics-local",
        table: str = "lightmetrics-control",
        secret_name: str = "lightmetrics/ingest-tokens",
        prefix: str = "",
        queue_name_prefix: str = "",
        spec: ResourceSpec = SPEC,
        clock: Clock = DEFAULT_CLOCK,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.runtime, self.spec, self.clock = runtime, spec, clock
        self.bucket, self.table, self.secret_name = bucket, table, secret_name
        self.prefix, self.queue_name_prefix = prefix, queue_name_prefix
        self.overrides = dict(overrides or {})
        self.made: dict[str, Any] = {}
        self.settings: Settings | None = None
        self.pump: EventPump | None = None
        self.scheduler: Scheduler | None = None

    def provision(self) -> "LocalSystem":
        self.made = provision(self.runtime, self.spec, bucket=self.bucket, table=self.table,
                              secret_name=self.secret_name, namespace=self.prefix,
                              queue_name_prefix=self.queue_name_prefix)
        self.settings = Settings.from_env(
            {}, bucket=self.bucket, table=self.table, prefix=self.prefix, auth_secret_id=self.secret_name,
            queue_urls=queue_urls_setting(self.made), queue_probe="count", **self.overrides,
        )
        return self

    # -- configuration for other processes --------------------------------------------------------
    def setting_values(self) -> dict[str, Any]:
        assert self.settings is not None
        import json

        return {"bucket": self.bucket, "table": self.table, "prefix": self.prefix,
                "auth_secret_id": self.secret_name, "queue_urls": json.dumps(self.settings.queue_urls),
                "queue_probe": "count", **{k: v for k, v in self.overrides.items()}}

    def environment(self) -> dict[str, str]:
        return local_environment(self.runtime.endpoint_url, self.setting_values())

    # -- components -----------------------------------------------------------------------------
    def work_context(self, **kwargs: Any) -> WorkContext:
        assert self.settings is not None
        session = kwargs.pop("session", None) or _session(self.runtime)
        return work_context(self.settings, session=session, clock=self.clock, **kwargs)

    def reconciler(self, ctx: WorkContext | None = None) -> Reconciler:
        assert self.settings is not None
        urls = self.settings.queue_urls
        probe = SqsCountProbe(self.runtime.boto3_client("sqs"), [u for n, u in urls.items() if not n.endswith("-dlq")],
                              [u for n, u in urls.items() if n.endswith("-dlq")])
        return Reconciler(ctx or self.work_context(), self.settings, probe)

    def routes(self) -> list[Route]:
        settings = self.settings
        assert settings is not None
        routes = []
        for name, q in self.made.get("queues", {}).items():
            handler = sqs_index_handler(
                kind=QUEUE_KIND[name], queue=name, settings_factory=lambda: settings,
                work_context_factory=lambda s, **kw: self.work_context(component="index", **kw),
            )
            routes.append(Route(name, q["url"], q["arn"], name, handler))
        return routes

    def start(self, *, reconcile_every_s: float | None = None, sweep_every_s: float | None = None,
              drop: Callable[[str], bool] | None = None) -> "LocalSystem":
        for name, value in QUIET_POWERTOOLS.items():  # handlers run in this process
            os.environ.setdefault(name, value)
        self.pump = EventPump(self.runtime.boto3_client("sqs"), self.routes(), drop=drop).start()
        jobs: dict[str, tuple[float, Any]] = {}
        if reconcile_every_s:
            reconciler = self.reconciler(self.work_context(component="reconcile"))
            jobs["reconcile"] = (reconcile_every_s, lambda _e, _c: reconciler.run().to_json())
        if sweep_every_s:
            ctx = self.work_context()
            jobs["sweep-dlq"] = (sweep_every_s, lambda _e, _c: sweep_dlqs(ctx))
        self.scheduler = Scheduler(jobs).start()
        return self

    def notifications(self, enabled: bool) -> None:
        """Switch the bucket's S3 -> SQS notifications off (bulk-loading history) or back on."""
        config: dict[str, Any] = {}
        if enabled:
            arns = {name: q["arn"] for name, q in self.made.get("queues", {}).items()}
            config = self.spec.notification_configuration(arns, namespace=self.prefix)
        self.runtime.boto3_client("s3").put_bucket_notification_configuration(
            Bucket=self.bucket, NotificationConfiguration=config
        )

    def queue_urls(self) -> list[str]:
        assert self.settings is not None
        return list(self.settings.queue_urls.values())

    def drain(self, timeout_s: float = 60.0) -> bool:
        return drain(self.runtime.boto3_client("sqs"), self.queue_urls(), timeout_s=timeout_s)

    def stop(self) -> None:
        if self.scheduler:
            self.scheduler.stop()
        if self.pump:
            self.pump.stop()


class RuntimeSession:
    """A boto3-session look-alike whose clients all talk to one local runtime."""

    def __init__(self, runtime: LocalRuntime) -> None:
        self.runtime = runtime

    def client(self, service: str, **kwargs: Any) -> Any:
        return self.runtime.boto3_client(service, **kwargs)


def _session(runtime: LocalRuntime) -> Any:
    return RuntimeSession(runtime)
