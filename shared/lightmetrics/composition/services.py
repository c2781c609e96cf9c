"""Builds the core's collaborators from :class:`Settings`: one place that wires boto3.

The Lambda handlers, ``lmctl`` and the local runtime all call these factories, so the same
client configuration (one attempt per request, timeouts, request counting) is used everywhere.
What differs between a deployed function and a local one comes from the process's host
(:mod:`lightmetrics.protocol.hosting`): its clock, and hooks on every S3 client (the local runtime's fault
and latency injection). Nothing here reads a test switch.

Example:
    >>> settings = Settings.from_env()                                 # doctest: +SKIP
    >>> ctx = accept_context(settings, counter=RequestCounter())       # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import ProfileNotFound

from lightmetrics.acceptance.accept import AcceptContext
from lightmetrics.acceptance.auth import CachedTokenKeys, secrets_manager_loader
from lightmetrics.acceptance.denylist import DenylistCache
from lightmetrics.acceptance.http_contract import IngestService
from lightmetrics.aws.control_table import ControlTable
from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.aws.s3_store import S3ObjectStore, s3_client_config
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.clock import Clock
from lightmetrics.protocol.errors import ConfigError
from lightmetrics.protocol.hosting import current as current_host
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.protocol.metrics import MetricsSink, NoMetrics
from lightmetrics.protocol.retry import RetryPolicy
from lightmetrics.work.blockers import BlockerStore
from lightmetrics.work.retry_budget import RetryBudget
from lightmetrics.work.units import WorkContext

if TYPE_CHECKING:
    from collections.abc import Callable

    from lightmetrics.admin.status import StatusQueues
    from lightmetrics.protocol.executions import Executions
    from lightmetrics.protocol.queue_probe import QueueProbe


def aws_session(*, profile_name: str | None = None, region_name: str | None = None) -> Any:
    """A boto3 session whose region and credentials are known, else :class:`ConfigError` naming
    what to set (checked locally, before any request). ``AWS_REGION`` counts as well as
    ``AWS_DEFAULT_REGION``: Lambda and the AWS CLI v2 set it, botocore alone does not read it.
    ``profile_name``/``region_name`` win over the environment (``lmctl env --profile/--region``).

    A region that is no region name (``x``) is a configuration error here: botocore would build an
    endpoint from it and retry connecting to a host that does not exist.

    >>> aws_session(region_name="eu-west-1").region_name               # doctest: +SKIP
    'eu-west-1'
    """
    role_credentials = dict(current_host().aws_credentials or {})  # a hosted function's role's, locally
    try:
        session = boto3.session.Session(profile_name=profile_name, region_name=region_name, **role_credentials)
        if session.region_name is None and os.environ.get("AWS_REGION"):
            session = boto3.session.Session(profile_name=profile_name, region_name=os.environ["AWS_REGION"], **role_credentials)
        credentials = session.get_credentials() if session.region_name else None
    except ProfileNotFound as exc:
        raise ConfigError(f"{exc}: set AWS_PROFILE (lmctl --profile) to a profile of ~/.aws/config") from None
    if session.region_name is None:
        raise ConfigError("no AWS region: set AWS_REGION (lmctl --region; or AWS_DEFAULT_REGION, or a profile's "
                          "region) to the stack's region")
    if not _REGION_FORM.match(session.region_name):
        raise ConfigError(f"AWS region {session.region_name!r} is not a region name (like eu-west-1): set AWS_REGION "
                          f"(lmctl --region; or AWS_DEFAULT_REGION, or a profile's region) to the stack's region")
    if credentials is None:
        raise ConfigError("no AWS credentials: set AWS_PROFILE (lmctl --profile), or AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY (for the local runtime: the exports `lmctl local up` prints)")
    return session


#: The form every AWS region name has (``eu-west-1``, ``us-gov-west-1``, ``cn-north-1``). Only the form:
#: a region newer than this botocore passes; a well-formed one that does not exist fails at the first request.
_REGION_FORM = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")


def s3_client(
    settings: Settings, *, session: Any = None, counter: RequestCounter | None = None, component: str = "core"
) -> Any:
    session = session or aws_session()
    client = session.client("s3", config=s3_client_config(settings.s3_timeout_s, component=component))
    if counter is not None:
        counter.attach(client)
    for hook in current_host().s3_client_hooks:  # none on AWS; the local runtime's injectors
        hook(client)
    return client


def _store(
    settings: Settings, session: Any, client: Any, counter: RequestCounter | None, policy: RetryPolicy | None,
    component: str,
) -> tuple[S3ObjectStore, RetryPolicy]:
    """The S3 store and retry policy every context shares (one attempt per call, our retries)."""
    client = client or s3_client(settings, session=session, counter=counter, component=component)
    policy = policy or RetryPolicy(max_attempts=settings.s3_max_attempts)
    return S3ObjectStore(client, settings.bucket, read_policy=policy), policy


def accept_context(
    settings: Settings,
    *,
    session: Any = None,
    client: Any = None,
    counter: RequestCounter | None = None,
    clock: Clock | None = None,
    metrics: MetricsSink | None = None,
    policy: RetryPolicy | None = None,
) -> AcceptContext:
    """Collaborators of the accept algorithm; ``clock`` defaults to the host's."""
    store, policy = _store(settings, session, client, counter, policy, "ingest")
    return AcceptContext(
        store=store,
        codec=KeyCodec(settings.prefix),
        collector_id=settings.collector_id,
        max_frame_bytes=settings.max_frame_bytes,
        clock=clock if clock is not None else current_host().clock,
        policy=policy,
        metrics=metrics or NoMetrics(),
    )


