"""Lambda functions, generically from ``FunctionSpec``: trigger, settings and least-privilege IAM.

Each function gets its own role (or the GC role, for ``gc_role`` functions) whose only policy is
derived from the spec's declarative fields by :func:`policy_statements`; no managed policies.
Functions with trigger ``task`` get no event source: Step Functions (or an operator) invokes them.
The code asset is the repository's ``functions/`` package (so ``functions.ingest.app.handler``
resolves); the ``lightmetrics`` core and the dependencies come from the shared layer.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import ArnFormat, Aws, CfnCondition, CfnOutput, CfnParameter, Duration, Fn, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.components.layer import ARCHITECTURE, RUNTIME
from infra.components.storage import Storage
from infra.config import METRICS_NAMESPACE, ROOT, InfraConfig
from lightmetrics.deployment.resource_types import FunctionSpec, ResourceSpec
from lightmetrics.deployment.settings import Settings
from lightmetrics.operator_tools.policies import PolicyArns, Statement, function_statements

FUNCTIONS_DIR = ROOT / "functions"
_ASSET_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".mypy_cache", ".pytest_cache", "tests")

def camel(name: str) -> str:
    """``index_raw_blobs`` -> ``IndexRawBlobs`` (construct ids)."""
    return "".join(part[:1].upper() + part[1:] for part in name.replace("-", "_").split("_"))


def stage_function_code(src: Path = FUNCTIONS_DIR) -> Path:
    """Copy ``functions/`` (without caches) into a private temp dir; the asset is that dir.

    The asset hash is computed from content, so the temp path does not change it.
    """
    stage = Path(tempfile.mkdtemp(prefix="lm-function-code-"))
    atexit.register(shutil.rmtree, stage, ignore_errors=True)
    shutil.copytree(src, stage / "functions", ignore=_ASSET_IGNORE)
    return stage


def cdk_statement(statement: Statement) -> iam.PolicyStatement:
    """One statement of :mod:`lightmetrics.operator_tools.policies` as a CDK ``PolicyStatement``."""
    return iam.PolicyStatement(sid=statement.get("Sid"), actions=list(statement["Action"]),
                               resources=list(statement["Resource"]), conditions=statement.get("Condition"))


def policy_arns(*, storage: Storage, table_arn: str, secret_arn: str, queues: Mapping[str, sqs.IQueue],
                state_machine_arns: Mapping[str, str] | None = None) -> PolicyArns:
    """The stack's ARNs (tokens) for the shared statements."""
    return PolicyArns(bucket=storage.bucket.bucket_arn, namespace=storage.namespace, table=table_arn,
                      secret=secret_arn, queues={n: q.queue_arn for n, q in queues.items()},
                      state_machines=dict(state_machine_arns or {}))


def policy_statements(
    spec: FunctionSpec,
    *,
    storage: Storage,
    table_arn: str,
    secret_arn: str,
    queues: Mapping[str, sqs.IQueue],
    state_machine_arns: Mapping[str, str] | None = None,
) -> list[iam.PolicyStatement]:
    """Everything ``spec`` may do, and nothing else (logs and X-Ray are added with the function):
    :func:`lightmetrics.operator_tools.policies.function_statements`, the one source the local runtime enforces too."""
    arns = policy_arns(storage=storage, table_arn=table_arn, secret_arn=secret_arn, queues=queues,
                       state_machine_arns=state_machine_arns)
    return [cdk_statement(s) for s in function_statements(spec, arns, storage.spec)]


