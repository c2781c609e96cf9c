"""The rollup's lease (``lease#rollup``): :class:`lightmetrics.jobs.kernel.Lease`, held by one process
on the job kernel of the walks and the reaps (one lease implementation: :mod:`lightmetrics.work.leases`).

The lease avoids wasted work; it is not what makes a rollup correct (S3 cannot check a fencing
token). Correctness comes from conditional creates on keys that carry the generation number: of
two owners that both get past an expired lease, exactly one creates ``generation=N`` and the
other is refused (:class:`lightmetrics_pipeline.rollup_plan.GenerationTaken`).
"""

from __future__ import annotations

from lightmetrics.jobs.kernel import Lease
from lightmetrics.work.leases import LeaseHeld, LeaseLost

__all__ = ["Lease", "LeaseHeld", "LeaseLost"]
