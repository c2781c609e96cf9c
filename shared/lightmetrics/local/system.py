"""The whole system on the embedded runtime: resources, configuration, event pump, schedules.

``lmctl local up``, ``lmctl demo`` and the tests all assemble the system here, from the one
resource spec: provision the bucket, control table, token secret, index queues with their DLQs,
the bucket notifications and the state machines (the same ASL files as the CDK stack); build the
settings every component reads; run the indexers behind an
:class:`~lightmetrics.local.pump.EventPump` and the reconciler and DLQ sweeper on a
:class:`~lightmetrics.local.pump.Scheduler`. The state machines' Lambda tasks (the walk) run in
the runtime's function host: in-process, bound to this system's settings and clock, when the
runtime is a :class:`LocalRuntime`; resolved from the spec and ``LM_*`` in the server process
when it is a :class:`~lightmetrics.local.server.RemoteRuntime` (the demo).

Example:
    >>> system = LocalSystem(runtime, bucket="b-1", table="t-1").provision()      # doctest: +SKIP
    >>> system.start(reconcile_every_s=5)                                          # doctest: +SKIP
    >>> system.drain(); system.stop()                                              # doctest: +SKIP
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from lightmetrics.admin.blocker_actions import sweep_dlqs
from lightmetrics.aws.queue_probes import SqsCountProbe
from lightmetrics.composition.services import work_context
from lightmetrics.deployment.resource_types import ResourceSpec
from lightmetrics.deployment.resources import SPEC
from lightmetrics.deployment.settings import Settings
from lightmetrics.derived.indexing import KIND_ACCEPTED, KIND_QUARANTINE, KIND_RAW_BLOB
from lightmetrics.derived.reconcile import Reconciler
from lightmetrics.lambda_shell.sqs_batch import sqs_index_handler
from lightmetrics.local.environment import QUIET_POWERTOOLS, local_environment
from lightmetrics.local.provision import (
    provision,
    queue_urls_setting,
    shard_queue_url_setting,
    state_machine_arns_setting,
)
from lightmetrics.local.pump import EventPump, Route, Scheduler, drain
from lightmetrics.local.server import LocalRuntime, RemoteRuntime
from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.work.units import WorkContext

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
                              queue_name_prefix=self.queue_name_prefix, roles=_enforces_iam(self.runtime))
        # A local system is a local host's: the demo's and tests' short waits are allowed here
        # (docs/protocol.md §18 S4), never in configuration a deployed function reads.
        # The fan-out's jitter defaults to none here: the local schedules' periods are seconds, not minutes.
        local = {"queue_probe": "count", "reconcile_jitter_s": 0,
                 "reconcile_shards_queue_url": shard_queue_url_setting(self.made, self.spec), **self.overrides}
        self.settings = Settings.from_env(
            {}, timing_rules=False, bucket=self.bucket, table=self.table, prefix=self.prefix,
            auth_secret_id=self.secret_name, queue_urls=queue_urls_setting(self.made),
            state_machine_arns=state_machine_arns_setting(self.made), **local,
        )
        self.register_task_functions()
        return self

    # -- state machine tasks ----------------------------------------------------------------------
    def function_name(self, name: str) -> str:
        """The local (physical) name of a spec function: what the state machines invoke."""
        return self.queue_name_prefix + name

    def register_task_functions(self, *, counter: Any = None,
                                wrap: Callable[[str, Any], Any] | None = None) -> list[str]:
        """Host the walk tasks in this process, bound to this system (no-op for a remote runtime).

        ``counter`` (a RequestCounter) counts their S3/DynamoDB requests; ``wrap(step, handler)``
        lets tests put a fault in front of a task. Registering again replaces the handlers.
        """
        from lightmetrics.derived.walk import TASK_STEPS
        from lightmetrics.lambda_shell.walk_handler import walk_task_handler

        host = getattr(self.runtime, "function_host", None)
        if host is None or self.settings is None:
            return []
        settings = self.settings
        contexts: dict[str, WorkContext] = {}  # one context (and its clients) per task function: its role's
        lock = threading.Lock()

        def context_of(fn: str) -> Callable[..., WorkContext]:
            def context(s: Any, **kw: Any) -> WorkContext:
                with lock:
                    if fn not in contexts:
                        contexts[fn] = self.work_context(component="walk", counter=counter,
                                                         session=self.principal_session(fn), **kw)
                    return contexts[fn]
            return context

        from lightmetrics.lambda_shell.reap_handler import reap_task_handler
        from lightmetrics.reaps import TASK_STEPS as REAP_STEPS

        names = []
        for fn in dict.fromkeys(f for sm in self.spec.state_machines for f in sm.function_names()):
            sfn = self._sfn_factory(fn)
            if fn in REAP_STEPS:
                step = REAP_STEPS[fn]
                handler = reap_task_handler(step, settings_factory=lambda: settings, work_context_factory=context_of(fn),
                                            sfn_factory=sfn)
            else:
                step = TASK_STEPS[fn]
                handler = walk_task_handler(step, settings_factory=lambda: settings,
                                            work_context_factory=context_of(fn), sfn_factory=sfn)
            host.register(self.function_name(fn), wrap(step, handler) if wrap else handler)
            names.append(self.function_name(fn))
        return names

    def role_session(self, principal: str) -> "RuntimeSession":
        """A session signing as one of the stack's roles that is no function's (the pipeline job role,
        ``pipeline-job``), assumed as the service would; the deployer's only when the system has no roles
        (a principal it has no role for is refused, LookupError, rather than run as the deployer)."""
        roles = self.made.get("roles")
        if not roles:
            return RuntimeSession(self.runtime)
        role = roles.get(principal)
        if role is None:
            raise LookupError(f"no role {principal!r} on this system: it would run as the deployer")
        from lightmetrics.local.principals import assume

        return RuntimeSession(self.runtime, assume(self.runtime.boto3_client, role, self.queue_name_prefix + principal))

    def hosted_as(self, fn: str, handler: Any) -> Any:
        """``handler`` run as function ``fn``'s role: its AWS clients, built when it first runs, sign so
        (the Function URL stand-ins of ``lmctl local up`` host ingest and admin this way)."""
        from dataclasses import replace

        from lightmetrics.protocol.hosting import current, hosted

        def as_role(event: Any, context: Any) -> Any:
            credentials = self.principal_session(fn).credentials
            if not credentials:
                return handler(event, context)
            with hosted(replace(current(), aws_credentials=credentials)):
                return handler(event, context)

        return as_role

    def _sfn_factory(self, fn: str) -> Callable[[], Any]:
        return lambda: self.principal_session(fn).client("stepfunctions")

    def principal_session(self, fn: str) -> "RuntimeSession":
        """A session whose clients sign as function ``fn``'s role (lightmetrics.local.principals); the
        deployer's only when the system has no roles (IAM not enforced). With roles, a name that is no
        function of the spec, or a function whose role is gone, is refused (LookupError): run as the
        deployer, allowed everything, its path would be unchecked."""
        if not self.made.get("roles"):
            return RuntimeSession(self.runtime)
        credentials = _function_credentials(self.runtime, self.function_name(fn))
        if not credentials:
            raise LookupError(f"function {fn!r} has no role on this system: it would run as the deployer")
        return RuntimeSession(self.runtime, credentials)

    def state_machine_arn(self, name: str = "bootstrap-walk") -> str:
        assert self.settings is not None
        return self.settings.state_machine_arns[name]

    def reap_control(self, ctx: WorkContext | None = None, *, session: "RuntimeSession | None" = None,
                     **kwargs: Any) -> Any:
        """A :class:`~lightmetrics.reaps.ReapControl` for this system's reap state machine (its Step Functions
        calls signing as ``session``: the operators', say; the deployer's by default)."""
        from lightmetrics.composition.services import executions
        from lightmetrics.reaps import ReapControl

        sfn = executions((session or RuntimeSession(self.runtime)).client("stepfunctions"))
        return ReapControl(ctx or self.work_context(), sfn,
                           self.state_machine_arn("reap"), **kwargs)

    def walk_control(self, ctx: WorkContext | None = None, *, session: "RuntimeSession | None" = None,
                     **kwargs: Any) -> Any:
        """A :class:`~lightmetrics.derived.walk.WalkControl` for this system's bootstrap walk (signing as
        ``session``, as :meth:`reap_control`)."""
        from lightmetrics.composition.services import executions
        from lightmetrics.derived.walk import WalkControl

        sfn = executions((session or RuntimeSession(self.runtime)).client("stepfunctions"))
        return WalkControl(ctx or self.work_context(), sfn,
                           self.state_machine_arn(), **kwargs)

    # -- configuration for other processes --------------------------------------------------------
    def setting_values(self) -> dict[str, Any]:
        assert self.settings is not None
        import json

        return {"bucket": self.bucket, "table": self.table, "prefix": self.prefix,
                "auth_secret_id": self.secret_name, "queue_urls": json.dumps(self.settings.queue_urls),
                "state_machine_arns": json.dumps(self.settings.state_machine_arns),
                "queue_probe": "count", "reconcile_shards_queue_url": self.settings.reconcile_shards_queue_url,
                "reconcile_jitter_s": self.settings.reconcile_jitter_s, **{k: v for k, v in self.overrides.items()}}

    def environment(self) -> dict[str, str]:
        return local_environment(self.runtime.endpoint_url, self.setting_values())

    def operator_session(self) -> "RuntimeSession":
        """A session signing as the operators' role (the deployer's when the system has no roles): what
        the demo's operator steps run as, as ``lmctl`` does."""
        return self.role_session("operator")

    def operator_credentials(self) -> dict[str, str]:
        """The operators' role's credentials (``lmctl`` runs as it: docs/deploy.md, "Operators");
        none (the deployer's) when the system has no roles."""
        return self.role_session("operator").credentials

    def operator_environment(self) -> dict[str, str]:
        """:meth:`environment` signing as the operators' role: what ``lmctl local up`` exports."""
        from lightmetrics.local.principals import session_environment

        credentials = self.operator_credentials()
        return {**self.environment(), **(session_environment(credentials) if credentials else {})}

    # -- components -----------------------------------------------------------------------------
    def work_context(self, **kwargs: Any) -> WorkContext:
        assert self.settings is not None
        session = kwargs.pop("session", None) or _session(self.runtime)
        return work_context(self.settings, session=session, clock=self.clock, **kwargs)

    def reconciler(self, ctx: WorkContext | None = None, *, shard: int = 0) -> Reconciler:
        """Shard ``shard`` of the reconciler (``LM_RECONCILE_SHARDS``; the only one by default)."""
        assert self.settings is not None
        ctx = ctx or self.work_context(component="reconcile", session=self.principal_session("reconcile"))
        return Reconciler(ctx, self.settings, self._reconcile_probe(), shard=shard)

    def _reconcile_probe(self) -> SqsCountProbe:
        assert self.settings is not None
        urls = self.settings.queue_urls
        sqs = self.principal_session("reconcile").client("sqs")
        return SqsCountProbe(sqs, [u for n, u in urls.items() if not n.endswith("-dlq")],
                             [u for n, u in urls.items() if n.endswith("-dlq")])

    def reconcile_function(self, ctx: WorkContext | None = None, *, rng: Any = None) -> Any:
        """The reconcile function's handler bound to this system, as the reconcile role: a scheduled
        event fans out to the shards queue (``rng`` draws the jitter), a shards-queue event runs its
        shard (:mod:`lightmetrics.lambda_shell.reconcile_handler`)."""
        from lightmetrics.lambda_shell.reconcile_handler import Shards, reconcile_handler

        assert self.settings is not None
        settings = self.settings

        def build(metrics: Any) -> Shards:
            context = ctx or self.work_context(component="reconcile", session=self.principal_session("reconcile"),
                                               metrics=metrics)
            return Shards(settings, context, self._reconcile_probe())

        return reconcile_handler(build=build, rng=rng)

    def reconcile_every_shard(self, ctx: WorkContext | None = None) -> list[dict[str, Any]]:
        """One run of every shard, one after another (what the schedules run in AWS side by side);
        their reports. A shard's error is raised after the others ran."""
        assert self.settings is not None
        ctx = ctx or self.work_context(component="reconcile", session=self.principal_session("reconcile"))
        reports, errors = [], []
        for shard in range(self.settings.reconcile_shards):
            try:
                reports.append(self.reconciler(ctx, shard=shard).run().to_json())
            except Exception as exc:  # the next shard's range is not this one's: run it anyway
                errors.append(exc)
        if errors:
            raise errors[0]
        return reports

    def routes(self) -> list[Route]:
        settings = self.settings
        assert settings is not None
        routes = []
        for name, q in self.made.get("queues", {}).items():
            session = self.principal_session(name)  # the indexer of queue ``name`` is function ``name``
            handler = sqs_index_handler(
                kind=QUEUE_KIND[name], queue=name, settings_factory=lambda: settings,
                work_context_factory=lambda s, session=session, **kw: self.work_context(component="index",
                                                                                         session=session, **kw),
            )
            routes.append(Route(name, q["url"], q["arn"], name, handler, sqs=session.client("sqs")))
        for fn in self.spec.functions:  # the reconciler's shards queue triggers it again, a message at a time
            q = self.made.get("shard_queues", {}).get(fn.shard_queue or "")
            if fn.shard_queue and q and fn.name == "reconcile":
                handler = self.reconcile_function()
                routes.append(Route(fn.shard_queue, q["url"], q["arn"], fn.name, handler,
                                    sqs=self.principal_session(fn.name).client("sqs"), batch_size=1, chaos=False))
        return routes

    def start(self, *, reconcile_every_s: float | None = None, sweep_every_s: float | None = None,
              drop: Callable[[str], bool] | None = None,
              duplicate: Callable[[str], bool] | None = None) -> "LocalSystem":
        for name, value in QUIET_POWERTOOLS.items():  # handlers run in this process
            os.environ.setdefault(name, value)
        self.pump = EventPump(self.runtime.boto3_client("sqs"), self.routes(), drop=drop, duplicate=duplicate).start()
        jobs: dict[str, tuple[float, Any]] = {}
        assert self.settings is not None
        if reconcile_every_s:  # one schedule: its run fans out to the shards queue, which the pump serves
            if self.settings.reconcile_jitter_s >= reconcile_every_s:
                raise ValueError(f"LM_RECONCILE_JITTER_S {self.settings.reconcile_jitter_s} s is not shorter than "
                                 f"the local schedule's {reconcile_every_s} s")
            jobs["reconcile"] = (reconcile_every_s, self.reconcile_function())
        if sweep_every_s:
            ctx = self.work_context(session=self.principal_session("sweep-dlq"))
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
        """The index queues and DLQs (``LM_QUEUE_URLS``)."""
        assert self.settings is not None
        return list(self.settings.queue_urls.values())

    def shard_queue_urls(self) -> list[str]:
        """The shards queues (the fan-outs' messages, delayed ones included, until a shard ran)."""
        return [q["url"] for q in self.made.get("shard_queues", {}).values()]

    def drain(self, timeout_s: float = 60.0) -> bool:
        return drain(self.runtime.boto3_client("sqs"), self.queue_urls() + self.shard_queue_urls(), timeout_s=timeout_s)

    def stop(self) -> None:
        if self.scheduler:
            self.scheduler.stop()
        if self.pump:
            self.pump.stop()


