"""An indexer's invocation in the cost and keep-up models: how many SQS messages it carries (from
the rate and the configured batching window) and the CPU it spends on them (measured: ``lmctl bench
indexer-cpu``, scaled to the function's memory).

Example:
    >>> from lightmetrics.operator_tools.cost_workload import Assumptions
    >>> index_messages_per_invocation(100, Assumptions(sqs_batch_size=2))
    2.0
"""

from __future__ import annotations

from lightmetrics.operator_tools.cost_workload import Assumptions
from lightmetrics.operator_tools.sqs_batching import messages_per_invocation

__all__ = ["FULL_VCPU_MB", "index_cpu_ms", "index_messages_per_invocation"]


def index_messages_per_invocation(arrivals_per_s: float, a: Assumptions) -> float:
    """SQS messages in one indexer invocation at ``arrivals_per_s`` on its queue: ``--assume
    sqs_batch_size=N`` when N > 0, else from the configured window and batch size."""
    if a.sqs_batch_size > 0:
        return float(a.sqs_batch_size)
    return messages_per_invocation(arrivals_per_s, window_s=a.sqs_batching_window_s, batch_size=a.sqs_max_batch_size,
                                   pollers=a.sqs_pollers_per_queue, poll_gap_s=a.sqs_poll_gap_s)


FULL_VCPU_MB = 1769  # Lambda gives one full vCPU at 1,769 MB, CPU in proportion below it


def index_cpu_ms(a: Assumptions, records: float, s3_requests_per_record: float) -> float:
    """CPU ms of one indexer invocation of ``records`` records: fixed, and per record ours plus the
    SDK's per S3 request, at one vCPU scaled by 1,769 MB / memory (512 MB: 1/3.5 of a vCPU).

    Example:
        >>> one_vcpu = Assumptions(index_cpu_ms_per_invocation=1, index_cpu_ms_per_record=0.5,
        ...                        index_sdk_cpu_ms_per_request=1, index_memory_mb=1769)
        >>> index_cpu_ms(one_vcpu, 10, 2), round(index_cpu_ms(one_vcpu, 10, 2) * 1769 / 512, 1)
        (26.0, 89.8)
    """
    at_one_vcpu = a.index_cpu_ms_per_invocation + records * (
        a.index_cpu_ms_per_record + s3_requests_per_record * a.index_sdk_cpu_ms_per_request)
    return at_one_vcpu * FULL_VCPU_MB / min(a.index_memory_mb, FULL_VCPU_MB)
