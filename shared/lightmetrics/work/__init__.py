"""The work runtime every service runs on: how a unit of background work ends, stops and resumes —
the outcome contract, the retry budget and blockers (``units``, ``outcome``, ``retry_budget``,
``blockers``), leases and crash points of the jobs that must run alone, and the thread pool that
keeps a unit's context (docs/protocol.md §11, §13)."""
