"""The index_accepted function."""
