"""The data pipeline in AWS (issue 7): an EMR Serverless application, the jobs' role, the Step
Functions state machine that starts the jobs, their schedules, and alarms on failed runs.

It is a *nested stack* of the main stack (optional: the Spark pipeline, docs/pipeline.md): the main template
keeps exactly the resources the resource spec describes, and the pipeline's resources live in
their own template, wired to the main stack's bucket, ops bucket, control table and alarm topic.

* ``Application`` — ``AWS::EMRServerless::Application``, Spark, release ``emr-spark-8.0.0``
  (Apache Spark 4.0), auto-start on submission, auto-stop when idle, a maximum capacity.
* The job's bundle as CDK assets (``infra/pipeline_bundle.py``, built by ``make emr-bundle`` without
  Docker): the entry point ``pipeline/emr_main.py``, ``app.zip`` (``lightmetrics`` + ``pipeline``,
  ``spark.submit.pyFiles``) and ``deps.zip`` (third-party wheels, ``spark.archives`` ``#deps`` on ``PYTHONPATH``).
  They live in the CDK bootstrap's asset bucket under content-hashed keys, which no lifecycle rule of
  ours expires; a new deploy of changed code gets new keys.
* ``JobRole`` — assumed by ``emr-serverless.amazonaws.com`` for this application only
  (``aws:SourceArn``, ``aws:SourceAccount``). Exactly
  what the jobs do: GET/HEAD under the layout prefixes they read, PUT (conditional creates — the
  bucket policy enforces it) under ``rollup/v1/``, ``index/v1/``, ``manifests/v1/`` and
  ``audit/v1/`` only, LIST with an ``s3:prefix`` condition (a HEAD of a missing key must be a
  404, not a 403), the inventory reports in the ops bucket, the three bundle objects, job logs under
  ``emr/logs/``; on the control table GetItem/PutItem/UpdateItem limited by ``dynamodb:LeadingKeys``
  to ``lease#rollup`` (the only item the jobs write) and GetItem/Query on ``checkpoint#reconcile``
  and the reap's marks partitions (read only). No delete anywhere.
* ``Machine`` — from ``infra/statemachines/pipeline.asl.json`` with ``${Placeholders}`` filled by
  CloudFormation's DefinitionSubstitutions (the pattern of the other state machines); its task
  is the optimized ``emr-serverless:startJobRun.sync`` integration. Hourly rollup and weekly audit
  schedules start it. moto cannot run this task: locally ``lmctl pipeline audit|rollup`` is the
  entry point (docs/pipeline.md).
* ``RollupCatalog`` (``infra/components/rollup_catalog.py``) — the Glue database, the ``rollups`` and
  ``rollup_manifests`` tables (partition projection) and the Athena named query creating the
  ``rollups_current`` view, so the rollups are queryable without our code (docs/pipeline.md §6.1).
* Alarms: ``PipelineExecutionsFailed`` (the state machine's ``ExecutionsFailed``: a failed job run
  fails its execution) and ``PipelineJobRunsFailed`` (an EventBridge rule on EMR Serverless
  "Job Run State Change" to FAILED for this application; its ``TriggeredRules`` metric), both to
  the main stack's alarm topic.
"""

from __future__ import annotations

import json
from pathlib import Path

from aws_cdk import ArnFormat, Duration, NestedStack, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_emrserverless as emrs
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from cdk_nag import NagPackSuppression, NagSuppressions
from constructs import Construct

from infra import pipeline_bundle as bundle
from infra.components.functions import cdk_statement
from infra.components.rollup_catalog import RollupCatalog
from infra.config import InfraConfig
from lightmetrics.deployment.resources import PIPELINE_SCHEDULES
from lightmetrics.operator_tools.policies import (  # LOGS_PREFIX: in the ops bucket, the job runs' logs
    INVENTORY_PREFIX,
    LEASE_KEYS,
    LOGS_PREFIX,
    PIPELINE_READ_PREFIXES,
    PIPELINE_WRITE_PREFIXES,
    READ_KEYS,
    PolicyArns,
    pipeline_job_statements,
    watermark_keys,
)
from lightmetrics.operator_tools.schedules import scheduled

