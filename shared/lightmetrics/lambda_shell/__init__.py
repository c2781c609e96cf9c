"""Handler plumbing shared by every function in functions/: per-container state, SQS batch processing,
the Step Functions task handler and its factories for the walk's and the reap's tasks."""
