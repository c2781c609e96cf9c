"""The DLQ sweeper function."""
