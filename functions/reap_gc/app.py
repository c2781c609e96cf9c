"""reap_gc Lambda: the reap's `Gc` task, run as the GC role (the only raw-blob deleter).

Thin shell; the work is :mod:`lightmetrics.reaps` and :mod:`lightmetrics.reaps.gc` (docs/reaps.md).
"""

from lightmetrics.lambda_shell.reap_handler import reap_task_handler

handler = reap_task_handler("gc")
