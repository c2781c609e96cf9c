"""The job kernel: what every job that runs alone under a lease is built from (the bootstrap walk,
the reaps; docs/protocol.md §13 L1-L3).

``kernel``   :class:`JobKernel` — the lease's take, renewal, release and fence, owned writes of a
             checkpoint (one transaction with the lease renewal), the continuation of a run into a
             new Step Functions execution under the history budget
``control``  :class:`JobControl` — the operator's side: start an execution and wait until it holds
             the lease (or say why it did not), whether the lease is live

The walk (:mod:`lightmetrics.derived.walk`) and the reap (:mod:`lightmetrics.reaps`) each hold a
kernel and a control (composition); the rollup's lease (:mod:`lightmetrics_pipeline.rollup.lease`) is the
kernel's :class:`~lightmetrics.jobs.kernel.Lease`, held by one process.

Example::

    >>> kernel = JobKernel(table, "reap", clock)                               # doctest: +SKIP
    >>> kernel.commit(run, [kernel.owned_update(run, pk, sk, "SET #p = :p", {"#p": "phase"}, {":p": "settle"})])  # doctest: +SKIP
"""

from __future__ import annotations

from lightmetrics.jobs.control import JobControl
from lightmetrics.jobs.kernel import JobKernel, JobStatus, Lease, Run

__all__ = ["JobControl", "JobKernel", "JobStatus", "Lease", "Run"]
