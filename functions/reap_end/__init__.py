"""The reap_end function."""
