"""index_accepted Lambda: S3 ObjectCreated events (through SQS) -> derived index entries.

Thin shell; the work is :mod:`lightmetrics.derived.indexing`, the batch handling
:mod:`lightmetrics.lambda_shell.sqs_batch` (partial-batch failures, records processed concurrently).
"""

from lightmetrics.derived.indexing import KIND_ACCEPTED
from lightmetrics.lambda_shell.sqs_batch import sqs_index_handler

handler = sqs_index_handler(kind=KIND_ACCEPTED, queue="index-accepted")