ASL_FILE = Path(__file__).resolve().parents[1] / "statemachines" / "pipeline.asl.json"
RELEASE_LABEL = "emr-spark-8.0.0"
INVENTORY_ID = "weekly-parquet"  # storage.INVENTORY_ID

#: the jobs' grants (lightmetrics.operator_tools.policies): layout prefixes read and written, table partitions
READ_PREFIXES = PIPELINE_READ_PREFIXES
WRITE_PREFIXES = PIPELINE_WRITE_PREFIXES
WATERMARK_KEYS = watermark_keys()
PLACEHOLDERS = ("ApplicationId", "JobRoleArn", "EntryPoint", "SparkSubmitParameters", "LogUri", "InventoryLocation")


def spark_submit_parameters(*, bucket: str, prefix: str, table: str, retry_horizon_s: int, archive_uri: str,
                            py_files_uri: str, reconcile_shards: int = 1, region: str | None = None,
                            settle_s: int = 900, python: str = bundle.JOB_PYTHON_PATH) -> str:
    """The job's ``sparkSubmitParameters``: our code zip as ``spark.submit.pyFiles`` (what
    ``--py-files`` sets; a plain conf, as every other setting here), the dependency zip
    unpacked as ``./deps`` (``spark.archives``) on ``PYTHONPATH``, the image's ``python`` for the
    driver and the workers, and the LM_* settings (the reconciler's shard count: the rollup reads
    every shard's checkpoint, protocol §12 R8; the settle window: the audit's watermarks are its
    inventory's time minus it, §13 W6) and the region the job's AWS clients use.

    >>> p = spark_submit_parameters(bucket="b", prefix="", table="t", retry_horizon_s=60,
    ...                             archive_uri="s3://a/deps.zip", py_files_uri="s3://a/app.zip", region="eu-west-1")
    >>> p.split()[:2], "--conf spark.executorEnv.AWS_REGION=eu-west-1" in p
    (['--conf', 'spark.submit.pyFiles=s3://a/app.zip'], True)
    """
    env = {"PYTHONPATH": f"./{bundle.DEPS_ALIAS}", "LM_BUCKET": bucket, "LM_PREFIX": prefix, "LM_TABLE": table,
           "LM_RETRY_HORIZON_S": str(retry_horizon_s), "LM_RECONCILE_SHARDS": str(reconcile_shards),
           "LM_SETTLE_S": str(settle_s)}
    if region:
        env.update(AWS_REGION=region, AWS_DEFAULT_REGION=region)
    confs = [
        f"spark.submit.pyFiles={py_files_uri}",
        f"spark.archives={archive_uri}#{bundle.DEPS_ALIAS}",
        f"spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON={python}",
        f"spark.emr-serverless.driverEnv.PYSPARK_PYTHON={python}",
        f"spark.executorEnv.PYSPARK_PYTHON={python}",
        "spark.sql.execution.arrow.pyspark.enabled=true",
    ]
    for k, v in env.items():
        confs.append(f"spark.emr-serverless.driverEnv.{k}={v}")
        confs.append(f"spark.executorEnv.{k}={v}")
    return " ".join(f"--conf {c}" for c in confs)


