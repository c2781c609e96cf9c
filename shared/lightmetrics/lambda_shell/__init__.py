"""Handler plumbing shared by every function in functions/: per-container state, SQS batch processing,
Step Functions task handlers."""
