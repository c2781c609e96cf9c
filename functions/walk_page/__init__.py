"""The walk_page function."""
