"""Steady-state reconciler Lambda. Thin shell over lightmetrics.derived.reconcile.

One EventBridge schedule fans out a message per shard to the shards queue, which triggers this
function again, one shard a message (docs/protocol.md §12 R8;
:mod:`lightmetrics.lambda_shell.reconcile_handler`). ``{"shard": i}`` runs shard i directly; a shard
that is not one of ``0 .. LM_RECONCILE_SHARDS - 1`` fails that invocation with a message saying
which exist, and is dropped (logged) when a queued message names it.
"""

from __future__ import annotations

from lightmetrics.lambda_shell.reconcile_handler import reconcile_handler

handler = reconcile_handler()
reset = handler.reset