class RuntimeSession:
    """A boto3-session look-alike whose clients all talk to one local runtime (signing with
    ``credentials``, botocore's arguments, if given)."""

    def __init__(self, runtime: LocalRuntime, credentials: dict[str, str] | None = None) -> None:
        self.runtime = runtime
        self.credentials = dict(credentials or {})

    def client(self, service: str, **kwargs: Any) -> Any:
        return self.runtime.boto3_client(service, **{**self.credentials, **kwargs})


def _enforces_iam(runtime: Any) -> bool:
    """Whether ``runtime`` is a moto of ours that enforces IAM (an in-process one that says so, or a
    server process, which always does); other backends (MiniStack) get no roles."""
    return bool(getattr(runtime, "enforce_iam", False)) or isinstance(runtime, RemoteRuntime)


def _function_credentials(runtime: Any, name: str) -> dict[str, str] | None:
    """Function ``name``'s role's credentials on ``runtime`` (in this process's or another's moto)."""
    if isinstance(runtime, LocalRuntime):
        return runtime.function_credentials(name) if runtime.enforce_iam else None
    from lightmetrics.local.principals import function_credentials

    return function_credentials(runtime.boto3_client, runtime.endpoint_url, name)


def _session(runtime: LocalRuntime) -> Any:
    return RuntimeSession(runtime)
