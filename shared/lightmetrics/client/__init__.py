"""``lightmetrics.client``: the agent side of ingest — a durable spool and a client that drains it.

* :class:`Spool` — one file per batch holding the exact encoded frame bytes, named with the
  identity's key encoding; ``parked/`` for batches outside the normal order, ``unreadable/``
  for files the client cannot use.
* :class:`AgentClient` — sends spooled batches in order with failover and jittered backoff;
  deletes a batch only on a 200 that confirms its hash; parks conflicts, denied boots and other
  refusals; stops with :class:`AuthRejected` only when the token is rejected.

Example:
    >>> from lightmetrics.client import AgentClient                                 # doctest: +SKIP
    >>> with AgentClient(agent_id="a", token=tok, spool="spool", endpoints=[url]) as c:  # doctest: +SKIP
    ...     c.enqueue(identity, frame)
    ...     report = c.drain(timeout_s=60)
"""

from lightmetrics.client.agent import AgentClient
from lightmetrics.client.backoff import BackoffPolicy
from lightmetrics.client.drain_report import Alert, BatchOutcome, DrainReport, log_alert
from lightmetrics.client.errors import (
    AuthRejected,
    ClientConfigError,
    ClientError,
    ClientStopped,
    SpoolConflictError,
    SpoolError,
)
from lightmetrics.client.spool import Spool
from lightmetrics.client.spool_files import ParkedBatch, SpooledBatch, UnreadableFile, identity_from_spool_name
from lightmetrics.client.transport import Endpoint, HttpAnswer, HttpTransport, TransportError

__all__ = [
    "AgentClient",
    "Alert",
    "AuthRejected",
    "BackoffPolicy",
    "BatchOutcome",
    "ClientConfigError",
    "ClientError",
    "ClientStopped",
    "DrainReport",
    "Endpoint",
    "HttpAnswer",
    "HttpTransport",
    "ParkedBatch",
    "Spool",
    "SpoolConflictError",
    "SpoolError",
    "SpooledBatch",
    "TransportError",
    "UnreadableFile",
    "identity_from_spool_name",
    "log_alert",
]
