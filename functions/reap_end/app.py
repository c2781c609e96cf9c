"""reap_end Lambda: the reap's `Finish`/`Abort` task: the final report, the lease released.

Thin shell; the work is :mod:`lightmetrics.reaps` (docs/reaps.md).
"""

from lightmetrics.lambda_shell.reap_handler import reap_task_handler

handler = reap_task_handler("end")
