"""The deployed stack's CloudFormation outputs and the ``lmctl`` settings they configure.

The CDK stack (``infra/stack.py``) names its outputs with the functions here, and ``lmctl env
--stack`` reads them back with :func:`settings_from_outputs`: one list of what an operator's shell
needs (bucket, prefix, table, secret, every index queue and DLQ URL, the reconciler's shards
queue's URL, every state machine ARN),
written once, and the ingest URL agents send to (``LM_INGEST_URL``).

CloudFormation refuses an empty output value, so an empty ``LM_PREFIX`` is output as
:data:`EMPTY_PREFIX` and read back as "".

Example:
    >>> settings_from_outputs({"BucketName": "b", "Prefix": EMPTY_PREFIX, "TableName": "t", "SecretName": "s",
    ...                        "IngestUrl": "https://in.example/"}, ResourceSpec())["LM_PREFIX"]
    ''
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from lightmetrics.deployment.resource_types import ResourceSpec
from lightmetrics.deployment.resources import SPEC
from lightmetrics.deployment.settings import EMPTY_PREFIX

#: output key -> setting, for the outputs that are one setting each
SCALAR_OUTPUTS = {"BucketName": "LM_BUCKET", "Prefix": "LM_PREFIX", "TableName": "LM_TABLE",
                  "SecretName": "LM_AUTH_SECRET_ID"}
#: output key -> setting, for outputs the stack declares next to what they name (the ingest
#: function's URL: infra/components/functions.py), not in the list above
URL_OUTPUTS = {"IngestUrl": "LM_INGEST_URL"}


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.replace("_", "-").split("-"))


def queue_output_key(queue_name: str) -> str:
    """``index-accepted-dlq`` -> ``QueueUrlIndexAcceptedDlq``."""
    return f"QueueUrl{_camel(queue_name)}"


def state_machine_output_key(logical_name: str) -> str:
    """``BootstrapWalk`` -> ``BootstrapWalkArn``."""
    return f"{logical_name}Arn"


class MissingStackOutput(KeyError):
    """The stack lacks an output ``lmctl`` needs (a stack deployed by another version)."""


def settings_from_outputs(outputs: Mapping[str, str], spec: ResourceSpec = SPEC) -> dict[str, str]:
    """The ``LM_*`` settings of a deployed stack from its outputs (``{OutputKey: OutputValue}``);
    :class:`MissingStackOutput` names any output that is not there."""
    wanted = [*SCALAR_OUTPUTS, *URL_OUTPUTS, *(queue_output_key(n) for q in spec.queues for n in (q.name, q.dlq_name)),
              *(queue_output_key(q.name) for q in spec.shard_queues),
              *(state_machine_output_key(sm.logical_name) for sm in spec.state_machines)]
    missing = [k for k in wanted if k not in outputs]
    if missing:
        raise MissingStackOutput(f"the stack has no output {', '.join(missing)} (deployed by an older version? "
                                 f"`cdk deploy` this one)")
    out = {setting: outputs[key] for key, setting in (SCALAR_OUTPUTS | URL_OUTPUTS).items()}
    if out["LM_PREFIX"] == EMPTY_PREFIX:
        out["LM_PREFIX"] = ""
    out["LM_QUEUE_URLS"] = json.dumps({n: outputs[queue_output_key(n)] for q in spec.queues
                                       for n in (q.name, q.dlq_name)}, sort_keys=True)
    fanned_out_on = next((f.shard_queue for f in spec.functions if f.shard_queue), None)
    if fanned_out_on:  # the reconciler's shards queue: status reads its depth and its DLQ's
        out["LM_RECONCILE_SHARDS_QUEUE_URL"] = outputs[queue_output_key(fanned_out_on)]
    out["LM_STATE_MACHINE_ARNS"] = json.dumps({sm.name: outputs[state_machine_output_key(sm.logical_name)]
                                               for sm in spec.state_machines}, sort_keys=True)
    return out


__all__ = ["EMPTY_PREFIX", "MissingStackOutput", "SCALAR_OUTPUTS", "URL_OUTPUTS", "queue_output_key", "settings_from_outputs",
           "state_machine_output_key"]
