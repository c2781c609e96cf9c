"""Derived state and its repair: the indexers, the S3-event path, the steady-state reconciler, the
bootstrap walk and the invariant oracle (docs/protocol.md §10-13)."""
