"""The operator side the deployment runs: the admin API (``lmctl``'s remote end), the system's
status and what operators do with blockers (docs/protocol.md §11; docs/reliability.md)."""
