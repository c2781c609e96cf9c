"""reap_begin Lambda: the reap's `Begin` task (infra/statemachines/reap.asl.json).

Thin shell; the work is :mod:`lightmetrics.reaps` (docs/reaps.md).
"""

from lightmetrics.lambda_shell.reap_handler import reap_task_handler

handler = reap_task_handler("begin")
