"""walk_continue Lambda: the bootstrap walk's `Continue` task (infra/statemachines/bootstrap_walk.asl.json).

Thin shell; the work is :mod:`lightmetrics.derived.walk` (docs/walks.md).
"""

from lightmetrics.lambda_shell.walk_handler import walk_task_handler

handler = walk_task_handler("continue")
