"""Lambda handlers: thin shells over the lightmetrics core (one folder per function)."""
