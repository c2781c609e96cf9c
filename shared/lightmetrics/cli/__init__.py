"""lmctl: the operator CLI."""
