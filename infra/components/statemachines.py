"""Step Functions state machines, generically from ``StateMachineSpec`` (resources.py).

Each state machine is created from its ASL file in ``infra/statemachines/`` with CloudFormation
``DefinitionSubstitutions``: the placeholder -> function map is the spec's, read and checked by
:func:`lightmetrics.operator_tools.statemachines.definition_and_substitutions` — the same loader the local
runtime uses, so the definition deployed here and the one moto executes locally are the same
file under the same map. Every state machine gets its own role (``lambda:InvokeFunction`` on
exactly the functions its tasks name), X-Ray tracing, ALL-level logging to its own log group,
and, when the spec has one and the deployment runs it (``schedules.scheduled``: the walk's only
without an S3 Inventory), an EventBridge schedule with the spec's explicit input.

Physical names are ``<stack>-<logical_name>`` and known before synthesis, so a function that
starts executions (``FunctionSpec.sfn_start``) gets ``states:StartExecution`` on that ARN without
a reference cycle (the state machine itself references the functions' ARNs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.components.functions import BuiltFunction, cdk_statement, log_retention
from infra.config import InfraConfig
from lightmetrics.deployment.resource_types import StateMachineSpec
from lightmetrics.operator_tools.policies import PolicyArns, state_machine_statements
from lightmetrics.operator_tools.schedules import schedule_input, scheduled
from lightmetrics.operator_tools.statemachines import definition_and_substitutions


def state_machine_name(config: InfraConfig, spec: StateMachineSpec) -> str:
    """The physical name, ``<stack>-<logical_name>`` (e.g. ``Lightmetrics-BootstrapWalk``)."""
    return f"{config.stack_name}-{spec.logical_name}"


def state_machine_arn(stack: Stack, config: InfraConfig, spec: StateMachineSpec) -> str:
    """The state machine's ARN, built from its name (usable before the state machine exists)."""
    return stack.format_arn(
        service="states",
        resource="stateMachine",
        resource_name=state_machine_name(config, spec),
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


class BuiltStateMachine:
    def __init__(self, spec: StateMachineSpec, machine: sfn.StateMachine, role: iam.Role,
                 log_group: logs.LogGroup, rule: events.Rule | None, definition: str,
                 substitutions: dict[str, str]) -> None:
        self.spec = spec
        self.machine = machine
        self.role = role
        self.log_group = log_group
        self.rule = rule
        self.disabled_rule: events.Rule | None = None
        #: the raw ASL text (placeholders intact) and placeholder -> ARN token
        self.definition = definition
        self.substitutions = substitutions


class StateMachines(Construct):
    """One state machine per ``StateMachineSpec``; ``self.built`` keeps them by spec name."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        specs: tuple[StateMachineSpec, ...],
        functions: Mapping[str, BuiltFunction],
        config: InfraConfig,
    ) -> None:
        super().__init__(scope, construct_id)
        self.built: dict[str, BuiltStateMachine] = {}
        for spec in specs:
            cid = spec.logical_name
            text, subs = definition_and_substitutions(spec, lambda fn: functions[fn].function.function_arn)
            role = iam.Role(
                self,
                f"{cid}Role",
                assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
                description=f"Lightmetrics {spec.name}: invokes exactly its task functions",
            )
            arns = PolicyArns(bucket="", namespace="", table="", secret="",
                              functions={fn: functions[fn].function.function_arn for fn in spec.function_names()})
            for statement in state_machine_statements(spec, arns):
                role.add_to_principal_policy(cdk_statement(statement))
            log_group = logs.LogGroup(self, f"{cid}Logs", retention=log_retention(config.log_retention_days))
            machine = sfn.StateMachine(
                self,
                cid,
                state_machine_name=state_machine_name(config, spec),
                state_machine_type=sfn.StateMachineType.STANDARD,
                definition_body=sfn.DefinitionBody.from_string(text),
                definition_substitutions=subs,
                role=role,
                tracing_enabled=True,
                logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
            )
            # The spec's input verbatim: every field explicit, nulls included (from_object would
            # drop a null, and the console inputs documented in docs/walks.md and docs/reaps.md have them).
            # The walk's weekly schedule only where no S3 Inventory is configured (schedules.scheduled).
            rule = self._schedule(f"{cid}Schedule", f"{spec.name}: {spec.schedule}", spec.schedule,
                                  schedule_input(spec, inventory=config.inventory), machine) \
                if spec.schedule and scheduled(spec.name, inventory=config.inventory) else None
            # Deployed disabled (retention deletes data by policy): an operator enables it.
            disabled_rule = self._schedule(
                f"{cid}DisabledSchedule", f"{spec.name}: {spec.disabled_schedule} (disabled until a policy is set)",
                spec.disabled_schedule, spec.disabled_schedule_input, machine, enabled=False,
            ) if spec.disabled_schedule else None
            self.built[spec.name] = BuiltStateMachine(spec, machine, role, log_group, rule, text, subs)
            self.built[spec.name].disabled_rule = disabled_rule

    def _schedule(self, construct_id: str, description: str, expression: str, input_json: str | None,
                  machine: sfn.StateMachine, *, enabled: bool = True) -> events.Rule:
        rule = events.Rule(self, construct_id, description=description, enabled=enabled,
                           schedule=events.Schedule.expression(expression),
                           targets=[targets.SfnStateMachine(machine)])
        cfn_rule = rule.node.default_child
        assert isinstance(cfn_rule, events.CfnRule)
        cfn_rule.add_property_override("Targets.0.Input", json.dumps(json.loads(input_json or "{}"), sort_keys=True))
        return rule
