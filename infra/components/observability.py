"""Alarms (all routed to one SNS topic) and a dashboard. docs/runbook.md has one entry per alarm.

Alarm kinds (the suffix of every alarm name, and the runbook heading):

* ``5xxRate`` (HTTP functions): 5xx answers (Powertools metric ``Ingest5xx``) plus crashed
  invocations (Lambda ``Errors``, which the Function URL turns into 502) per 100 invocations;
* ``Throttles`` (every function): Lambda ``Throttles``, i.e. the reserved concurrency is exhausted;
* ``InvariantViolation`` (every function): the Powertools metric the core emits when an
  acceptance record vanished or is unreadable — should never happen;
* ``Errors`` (non-HTTP functions): crashed invocations;
* ``DlqNotEmpty`` / ``OldestMessage`` (every index queue): dead letters; indexing falling behind;
  ``DlqNotEmpty`` (the reconciler's shards queue): a shard message whose runs failed on every receive;
* ``ExecutionsFailed`` (every state machine): executions that failed, timed out or were aborted;
* ``NewConflicts`` (``index-quarantine``, ``walk-page``): an identity conflict was registered;
* ``GcRestored`` (GC-role functions, ``reap-gc``): GC restored a blob it had marked (a race caught);
* ``ReconcilerStuck`` (``reconcile``): shards that never ran, failed their last run or finished none
  for an hour, as shard 0 counts them — or shard 0 stopped reporting (missing data breaches);
* ``RetentionUnfinished`` (``reap-retention``): a retention hour was left skipped or blocked.

``lmctl status`` calls stuck what these alarms fire for (docs/protocol.md §12 R9; the table in
docs/runbook.md, "What lmctl status calls stuck").
"""

from __future__ import annotations

from aws_cdk import Aws, Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from constructs import Construct

from infra.components.functions import BuiltFunction, camel
from infra.components.queues import BuiltQueue
from infra.components.statemachines import BuiltStateMachine
from infra.config import METRICS_NAMESPACE, InfraConfig
from lightmetrics.acceptance.accept import AcceptStatus
from lightmetrics.deployment.resource_types import ShardQueueSpec
from lightmetrics.derived.reconcile_state import lag_limit_s

RUNBOOK = "docs/runbook.md"

#: Powertools metric names the alarms read (emitted by functions/ingest/app.py and accept.py).
INGEST_5XX_METRIC = "Ingest5xx"
INVARIANT_METRIC = "InvariantViolation"
#: emitted by lightmetrics.work.units.run_unit when a unit of background work becomes a blocker
BLOCKERS_METRIC = "BlockersOpened"
#: emitted by the reconciler after each run (seconds behind the first open hour)
RECONCILER_LAG_METRIC = "ReconcilerLagSeconds"
#: emitted by reconciler shard 0 after each run: shards stuck (never ran, last run failed, none finished for an hour)
RECONCILER_STUCK_METRIC = "ReconcilerShardsStuck"
#: emitted by the retention task when an hour is left skipped or blocked (it cannot finish yet)
RETENTION_UNFINISHED_METRIC = "RetentionHoursUnfinished"
#: emitted when an accepted batch's blob is missing or of the wrong size
INTEGRITY_METRIC = "IntegrityViolation"
ACCEPT_METRICS = tuple(f"Accept_{s.value}" for s in AcceptStatus)
#: functions that run repair_accepted (a missing or wrong-size blob raises IntegrityViolation) or
#: index a raw blob (rule D6: a blob whose S3 SHA-256 differs from its key)
INTEGRITY_FUNCTIONS = ("reconcile", "walk-page", "index-raw-blobs")
INGEST_EXTRA_METRICS = ("ConflictEvidenceWriteFailed", "BlobRestoredAfterGc")
#: emitted by lightmetrics.derived.indexing.index_quarantine when a conflict's registry item is first created
CONFLICTS_METRIC = "ConflictsRegistered"
#: emitted by lightmetrics.reaps.gc when a settle restores a marked blob (each one is a race the handshake caught)
GC_RESTORED_METRIC = "GcRestored"
#: the functions that run index_quarantine: the event path, and the walk (a conflict whose event was lost)
CONFLICT_FUNCTIONS = ("index-quarantine", "walk-page")


