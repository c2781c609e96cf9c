"""How background work ends, stops and resumes: the outcome contract, the retry budget, blockers,
leases, conflicts, status and the admin API (docs/protocol.md §11)."""
