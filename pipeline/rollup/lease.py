"""The rollup's lease (``lease#rollup``): :class:`lightmetrics.work.leases.Lease`, the one lease
implementation of the walks, the reaps and the rollup.

The lease avoids wasted work; it is not what makes a rollup correct (S3 cannot check a fencing
token). Correctness comes from conditional creates on keys that carry the generation number: of
two owners that both get past an expired lease, exactly one creates ``generation=N`` and the
other is refused (:class:`lightmetrics_pipeline.rollup.plan.GenerationTaken`).
"""

from __future__ import annotations

from lightmetrics.work.leases import Lease, LeaseHeld, LeaseLost

__all__ = ["Lease", "LeaseHeld", "LeaseLost"]
