"""reap_continue Lambda: the reap's `Continue` task (infra/statemachines/reap.asl.json): the next
execution under the same lease and epoch.

Thin shell; the work is :mod:`lightmetrics.reaps` (docs/reaps.md).
"""

from lightmetrics.lambda_shell.reap_handler import reap_task_handler

handler = reap_task_handler("continue")
