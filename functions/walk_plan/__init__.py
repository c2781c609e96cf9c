"""The walk_plan function."""