class Pipeline(NestedStack):
    def __init__(self, scope: Construct, construct_id: str, *, config: InfraConfig, bucket: s3.IBucket,
                 ops_bucket: s3.IBucket, table_arn: str, table_name: str, alarm_topic: sns.ITopic) -> None:
        super().__init__(scope, construct_id, description="Lightmetrics data pipeline: EMR Serverless jobs, "
                         "their role, the state machine that starts them, alarms")
        ns = config.prefix
        stack = Stack.of(self)

        self.application = emrs.CfnApplication(
            self, "Application",
            name=f"{config.stack_name}-pipeline",
            release_label=RELEASE_LABEL,
            type="SPARK",
            architecture="X86_64",
            auto_start_configuration=emrs.CfnApplication.AutoStartConfigurationProperty(enabled=True),
            auto_stop_configuration=emrs.CfnApplication.AutoStopConfigurationProperty(enabled=True,
                                                                                      idle_timeout_minutes=15),
            maximum_capacity=emrs.CfnApplication.MaximumAllowedResourcesProperty(cpu="16 vCPU", memory="64 GB",
                                                                                 disk="200 GB"),
        )

        app_arn = stack.format_arn(service="emr-serverless", resource="/applications",
                                   resource_name=self.application.attr_application_id,
                                   arn_format=ArnFormat.SLASH_RESOURCE_NAME)

        # -- the job's bundle (make emr-bundle; synth refuses a missing or stale dependency zip) ----------
        self.bundle = {
            "entry_point": s3_assets.Asset(self, "JobEntryPoint", path=str(bundle.ENTRY_POINT)),
            "py_files": s3_assets.Asset(self, "JobCode", path=str(bundle.ensure_app_zip())),
            "archive": s3_assets.Asset(self, "JobDependencies", path=str(bundle.check_deps())),
        }

        # -- the rollups as Athena tables (docs/pipeline.md §6.1) ------------------------------------------
        self.catalog = RollupCatalog(self, "RollupCatalog", stack_name=config.stack_name, bucket_name=bucket.bucket_name,
                                     prefix=ns)

        # -- the jobs' role: exactly what audit and rollup do -------------------------------------------
        self.job_role = iam.Role(
            self, "JobRole",
            assumed_by=iam.ServicePrincipal("emr-serverless.amazonaws.com", conditions={
                # the application's ARN; its job runs' ARNs too, should the service name a run (still this application)
                "StringEquals": {"aws:SourceAccount": stack.account},
                "ArnLike": {"aws:SourceArn": [app_arn, f"{app_arn}/jobruns/*"]}}),
            description="Lightmetrics pipeline jobs (EMR Serverless): read the layout, create rollups and audits",
        )
        # The statements themselves: lightmetrics.operator_tools.policies, the one source the local runtime enforces too.
        arns = PolicyArns(bucket=bucket.bucket_arn, namespace=ns, table=table_arn, secret="")
        bundle_objects = tuple(f"arn:{stack.partition}:s3:::{a.s3_bucket_name}/{a.s3_object_key}"
                               for a in self.bundle.values())
        for statement in pipeline_job_statements(arns, ops_bucket=ops_bucket.bucket_arn, bundle_objects=bundle_objects):
            self.job_role.add_to_policy(cdk_statement(statement))

        # -- the state machine that starts the jobs ---------------------------------------------------------
        substitutions = {
            "ApplicationId": self.application.attr_application_id,
            "JobRoleArn": self.job_role.role_arn,
            "EntryPoint": self.bundle["entry_point"].s3_object_url,
            "SparkSubmitParameters": spark_submit_parameters(
                bucket=bucket.bucket_name, prefix=ns, table=table_name,
                retry_horizon_s=config.settings.retry_horizon_s, archive_uri=self.bundle["archive"].s3_object_url,
                py_files_uri=self.bundle["py_files"].s3_object_url,
                reconcile_shards=config.settings.reconcile_shards, region=Stack.of(self).region,
                settle_s=config.settings.settle_s),
            "LogUri": f"s3://{ops_bucket.bucket_name}/{LOGS_PREFIX}",
            "InventoryLocation": f"s3://{ops_bucket.bucket_name}/{INVENTORY_PREFIX}/{bucket.bucket_name}/{INVENTORY_ID}/",
        }
        text = ASL_FILE.read_text()
        self.definition = text
        self.substitutions = substitutions
        self.machine_role = iam.Role(
            self, "MachineRole", assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
            description="Lightmetrics pipeline state machine: starts and watches the EMR Serverless job runs")
        self.machine_role.add_to_policy(iam.PolicyStatement(
            sid="StartJobRuns", actions=["emr-serverless:StartJobRun"], resources=[app_arn]))
        self.machine_role.add_to_policy(iam.PolicyStatement(
            sid="WatchJobRuns", actions=["emr-serverless:GetJobRun", "emr-serverless:CancelJobRun"],
            resources=[f"{app_arn}/jobruns/*"]))
        self.machine_role.add_to_policy(iam.PolicyStatement(
            sid="PassJobRole", actions=["iam:PassRole"], resources=[self.job_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "emr-serverless.amazonaws.com"}}))
        self.machine_role.add_to_policy(iam.PolicyStatement(
            sid="SyncIntegrationRule", actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
            resources=[stack.format_arn(service="events", resource="rule",
                                        resource_name="StepFunctionsGetEventsForEMRServerlessJobRule")]))
        self.log_group = logs.LogGroup(self, "MachineLogs", retention=logs.RetentionDays.ONE_MONTH)
        self.machine = sfn.StateMachine(
            self, "Machine",
            state_machine_name=f"{config.stack_name}-Pipeline",
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_string(text),
            definition_substitutions=substitutions,
            role=self.machine_role,
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
        )
        self.schedules = {}
        for job, (expression, input_json) in PIPELINE_SCHEDULES.items():
            if not scheduled(job, inventory=config.inventory):
                continue  # the audit reads the inventory: none configured, nothing to read
            rule = events.Rule(self, f"{job.capitalize()}Schedule", description=f"pipeline {job}: {expression}",
                               schedule=events.Schedule.expression(expression),
                               targets=[targets.SfnStateMachine(self.machine, input=events.RuleTargetInput.from_object(
                                   json.loads(input_json)))])
            self.schedules[job] = rule

        # -- alarms on failed runs ----------------------------------------------------------------------------
        self.failed_rule = events.Rule(
            self, "JobRunFailed", description="EMR Serverless job run of the pipeline application FAILED",
            event_pattern=events.EventPattern(
                source=["aws.emr-serverless"], detail_type=["EMR Serverless Job Run State Change"],
                detail={"state": ["FAILED"], "applicationId": [self.application.attr_application_id]}),
        )  # no target needed: the alarm reads the rule's TriggeredRules metric
        self.alarms = {
            "PipelineExecutionsFailed": cw.Alarm(
                self, "ExecutionsFailed", alarm_name=f"{config.stack_name}-PipelineExecutionsFailed",
                alarm_description="A pipeline state machine execution failed (docs/pipeline.md, Alarms)",
                metric=self.machine.metric_failed(period=Duration.minutes(5), statistic="Sum"),
                threshold=1, evaluation_periods=1, comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING),
            "PipelineJobRunsFailed": cw.Alarm(
                self, "JobRunsFailed", alarm_name=f"{config.stack_name}-PipelineJobRunsFailed",
                alarm_description="An EMR Serverless job run of the pipeline failed (docs/pipeline.md, Alarms)",
                metric=cw.Metric(namespace="AWS/Events", metric_name="TriggeredRules",
                                 dimensions_map={"RuleName": self.failed_rule.rule_name},
                                 statistic="Sum", period=Duration.minutes(5)),
                threshold=1, evaluation_periods=1, comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING),
        }
        for alarm in self.alarms.values():
            alarm.add_alarm_action(cw_actions.SnsAction(alarm_topic))

        NagSuppressions.add_resource_suppressions(self.job_role, [NagPackSuppression(
            id="AwsSolutions-IAM5",
            reason="Object actions are granted per key-layout prefix (docs/protocol.md §3): keys are content- or "
                   "identity-addressed, so `<prefix>*` is the narrowest grant; the bucket policy still forces "
                   "conditional creates there, and the role has no delete at all.")], apply_to_children=True)
        NagSuppressions.add_resource_suppressions(self.machine_role, [NagPackSuppression(
            id="AwsSolutions-IAM5",
            reason="Job runs get their ids at start time, so GetJobRun/CancelJobRun are granted on this application's "
                   "jobruns/*; CDK adds xray and log-delivery actions that support no resource-level permissions.")],
            apply_to_children=True)


def asl_placeholders() -> set[str]:
    import re

    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", ASL_FILE.read_text()))


def asl_document() -> dict:  # type: ignore[type-arg]
    return json.loads(ASL_FILE.read_text())


__all__ = ["ASL_FILE", "LEASE_KEYS", "PLACEHOLDERS", "Pipeline", "READ_KEYS", "READ_PREFIXES", "RELEASE_LABEL",
           "WATERMARK_KEYS", "WRITE_PREFIXES", "asl_document", "asl_placeholders", "spark_submit_parameters"]
