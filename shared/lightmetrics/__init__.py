"""Lightmetrics ingest: the shared core (Lambda layer)."""
