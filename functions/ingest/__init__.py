"""The ingest function: HTTP -> accept_batch."""
