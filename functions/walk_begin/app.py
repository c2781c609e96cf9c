"""walk_begin Lambda: the bootstrap walk's `Begin` task (infra/statemachines/bootstrap_walk.asl.json).

Thin shell; the work is :mod:`lightmetrics.walk` (docs/walks.md).
"""

from lightmetrics.walk import walk_task_handler

handler = walk_task_handler("begin")
