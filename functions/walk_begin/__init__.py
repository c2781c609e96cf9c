"""The walk_begin function."""