def secret_policy_arn(stack: Stack, secret_name: str) -> str:
    """The token secret's ARN for IAM: Secrets Manager appends ``-`` and six random characters."""
    return stack.format_arn(
        service="secretsmanager",
        resource="secret",
        resource_name=f"{secret_name}-??????",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


def lm_environment(stack: Stack, settings: Settings, wired: Mapping[str, Any]) -> dict[str, str]:
    """``LM_<FIELD>`` for every Settings field: ``wired`` values (tokens) win, None is omitted."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump().items():
        if name in wired:
            value = wired[name]
        if value is None:
            continue
        if isinstance(value, dict):
            value = stack.to_json_string(value) if value else "{}"
        env[Settings.env_name(name)] = str(value)
    return env


class BuiltFunction:
    def __init__(self, spec: FunctionSpec, function: lambda_.Function, role: iam.IRole, log_group: logs.LogGroup):
        self.spec = spec
        self.function = function
        self.role = role
        self.log_group = log_group
        self.url: lambda_.FunctionUrl | None = None
        self.reserved_concurrency: CfnParameter | None = None


class Functions(Construct):
    """One Lambda per ``FunctionSpec`` with its trigger; ``self.built`` keeps them by name."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        spec: ResourceSpec,
        config: InfraConfig,
        storage: Storage,
        table_arn: str,
        table_name: str,
        layer: lambda_.ILayerVersion,
        queues: Mapping[str, sqs.IQueue],
        state_machine_arns: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        state_machine_arns = dict(state_machine_arns or {})
        stack = Stack.of(self)
        self.built: dict[str, BuiltFunction] = {}
        code = lambda_.Code.from_asset(str(stage_function_code()))
        secret_arn = secret_policy_arn(stack, config.secret_name)

        # LM_QUEUE_URLS: the index queues and DLQs only (the probe, the sweeper and status read it), not
        # the reconciler's shards queue, whose URL only the reconcile function (the fan-out) and the
        # functions reading its depth (the admin API's status) are told
        index_queues = {n for q in spec.queues for n in (q.name, q.dlq_name)}
        queue_urls = {name: q.queue_url for name, q in queues.items() if name in index_queues}
        base_wired: dict[str, Any] = {
            "bucket": storage.bucket.bucket_name,
            "table": table_name,
            "auth_secret_id": config.secret_name,
            "queue_urls": queue_urls,
            # ARNs built from the state machines' names: no reference, so no dependency cycle.
            "state_machine_arns": state_machine_arns,
        }
        # Functions are built http-first so the others can be told the ingest URL.
        ordered = sorted(spec.functions, key=lambda f: f.trigger_kind != "http")
        ingest_url: str | None = None
        for fn_spec in ordered:
            cid = camel(fn_spec.name)
            triggers = [spec.queue(fn_spec.trigger_arg)] if fn_spec.trigger_kind == "queue" else []
            triggers += [spec.shard_queue(fn_spec.shard_queue)] if fn_spec.shard_queue else []
            for q in triggers:
                vis = q.visibility_timeout_s
                if vis < fn_spec.timeout_s:
                    raise ValueError(
                        f"queue {q.name!r}: visibility timeout {vis} s is shorter than function "
                        f"{fn_spec.name!r}'s timeout {fn_spec.timeout_s} s"
                    )
            role: iam.IRole
            if fn_spec.gc_role:
                role = storage.gc_role
            else:
                role = iam.Role(
                    self,
                    f"{cid}Role",
                    assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                    description=f"Lightmetrics {fn_spec.name}: least privilege from the resource spec",
                )
            log_group = logs.LogGroup(
                self,
                f"{cid}Logs",
                retention=log_retention(config.log_retention_days),
            )
            wired = dict(base_wired)
            wired["ingest_url"] = ingest_url if fn_spec.trigger_kind != "http" else None
            # only the fan-out's own function sends to (and is triggered by) its shards queue
            shard_queue = fn_spec.shard_queue or next(
                (q.name for q in spec.shard_queues if q.name in fn_spec.sqs_read_attributes), None)
            wired["reconcile_shards_queue_url"] = queues[shard_queue].queue_url if shard_queue else None
            env = lm_environment(stack, config.settings, wired)
            env.update(
                {
                    "POWERTOOLS_SERVICE_NAME": fn_spec.service,
                    "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
                    "POWERTOOLS_LOG_LEVEL": config.log_level,
                }
            )
            function = lambda_.Function(
                self,
                cid,
                description=fn_spec.description or f"Lightmetrics {fn_spec.name}",
                code=code,
                handler=fn_spec.handler_string,
                runtime=RUNTIME,
                architecture=ARCHITECTURE,
                layers=[layer],
                role=role,
                log_group=log_group,
                tracing=lambda_.Tracing.ACTIVE,
                timeout=Duration.seconds(fn_spec.timeout_s),
                memory_size=fn_spec.memory_mb,
                environment=env,
            )
            log_group.grant_write(role)
            for statement in policy_statements(
                fn_spec, storage=storage, table_arn=table_arn, secret_arn=secret_arn, queues=queues,
                state_machine_arns=state_machine_arns,
            ):
                role.add_to_principal_policy(statement)
            built = BuiltFunction(fn_spec, function, role, log_group)

            if fn_spec.reserved_concurrency_param:
                built.reserved_concurrency = self._reserved_concurrency(stack, function, fn_spec, config)

            kind = fn_spec.trigger_kind
            if kind == "http" and fn_spec.url_auth == "iam":
                # Operators (admin): AWS checks the SigV4 signature before invoking; callers need
                # lambda:InvokeFunctionUrl on this function, granted to operator roles outside the stack.
                built.url = function.add_function_url(
                    auth_type=lambda_.FunctionUrlAuthType.AWS_IAM, invoke_mode=lambda_.InvokeMode.BUFFERED
                )
                CfnOutput(stack, f"{cid}Url", value=built.url.url, description=f"{fn_spec.name} Function URL (IAM)")
            elif kind == "http":
                # Agents are not AWS principals: ingest authenticates each request itself (HMAC
                # bearer token, docs/protocol.md §7) before any S3 request, and reserved
                # concurrency caps what unauthenticated traffic can cost. See docs/deploy.md.
                built.url = function.add_function_url(
                    auth_type=lambda_.FunctionUrlAuthType.NONE, invoke_mode=lambda_.InvokeMode.BUFFERED
                )
                ingest_url = built.url.url
                CfnOutput(stack, f"{cid}Url", value=built.url.url, description=f"{fn_spec.name} Function URL")
            elif kind == "queue":
                function.add_event_source(sqs_event_source(queues[fn_spec.trigger_arg], fn_spec))
            elif kind == "schedule":
                # One rule whatever LM_RECONCILE_SHARDS: the reconciler's run fans out on its shards queue.
                events.Rule(self, f"{cid}Schedule", schedule=events.Schedule.expression(fn_spec.trigger_arg),
                            targets=[targets.LambdaFunction(function)])
                if fn_spec.shard_queue:  # which runs each shard's message, one at a time
                    function.add_event_source(sources.SqsEventSource(
                        queues[fn_spec.shard_queue], batch_size=1, report_batch_item_failures=True))
            self.built[fn_spec.name] = built

    @staticmethod
    def _reserved_concurrency(
        stack: Stack, function: lambda_.Function, fn_spec: FunctionSpec, config: InfraConfig
    ) -> CfnParameter:
        name = fn_spec.reserved_concurrency_param
        assert name
        param = CfnParameter(
            stack,
            name,
            type="Number",
            default=config.ingest_reserved_concurrency_default,
            min_value=-1,
            description=(
                f"Reserved concurrency of {fn_spec.name}: the most concurrent executions (excess "
                "requests are throttled, HTTP 429). 0 stops the function; -1 means no reservation."
            ),
        )
        unset = CfnCondition(stack, f"{name}Unset", expression=Fn.condition_equals(param.value_as_string, "-1"))
        cfn = function.node.default_child
        assert isinstance(cfn, lambda_.CfnFunction)
        cfn.add_property_override(
            "ReservedConcurrentExecutions",
            Fn.condition_if(unset.logical_id, Aws.NO_VALUE, param.value_as_number),
        )
        return param


def log_retention(days: int) -> logs.RetentionDays:
    """CloudWatch Logs retention of ``days`` (CDK context `log_retention_days`), one of the values AWS allows."""
    allowed = {
        1: "ONE_DAY", 3: "THREE_DAYS", 5: "FIVE_DAYS", 7: "ONE_WEEK", 14: "TWO_WEEKS", 30: "ONE_MONTH",
        60: "TWO_MONTHS", 90: "THREE_MONTHS", 120: "FOUR_MONTHS", 150: "FIVE_MONTHS", 180: "SIX_MONTHS",
        365: "ONE_YEAR", 400: "THIRTEEN_MONTHS", 545: "EIGHTEEN_MONTHS", 731: "TWO_YEARS",
        1096: "THREE_YEARS", 1827: "FIVE_YEARS", 2192: "SIX_YEARS", 2557: "SEVEN_YEARS",
        2922: "EIGHT_YEARS", 3288: "NINE_YEARS", 3653: "TEN_YEARS",
    }  # fmt: skip
    if days not in allowed:
        raise ValueError(f"CDK context 'log_retention_days' must be one of {sorted(allowed)}")
    return getattr(logs.RetentionDays, allowed[days])


def sqs_event_source(queue: sqs.IQueue, fn_spec: FunctionSpec) -> sources.SqsEventSource:
    """A queue function's event source: its spec's batch size and batching window (none when 0:
    Lambda invokes with what is there), partial batch responses."""
    return sources.SqsEventSource(
        queue,
        batch_size=fn_spec.batch_size,
        max_batching_window=Duration.seconds(fn_spec.batching_window_s) if fn_spec.batching_window_s else None,
        report_batch_item_failures=True,
    )
