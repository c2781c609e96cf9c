"""The walk_end function."""
