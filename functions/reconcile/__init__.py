"""The reconcile function."""
