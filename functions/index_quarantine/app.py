"""index_quarantine Lambda: S3 ObjectCreated events (through SQS) -> derived index entries.

Thin shell; the work is :mod:`lightmetrics.indexing`, the batch handling
:mod:`lightmetrics.sqs_batch` (partial-batch failures, records processed concurrently).
"""

from lightmetrics.indexing import KIND_QUARANTINE
from lightmetrics.sqs_batch import sqs_index_handler

handler = sqs_index_handler(kind=KIND_QUARANTINE, queue="index-quarantine")
