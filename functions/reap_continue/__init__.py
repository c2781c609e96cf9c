"""The reap_continue function."""
