"""The walk_continue function."""
