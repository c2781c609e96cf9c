"""The reap_retention function."""
