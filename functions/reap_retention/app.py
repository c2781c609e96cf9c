"""reap_retention Lambda: the reap's `Retention` task (derived prefixes only; infra/statemachines/reap.asl.json).

Thin shell; the work is :mod:`lightmetrics.reap` and :mod:`lightmetrics.retention` (docs/reaps.md).
"""

from lightmetrics.reap import reap_task_handler

handler = reap_task_handler("retention")