def token_keys(settings: Settings, *, session: Any = None) -> CachedTokenKeys:
    session = session or aws_session()
    client = session.client("secretsmanager")
    return CachedTokenKeys(secrets_manager_loader(settings.auth_secret_id, client), settings.secret_cache_s)


def ingest_service(settings: Settings, **kwargs: Any) -> IngestService:
    session = kwargs.pop("session", None)
    denylist = DenylistCache(control_table(settings, session=session), settings.denylist_ttl_s)
    return IngestService(accept_context(settings, session=session, **kwargs), token_keys(settings, session=session),
                         denylist)


def control_table(settings: Settings, *, session: Any = None, counter: RequestCounter | None = None) -> ControlTable:
    session = session or aws_session()
    client = session.client("dynamodb")
    if counter is not None:
        counter.attach(client)
    return ControlTable(client, settings.table)


def work_context(
    settings: Settings,
    *,
    session: Any = None,
    client: Any = None,
    counter: RequestCounter | None = None,
    clock: Clock | None = None,
    metrics: MetricsSink | None = None,
    policy: RetryPolicy | None = None,
    component: str = "background",
) -> WorkContext:
    """Collaborators of background work (indexers, reconciler, walks, reaps); ``clock`` defaults to
    the host's."""
    clock = clock if clock is not None else current_host().clock
    store, policy = _store(settings, session, client, counter, policy, component)
    table = control_table(settings, session=session, counter=counter)
    return WorkContext(
        store=store,
        codec=KeyCodec(settings.prefix),
        budget=RetryBudget(table, max_count=settings.retry_budget_count, max_age_s=settings.retry_budget_age_s,
                           clock=clock),
        blockers=BlockerStore(table, clock),
        clock=clock,
        metrics=metrics or NoMetrics(),
        policy=policy,
        table=table,
        settings=settings,
        sqs_factory=lambda: (session or aws_session()).client("sqs"),
    )


def queue_probe(settings: Settings, *, session: Any = None) -> "QueueProbe":
    """The reconciler's view of the index queues (``LM_QUEUE_PROBE``)."""
    from lightmetrics.aws.queue_probes import CloudWatchAgeProbe, SqsCountProbe

    session = session or aws_session()
    sqs = session.client("sqs")
    queues = {n: u for n, u in settings.queue_urls.items() if not n.endswith("-dlq")}
    dlqs = [u for n, u in settings.queue_urls.items() if n.endswith("-dlq")]
    if settings.queue_probe == "count":
        return SqsCountProbe(sqs, list(queues.values()), dlqs)
    names = [u.rstrip("/").rsplit("/", 1)[-1] for u in queues.values()]
    return CloudWatchAgeProbe(sqs, session.client("cloudwatch"), names, list(queues.values()), dlqs)


def step_functions_client(*, session: Any = None) -> Any:
    """A Step Functions client: the walk's and the reap's ``continue`` tasks start their next execution."""
    return (session or boto3.session.Session(**(current_host().aws_credentials or {}))).client("stepfunctions")


def executions(client: Any = None, *, session: Any = None) -> "Executions":
    """The executions port (the walk's and the reap's, their controls') on the Step Functions
    ``client`` given, else on a new one (:func:`step_functions_client`)."""
    from lightmetrics.aws.step_functions import StepFunctionsExecutions

    return StepFunctionsExecutions(client if client is not None else step_functions_client(session=session))


def queue_depths(sqs: "Callable[[], Any]") -> "StatusQueues":
    """The queue depths ``lmctl status`` and the admin API's status read, on the SQS client ``sqs()``
    makes (:meth:`~lightmetrics.work.units.WorkContext.sqs`: once, on the first read)."""
    from lightmetrics.aws.sqs_queues import SqsQueueDepths

    return SqsQueueDepths(sqs)
