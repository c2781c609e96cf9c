"""The stack's constructs: storage, control table, layer, queues, functions, observability."""
