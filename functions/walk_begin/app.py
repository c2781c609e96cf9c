"""walk_begin Lambda: the bootstrap walk's `Begin` task (infra/statemachines/bootstrap_walk.asl.json).

Thin shell; the work is :mod:`lightmetrics.derived.walk` (docs/walks.md).
"""

from lightmetrics.lambda_shell.walk_handler import walk_task_handler

handler = walk_task_handler("begin")
