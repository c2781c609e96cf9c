"""The index_quarantine function."""
