"""Outside the Lambda layer: the demo, the chaos soak, the ledger check, benchmarks and the test
switches (fault, latency and crash injection)."""
