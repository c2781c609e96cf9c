"""Derived state and its repair: the indexers, the S3-event path, the steady-state reconciler and the
bootstrap walk (docs/protocol.md §10-13)."""
