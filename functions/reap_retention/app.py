"""reap_retention Lambda: the reap's `Retention` task (derived prefixes only; infra/statemachines/reap.asl.json).

Thin shell; the work is :mod:`lightmetrics.reaps` and :mod:`lightmetrics.reaps.retention` (docs/reaps.md).
"""

from lightmetrics.lambda_shell.reap_handler import reap_task_handler

handler = reap_task_handler("retention")
