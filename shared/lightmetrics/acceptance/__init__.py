"""Where a batch becomes accepted: the accept algorithm, the ingest HTTP contract, agent tokens, the
identity denylist and identity conflicts (docs/protocol.md §5-7, §14)."""
