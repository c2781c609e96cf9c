"""Benchmarks (not tests): wall-clock figures under injected S3 latency, each against a baseline
measured in the same run (``lmctl bench accept|indexing|walk|reconcile|reap|cost-table``;
docs/performance.md).

Every target runs on an embedded local runtime with :mod:`lightmetrics.harness.testing.latency` in front of
its S3 clients, repeats ``--repeat`` times, and reports the median and spread of each figure plus
its ratio to the in-run baseline, as JSON and a PNG chart.
"""
