"""How the agent client sends one batch: endpoint rotation, failover and backoff, and what an answer means.

:class:`EndpointSender` is the part of :class:`lightmetrics.client.agent.AgentClient` that
makes the attempts of one batch (``_deliver``): it stays on an endpoint while it answers, moves
to the next one on any retryable failure (a full round of refused endpoints before a backoff),
and ends in a :class:`Delivery` — ``ok``, ``unexpected`` (a 200 that does not confirm the
bytes), ``denied``, ``conflict``, ``rejected`` or ``exhausted`` — or raises
:class:`~lightmetrics.client.errors.AuthRejected` when the token is refused.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from lightmetrics.client.backoff import BackoffPolicy
from lightmetrics.client.drain_report import DrainReport
from lightmetrics.client.errors import AuthRejected
from lightmetrics.client.transport import Endpoint, HttpAnswer, Transport, TransportError
from lightmetrics.protocol.clock import Clock
from lightmetrics.protocol.identity import BatchIdentity, id_header_value

log = logging.getLogger("lightmetrics.client.agent")

#: Answers after which the same bytes may succeed later, at this or another endpoint.
RETRYABLE_HTTP = frozenset({408, 429}) | frozenset(range(500, 600))
ACCEPT_EXISTING = "accept_existing"
CONTENT_TYPE = "application/vnd.lightmetrics.frame"
DENIED = "denied"
#: Parked kinds retried at the ``parked_retry_s`` cadence (a decision or a lifted denial may free them).
RETRIED_KINDS = frozenset({"identity_conflict", DENIED})


@dataclass
class Delivery:
    """The end of one batch's attempts in a pass."""

    kind: str  # ok | conflict | denied | rejected | unexpected | exhausted
    answer: HttpAnswer | None
    endpoint: str | None
    attempts: int
    first_attempt_unix_ns: int
    last_attempt_unix_ns: int
    error: str | None = None


class EndpointSender:
    """The attempts of one batch across the endpoints (a base of ``AgentClient``, which sets these)."""

    endpoints: list[Endpoint]
    #: Index of the endpoint tried first by the next request.
    endpoint_index: int
    backoff: BackoffPolicy
    rng: random.Random
    clock: Clock
    sleep: Callable[[float], None]
    monotonic: Callable[[], float]
    transport: Transport
    _token: str
    _deadline: float | None  # drain's timeout, on the monotonic clock

    def _headers(self, identity: BatchIdentity) -> dict[str, str]:
        return {
            # A non-ASCII id travels percent-encoded (protocol §7): header values are ISO-8859-1.
            "X-Lm-Agent-Id": id_header_value(identity.agent_id),
            "X-Lm-Boot-Id": id_header_value(identity.boot_id),
            "X-Lm-Seq-Start": str(identity.seq_start),
            "X-Lm-Seq-End": str(identity.seq_end),
            "Authorization": f"Bearer {self._token}",
            "Content-Type": CONTENT_TYPE,
        }

    def _advance(self) -> None:
        self.endpoint_index = (self.endpoint_index + 1) % len(self.endpoints)

    def _pause(self, retry: int, report: DrainReport, retry_after_s: float | None = None) -> bool:
        """Sleep before the next attempt; False (no sleep) if that would pass drain's deadline."""
        delay = self.backoff.delay(retry, self.rng, retry_after_s)
        if self._deadline is not None and self.monotonic() + delay > self._deadline:
            return False
        report.backoffs.append(delay)
        self.sleep(delay)
        return True

    def _deliver(self, identity: BatchIdentity, data: bytes, report: DrainReport) -> Delivery:
        """Attempts of one batch: failover on refusals, backoff on retryable answers."""
        headers = self._headers(identity)
        first = self.clock.now_ns()
        retries = 0
        refused_in_round = 0
        last_error: str | None = None
        attempts = 0
        while attempts < self.backoff.max_attempts:
            endpoint = self.endpoints[self.endpoint_index % len(self.endpoints)]
            attempts += 1
            report.attempts += 1
            try:
                answer = self.transport.post(endpoint, headers, data)
            except TransportError as exc:
                last_error = str(exc)
                self._refused(identity, exc, report)
                refused_in_round += 1
                if refused_in_round < len(self.endpoints):
                    continue  # another endpoint may be up: no wait
                refused_in_round = 0
                if attempts < self.backoff.max_attempts:
                    if not self._pause(retries, report):
                        break
                    retries += 1
                continue
            refused_in_round = 0
            report.answers[answer.status_word] += 1
            now = self.clock.now_ns()
            kind = self._answer_kind(identity, endpoint, answer, data)
            if kind is not None:
                return Delivery(kind, answer, endpoint.url, attempts, first, now)
            last_error = f"{endpoint.url} answered {answer.status} {answer.status_word}"
            self._advance()
            if attempts < self.backoff.max_attempts:
                if not self._pause(retries, report, answer.retry_after_s):
                    break
                retries += 1
        now = self.clock.now_ns()
        return Delivery("exhausted", None, None, attempts, first, now, error=last_error)

    def _refused(self, identity: BatchIdentity, exc: TransportError, report: DrainReport) -> None:
        """Count a network error (refused, reset, timeout) and move to the next endpoint."""
        report.network_errors += 1
        report.timeouts += exc.kind == "timeout"
        log.info("%s: %s", identity, exc)
        if len(self.endpoints) > 1:
            report.failovers += 1
        self._advance()

    def _answer_kind(self, identity: BatchIdentity, endpoint: Endpoint, answer: HttpAnswer, data: bytes) -> str | None:
        """What an HTTP answer ends the batch's attempts as; None: retryable (next endpoint, backoff).
        Raises :class:`AuthRejected` when the token is refused."""
        if answer.status == 200:
            return "ok" if self._confirms(answer, data) else "unexpected"
        if answer.status == 403 and answer.body.get("status") == DENIED:
            return "denied"  # this identity is on the denylist; the token is fine
        if answer.status in (401, 403):  # the token is rejected: nothing this client sends can pass
            raise AuthRejected(answer.status, str(answer.body.get("reason") or answer.status_word),
                               identity=identity, endpoint=endpoint.url, body=answer.body)
        if answer.status == 409 and answer.body.get("status") == "identity_conflict":
            return "conflict"
        if answer.status in RETRYABLE_HTTP or answer.status < 400:
            return None
        return "rejected"

    @staticmethod
    def _confirms(answer: HttpAnswer, data: bytes) -> bool:
        """A 200 deletes a batch only if it names these exact bytes as accepted or duplicate."""
        return (answer.body.get("status") in ("accepted", "duplicate")
                and answer.body.get("frame_sha256") == hashlib.sha256(data).hexdigest())


__all__ = ["ACCEPT_EXISTING", "CONTENT_TYPE", "DENIED", "RETRIED_KINDS", "RETRYABLE_HTTP", "Delivery", "EndpointSender"]
