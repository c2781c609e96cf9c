"""The reap_gc function."""