def app_metric(name: str, service: str, statistic: str = "Sum", period: Duration | None = None) -> cw.Metric:
    return cw.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"service": service},
        statistic=statistic,
        period=period or Duration.minutes(5),
    )


class Observability(Construct):
    """The alarm topic (created, or imported by ARN), the alarms and the dashboard."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: InfraConfig,
        functions: list[BuiltFunction],
        queues: list[BuiltQueue],
        state_machines: list[BuiltStateMachine] | None = None,
        shard_queues: list[BuiltQueue] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        state_machines, shard_queues = state_machines or [], shard_queues or []
        self._prefix = config.stack_name
        if config.alarm_topic_arn:
            self.topic: sns.ITopic = sns.Topic.from_topic_arn(self, "AlarmTopic", config.alarm_topic_arn)
        else:
            topic = sns.Topic(self, "AlarmTopic", display_name="Lightmetrics alarms", enforce_ssl=True)
            if config.alarm_email:
                topic.add_subscription(subs.EmailSubscription(config.alarm_email))
            self.topic = topic
        self.alarms: list[cw.Alarm] = []

        for built in functions:
            fn, spec = built.function, built.spec
            cid = camel(spec.name)
            if spec.trigger_kind == "http":
                inv = fn.metric_invocations(statistic="Sum", period=Duration.minutes(5))
                errors = fn.metric_errors(statistic="Sum", period=Duration.minutes(5))
                e5xx = app_metric(INGEST_5XX_METRIC, spec.service)
                rate = cw.MathExpression(
                    expression="IF(inv > 0, 100 * (FILL(e5xx, 0) + FILL(errors, 0)) / inv, 0)",
                    using_metrics={"inv": inv, "e5xx": e5xx, "errors": errors},
                    label=f"{spec.name} 5xx per 100 invocations",
                    period=Duration.minutes(5),
                )
                self._alarm(
                    f"{cid}5xxRate",
                    rate,
                    threshold=config.ingest_5xx_rate_percent,
                    evaluation_periods=3,
                    datapoints=2,
                    comparison=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
                    what=f"{spec.name}: more than {config.ingest_5xx_rate_percent}% of requests answered 5xx",
                    anchor="5xxrate",
                )
            else:
                self._alarm(
                    f"{cid}Errors",
                    fn.metric_errors(statistic="Sum", period=Duration.minutes(5)),
                    threshold=1,
                    what=f"{spec.name}: invocations crashed",
                    anchor="errors",
                )
            self._alarm(
                f"{cid}Throttles",
                fn.metric_throttles(statistic="Sum", period=Duration.minutes(5)),
                threshold=1,
                what=f"{spec.name}: invocations throttled (reserved concurrency exhausted)",
                anchor="throttles",
            )
            self._alarm(
                f"{cid}InvariantViolation",
                app_metric(INVARIANT_METRIC, spec.service, period=Duration.minutes(1)),
                threshold=1,
                what=f"{spec.name}: a protocol invariant was violated (acceptance record vanished or unreadable)",
                anchor="invariantviolation",
            )

            if spec.trigger_kind != "http":
                self._alarm(
                    f"{cid}BlockersOpened",
                    app_metric(BLOCKERS_METRIC, spec.service, period=Duration.minutes(5)),
                    threshold=1,
                    what=f"{spec.name}: work stopped and became a blocker (see `lmctl blockers list`)",
                    anchor="blockersopened",
                )
            if spec.name == "reconcile":
                lag_limit = lag_limit_s(config.settings.settle_s)  # lmctl status's threshold too (R9)
                self._alarm(
                    f"{cid}ReconcilerLag",
                    app_metric(RECONCILER_LAG_METRIC, spec.service, statistic="Maximum", period=Duration.minutes(15)),
                    threshold=lag_limit,
                    evaluation_periods=2,
                    datapoints=2,
                    comparison=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
                    what=f"reconciler checkpoint more than {lag_limit} s behind",
                    anchor="reconcilerlag",
                )
                self._alarm(
                    f"{cid}ReconcilerStuck",
                    app_metric(RECONCILER_STUCK_METRIC, spec.service, statistic="Maximum", period=Duration.minutes(15)),
                    threshold=1,
                    evaluation_periods=2,
                    datapoints=2,
                    # shard 0 emits it every run: no data for 30 minutes means shard 0 is not running
                    missing=cw.TreatMissingData.BREACHING,
                    what="reconciler shards never ran, failed their last run or finished none for an hour "
                         "(see `lmctl status`)",
                    anchor="reconcilerstuck",
                )
            if spec.name == "reap-retention":
                self._alarm(
                    f"{cid}RetentionUnfinished",
                    app_metric(RETENTION_UNFINISHED_METRIC, spec.service, period=Duration.minutes(5)),
                    threshold=1,
                    what="a retention hour was left skipped or blocked: it cannot finish (see `lmctl status`)",
                    anchor="retentionunfinished",
                )
            if spec.name in CONFLICT_FUNCTIONS:
                self._alarm(
                    f"{cid}NewConflicts",
                    app_metric(CONFLICTS_METRIC, spec.service, period=Duration.minutes(5)),
                    threshold=1,
                    what="a new identity conflict was registered (see `lmctl conflicts list --status unresolved`)",
                    anchor="newconflicts",
                )
            if spec.gc_role:
                self._alarm(
                    f"{cid}GcRestored",
                    app_metric(GC_RESTORED_METRIC, spec.service, period=Duration.minutes(5)),
                    threshold=1,
                    what="GC removed a delete marker because the blob became referenced during the grace "
                         "(the accept-vs-GC race, caught by the handshake)",
                    anchor="gcrestored",
                )
            if spec.name in INTEGRITY_FUNCTIONS:
                self._alarm(
                    f"{cid}IntegrityViolation",
                    app_metric(INTEGRITY_METRIC, spec.service, period=Duration.minutes(5)),
                    threshold=1,
                    what="an accepted batch's blob is missing or has the wrong size",
                    anchor="integrityviolation",
                )

        for sm in state_machines:
            m = sm.machine
            five_min = Duration.minutes(5)
            failed = cw.MathExpression(
                expression="FILL(failed, 0) + FILL(timedout, 0) + FILL(aborted, 0)",
                using_metrics={
                    "failed": m.metric_failed(statistic="Sum", period=five_min),
                    "timedout": m.metric_timed_out(statistic="Sum", period=five_min),
                    "aborted": m.metric_aborted(statistic="Sum", period=five_min),
                },
                label=f"{sm.spec.name}: executions failed, timed out or aborted",
                period=five_min,
            )
            self._alarm(
                f"{sm.spec.logical_name}ExecutionsFailed",
                failed,
                threshold=1,
                what=f"{sm.spec.name}: an execution failed, timed out or was aborted",
                anchor="executionsfailed",
            )

        for q in queues + shard_queues:
            cid = camel(q.spec.name)
            self._alarm(
                f"{cid}DlqNotEmpty",
                q.dlq.metric_approximate_number_of_messages_visible(statistic="Maximum", period=Duration.minutes(5)),
                threshold=1,
                what=f"{q.spec.dlq_name}: messages were dead-lettered",
                anchor="dlqnotempty",
            )
            if isinstance(q.spec, ShardQueueSpec):  # messages wait their jitter by design; lag is ReconcilerLag's
                continue
            self._alarm(
                f"{cid}OldestMessage",
                q.queue.metric_approximate_age_of_oldest_message(statistic="Maximum", period=Duration.minutes(5)),
                threshold=config.settings.settle_s,
                evaluation_periods=3,
                datapoints=3,
                comparison=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
                what=f"{q.spec.name}: oldest message older than the settle window ({config.settings.settle_s} s)",
                anchor="oldestmessage",
            )

        # Dashboard names are account-wide: the region keeps two regional stacks apart.
        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=f"{config.stack_name}-{Aws.REGION}")
        self._dashboard(functions, queues + shard_queues)
        for sm in state_machines:
            five = Duration.minutes(5)
            m = sm.machine
            self.dashboard.add_widgets(
                cw.GraphWidget(
                    title=f"{sm.spec.name}: executions",
                    left=[m.metric_started(statistic="Sum", period=five), m.metric_succeeded(statistic="Sum", period=five),
                          m.metric_failed(statistic="Sum", period=five), m.metric_aborted(statistic="Sum", period=five),
                          m.metric_timed_out(statistic="Sum", period=five)],
                    width=24,
                )
            )

    def _alarm(
        self,
        name: str,
        metric: cw.IMetric,
        *,
        threshold: float,
        what: str,
        anchor: str,
        evaluation_periods: int = 1,
        datapoints: int = 1,
        comparison: cw.ComparisonOperator = cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        missing: cw.TreatMissingData = cw.TreatMissingData.NOT_BREACHING,
    ) -> cw.Alarm:
        alarm = cw.Alarm(
            self,
            name,
            alarm_name=f"{self._prefix}-{name}",
            alarm_description=f"{what}. Runbook: {RUNBOOK}#{anchor}",
            metric=metric,
            threshold=threshold,
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=datapoints,
            comparison_operator=comparison,
            treat_missing_data=missing,
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.topic))
        alarm.add_ok_action(cw_actions.SnsAction(self.topic))
        self.alarms.append(alarm)
        return alarm

    def _dashboard(self, functions: list[BuiltFunction], queues: list[BuiltQueue]) -> None:
        d = self.dashboard
        d.add_widgets(
            cw.TextWidget(
                markdown=f"# Lightmetrics\nAlarms go to the SNS topic; what to do: `{RUNBOOK}`.", width=24, height=2
            )
        )
        d.add_widgets(cw.AlarmStatusWidget(alarms=self.alarms, title="Alarms", width=24, height=4))
        five = Duration.minutes(5)
        for built in functions:
            fn, spec = built.function, built.spec
            row: list[cw.IWidget] = [
                cw.GraphWidget(
                    title=f"{spec.name}: invocations, errors, throttles",
                    left=[
                        fn.metric_invocations(statistic="Sum", period=five),
                        fn.metric_errors(statistic="Sum", period=five),
                        fn.metric_throttles(statistic="Sum", period=five),
                    ],
                    width=8,
                ),
                cw.GraphWidget(
                    title=f"{spec.name}: duration",
                    left=[fn.metric_duration(statistic="p50", period=five), fn.metric_duration(statistic="p99", period=five)],
                    width=8,
                ),
                cw.GraphWidget(
                    title=f"{spec.name}: concurrent executions",
                    left=[fn.metric("ConcurrentExecutions", statistic="Maximum", period=five)],
                    width=8,
                ),
            ]
            d.add_widgets(*row)
            if spec.trigger_kind == "http":
                d.add_widgets(
                    cw.GraphWidget(
                        title=f"{spec.name}: answers",
                        left=[app_metric(m, spec.service) for m in ACCEPT_METRICS],
                        width=8,
                        stacked=True,
                    ),
                    cw.GraphWidget(
                        title=f"{spec.name}: 5xx, invariant violations, evidence failures, GC restores",
                        left=[app_metric(m, spec.service) for m in (INGEST_5XX_METRIC, INVARIANT_METRIC, *INGEST_EXTRA_METRICS)],
                        width=8,
                    ),
                    cw.GraphWidget(
                        title=f"{spec.name}: S3 requests per accept (cost contract)",
                        left=[
                            app_metric("S3RequestsPerAccept", spec.service, "Average"),
                            app_metric("S3RequestsPerAccept", spec.service, "Maximum"),
                        ],
                        width=8,
                    ),
                )
        for q in queues:
            d.add_widgets(
                cw.GraphWidget(
                    title=f"{q.spec.name}: visible / in flight / DLQ",
                    left=[
                        q.queue.metric_approximate_number_of_messages_visible(period=five),
                        q.queue.metric_approximate_number_of_messages_not_visible(period=five),
                        q.dlq.metric_approximate_number_of_messages_visible(period=five),
                    ],
                    width=12,
                ),
                cw.GraphWidget(
                    title=f"{q.spec.name}: age of oldest message (s)",
                    left=[q.queue.metric_approximate_age_of_oldest_message(period=five)],
                    width=12,
                ),
            )

