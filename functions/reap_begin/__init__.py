"""The reap_begin function."""
