"""The deterministic simulation of the whole system (``lmctl sim``; docs/reliability.md,
"Deterministic simulation"): the real service code as actors on the in-memory adapters, one at a
time under a seeded scheduler, with faults injected through the ports; checks after every step
and at quiescence. The same seed replays the same trace."""

from lightmetrics.harness.sim.runner import SimResult, run_many, run_seed

__all__ = ["SimResult", "run_many", "run_seed"]
