"""The index_raw_blobs function."""
