"""Where a batch becomes accepted: the accept algorithm, the ingest HTTP contract, agent tokens and the
identity denylist (docs/protocol.md §5-7)."""
