"""The agent client: send spooled batches to ingest, at least once, never losing or re-encoding one.

What each answer does (docs/protocol.md §6, ``docs/agent-client.md``):

==========================================  ==============================================
answer                                      client
==========================================  ==============================================
200 ``accepted`` / ``duplicate`` (same      delete the batch from the spool
hash as the spooled bytes)
409 ``identity_conflict``                   park it (kept, sidecar), alert, continue with
                                            later batches; retried every
                                            ``parked_retry_s``; dropped once the answer
                                            says ``resolution: accept_existing``
403 ``denied`` (the identity is on the        park it as ``denied`` (and, without sending,
denylist)                                   the rest of that boot's batches in the pass),
                                            alert, continue with other boots; retried
                                            every ``parked_retry_s``, one probe per boot
400 / 405 / 411 / 413 / other 4xx           park it as ``invalid``, alert, continue
401, or 403 that is not ``denied`` (a       raise :class:`AuthRejected`; nothing deleted
token for another agent)
503 / 429 / 408 / 5xx / refused / reset /   next endpoint; jittered exponential backoff
timeout                                     (a full round of refused endpoints first)
==========================================  ==============================================

A spool file the client cannot use (not a batch name, not a valid frame of its name's identity,
unreadable) is set aside under ``unreadable/`` with its reason (alert ``unreadable``) and the
rest keeps flowing.

Example:
    >>> client = AgentClient(agent_id="agent-a", token=token, spool="/var/spool/lm",   # doctest: +SKIP
    ...                      endpoints=["http://10.0.0.1:4567", "http://10.0.0.2:4567"],
    ...                      on_alert=lambda alert: print(alert.message))
    >>> client.enqueue(identity, frame_bytes)                                           # doctest: +SKIP
    >>> report = client.drain(timeout_s=60)                                             # doctest: +SKIP
    >>> report.accepted, report.pending, [p.kind for p in client.parked()]              # doctest: +SKIP
    (1, 0, [])
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from lightmetrics.client.backoff import BackoffPolicy
from lightmetrics.client.drain_report import Alert, BatchOutcome, DrainReport, log_alert
from lightmetrics.client.errors import ClientConfigError, SpoolError
from lightmetrics.client.sending import (
    ACCEPT_EXISTING,
    DENIED,
    RETRIED_KINDS,
    Delivery,
    EndpointSender,
)
from lightmetrics.client.spool import Spool
from lightmetrics.client.spool_files import ParkedBatch, SpooledBatch, UnreadableFile
from lightmetrics.client.transport import Endpoint, HttpTransport, Transport
from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.errors import FrameError, InvalidIdentityError
from lightmetrics.protocol.frame import validate_frame
from lightmetrics.protocol.identity import BatchIdentity, validate_id

log = logging.getLogger(__name__)

class AgentClient(EndpointSender):
    """Sends one agent's spooled batches to ingest. Use from one thread at a time (methods take
    a lock, so a second thread waits rather than interleaves).

    ``endpoints`` are tried starting at :attr:`endpoint_index`; the client stays on an endpoint
    while it answers and moves to the next one on any retryable failure. ``sleep``, ``clock``,
    ``monotonic``, ``rng`` and ``transport`` are injectable for tests. ``parked_retry_s`` is the
    slow cadence of parked conflicts (by the wall clock, persisted in the sidecars, so it holds
    across restarts).

    Example:
        >>> client = AgentClient(agent_id="a", token="k1." + "0" * 64, spool=tmp,     # doctest: +SKIP
        ...                      endpoints=["127.0.0.1:4567"], sleep=sleeps.append,
        ...                      rng=random.Random(7))
        >>> client.enqueue(ident, frame).path.name                                     # doctest: +SKIP
        'agent=61.boot=62.00000000000000000000-00000000000000000009.lmframe'
        >>> client.run_once().accepted                                                 # doctest: +SKIP
        1
    """

    def __init__(
        self,
        *,
        agent_id: str,
        token: str,
        endpoints: Sequence[str],
        spool: Spool | str | os.PathLike[str],
        backoff: BackoffPolicy = BackoffPolicy(),  # noqa: B008  (frozen: one shared default is safe)
        parked_retry_s: float = 300.0,
        request_timeout_s: float = 10.0,
        on_alert: Callable[[Alert], None] | None = None,
        clock: Clock = DEFAULT_CLOCK,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        transport: Transport | None = None,
        validate_frames: bool = True,
    ) -> None:
        try:
            self.agent_id = validate_id(agent_id, "agent_id")
        except InvalidIdentityError as exc:
            raise ClientConfigError(str(exc)) from None
        if not token or not token.isascii() or any(c.isspace() for c in token):
            raise ClientConfigError("token must be a non-empty ASCII string without whitespace")
        self._token = token
        if not endpoints:
            raise ClientConfigError("at least one endpoint is required")
        try:
            self.endpoints = [Endpoint.parse(u) for u in endpoints]
        except ValueError as exc:
            raise ClientConfigError(str(exc)) from None
        self.spool = spool if isinstance(spool, Spool) else Spool(spool)
        self.backoff = backoff
        self.parked_retry_s = parked_retry_s
        self.on_alert = on_alert or log_alert
        self.clock = clock
        self.sleep = sleep
        self.monotonic = monotonic
        self.rng = rng or random.Random()
        self.transport: Transport = transport or HttpTransport(request_timeout_s)
        self.validate_frames = validate_frames
        self.endpoint_index = 0
        self._lock = threading.RLock()
        self._deadline: float | None = None  # drain's timeout, on the monotonic clock
        self.spool.clean()

    # ------------------------------------------------------------------ spool
    def enqueue(self, identity: BatchIdentity, frame_bytes: bytes) -> SpooledBatch:
        """Durably spool one encoded frame (validated against ``identity`` first); idempotent for
        the same bytes, :class:`SpoolConflictError` for different bytes under a held identity."""
        if identity.agent_id != self.agent_id:
            raise SpoolError(f"{identity}: this client sends for agent {self.agent_id!r} only")
        if self.validate_frames:
            validate_frame(frame_bytes, identity)  # FrameError: never spool what ingest must refuse
        return self.spool.put(identity, frame_bytes)

    def pending(self) -> list[SpooledBatch]:
        """This agent's pending batches, in send order."""
        return [b for b in self.spool.pending() if b.identity.agent_id == self.agent_id]

    def parked(self) -> list[ParkedBatch]:
        """This agent's parked batches (conflicts and invalid ones), with their sidecars."""
        return [p for p in self.spool.parked() if p.identity.agent_id == self.agent_id]

    # ------------------------------------------------------------------ parking
    def _record(self, delivery: Delivery, kind: str, previous: ParkedBatch | None = None) -> dict[str, Any]:
        answer = delivery.answer
        body = answer.body if answer else {}
        return {
            "kind": kind,
            "http_status": answer.status if answer else (previous.http_status if previous else None),
            "status": body.get("status") if answer else (previous.status if previous else None),
            "reason": (body.get("reason") if answer else delivery.error) or (previous.reason if previous else None),
            "resolution": body.get("resolution") if answer else (previous.resolution if previous else None),
            "response": body if answer else (previous.response if previous else {}),
            "endpoint": delivery.endpoint or (previous.endpoint if previous else None),
            "attempts": (previous.attempts if previous else 0) + delivery.attempts,
            "first_attempt_unix_ns": (previous.first_attempt_unix_ns if previous else None)
            or delivery.first_attempt_unix_ns,
            "last_attempt_unix_ns": delivery.last_attempt_unix_ns,
            "parked_at_unix_ns": previous.parked_at_unix_ns if previous else delivery.last_attempt_unix_ns,
        }

    @staticmethod
    def _parked_kind(delivery: Delivery) -> str:
        return {"conflict": "identity_conflict", "unexpected": "unexpected_answer",
                "denied": DENIED}.get(delivery.kind, "invalid")

    def _alert(self, kind: str, parked: ParkedBatch) -> None:
        try:
            self.on_alert(Alert(kind, parked.identity, parked.kind, parked.http_status, parked.status,
                                parked.resolution, parked.reason, parked.frame_sha256, str(parked.path),
                                parked.response))
        except Exception:  # an alert sink must not stop delivery
            log.exception("alert callback failed")

    def _set_aside(self, path: Any, reason: str, report: DrainReport) -> UnreadableFile | None:
        """Move an unusable spool file out of the way, say why, and go on with the rest."""
        try:
            aside = self.spool.set_aside(path, reason, at_unix_ns=self.clock.now_ns())
        except FileNotFoundError:
            return None  # removed meanwhile
        report.set_aside += 1
        log.warning("spool file %s set aside as %s: %s", path, aside.path, reason)
        try:
            self.on_alert(Alert("unreadable", None, "unreadable", None, None, None, reason, aside.frame_sha256,
                                str(aside.path), {"original_name": aside.original_name}))
        except Exception:  # an alert sink must not stop delivery
            log.exception("alert callback failed")
        return aside

    def _set_aside_strays(self, report: DrainReport) -> None:
        for path, reason in self.spool.strays():
            self._set_aside(path, reason, report)

    def _outcome(self, identity: BatchIdentity, action: str, sha: str, d: Delivery) -> BatchOutcome:
        a = d.answer
        return BatchOutcome(identity, action, sha, a.status if a else None, a.status_word if a else None,
                            d.endpoint, d.attempts, a.body if a else {})

    def _send_pending(self, batch: SpooledBatch, report: DrainReport,
                      denied_boots: dict[tuple[str, str], Delivery]) -> BatchOutcome | None:
        try:
            data = batch.read_bytes()
        except FileNotFoundError:
            return None  # removed meanwhile (another sender)
        except OSError as exc:
            self._set_aside(batch.path, f"cannot read {batch.path.name}: {exc}", report)
            return None
        if self.validate_frames:
            try:
                validate_frame(data, batch.identity)
            except FrameError as exc:  # never send what ingest must refuse; keep it for inspection
                self._set_aside(batch.path, f"not a valid frame of {batch.identity}: {exc}", report)
                return None
        sha = hashlib.sha256(data).hexdigest()
        boot = (batch.identity.agent_id, batch.identity.boot_id)
        if boot in denied_boots:  # denied in this pass: the same denylist entry refuses this batch too
            d = dataclasses.replace(denied_boots[boot], attempts=0)
        else:
            d = self._deliver(batch.identity, data, report)
        if d.kind == "denied":
            denied_boots.setdefault(boot, d)
        if d.kind == "ok":
            self.spool.delete(batch)
            return self._outcome(batch.identity, str(d.answer.body["status"]) if d.answer else "accepted", sha, d)
        if d.kind == "exhausted":
            return self._outcome(batch.identity, "unavailable", sha, d)
        parked = self.spool.park(batch, self._record(d, self._parked_kind(d)))
        if d.kind == "conflict" and parked.resolution == ACCEPT_EXISTING:
            # Resent after an operator already kept the accepted version: nothing to keep.
            self.spool.drop_parked(parked)
            self._alert("dropped", parked)
            return self._outcome(batch.identity, "dropped", sha, d)
        self._alert("parked", parked)
        return self._outcome(batch.identity, "parked", sha, d)

    def _retry_one(self, parked: ParkedBatch, report: DrainReport,
                   denied_boots: dict[tuple[str, str], Delivery]) -> BatchOutcome:
        boot = (parked.identity.agent_id, parked.identity.boot_id)
        if parked.kind == DENIED and boot in denied_boots:  # this boot's probe was denied again
            d = dataclasses.replace(denied_boots[boot], attempts=0)
        else:
            d = self._deliver(parked.identity, parked.read_bytes(), report)
        if d.kind == "denied":
            denied_boots.setdefault(boot, d)
        if d.kind == "ok":
            self.spool.drop_parked(parked)
            return self._outcome(parked.identity, str(d.answer.body["status"]) if d.answer else "accepted",
                                 parked.frame_sha256, d)
        if d.kind == "exhausted":
            self.spool.update_parked(parked, self._record(d, parked.kind, parked))
            return self._outcome(parked.identity, "unavailable", parked.frame_sha256, d)
        updated = self.spool.update_parked(parked, self._record(d, self._parked_kind(d), parked))
        if d.kind == "conflict" and updated.resolution == ACCEPT_EXISTING:
            self.spool.drop_parked(updated)
            self._alert("dropped", updated)
            return self._outcome(parked.identity, "dropped", parked.frame_sha256, d)
        return self._outcome(parked.identity, "kept_parked", parked.frame_sha256, d)

    def _due(self, parked: ParkedBatch) -> bool:
        last = parked.last_attempt_unix_ns or 0
        return self.clock.now_ns() - last >= self.parked_retry_s * 1e9

    def _finish(self, report: DrainReport) -> DrainReport:
        parked = self.parked()
        report.pending = len(self.pending())
        report.parked = len(parked)
        report.parked_conflicts = sum(1 for p in parked if p.kind == "identity_conflict")
        report.parked_denied = sum(1 for p in parked if p.kind == DENIED)
        report.unreadable = len(self.spool.unreadable())
        return report

    def retry_parked(self, *, only_due: bool = False, include_invalid: bool = False) -> DrainReport:
        """Send parked batches again now (all parked conflicts and denials; ``include_invalid``
        also the ``invalid``/``unexpected_answer`` ones, e.g. after the size limit was raised).

        A conflict whose answer says ``resolution: accept_existing`` is dropped (alert
        ``dropped``); a denied batch that is accepted now (the denial was lifted) leaves the spool;
        otherwise its sidecar records the latest answer and it stays parked. Denied batches are
        probed one per boot: while the probe is denied, the boot's others are not sent.

        Example:
            >>> report = client.retry_parked()                     # doctest: +SKIP
            >>> report.dropped, [p.resolution for p in client.parked()]   # doctest: +SKIP
            (1, [])
        """
        with self._lock:
            return self._finish(self._retry_parked(DrainReport(passes=1), {}, only_due, include_invalid))

    def _retry_parked(self, report: DrainReport, denied_boots: dict[tuple[str, str], Delivery], only_due: bool,
                      include_invalid: bool) -> DrainReport:
        for parked in self.parked():
            if parked.kind not in RETRIED_KINDS and not include_invalid:
                continue
            if only_due and not self._due(parked):
                continue
            report.outcomes.append(self._retry_one(parked, report, denied_boots))
        return report

    def run_once(self) -> DrainReport:
        """One pass: set aside files the client cannot use, parked conflicts and denials that are
        due (``parked_retry_s``), then every pending batch in order. A batch that exhausts
        ``backoff.max_attempts`` stays spooled and ends the pass (``report.exhausted``): the
        endpoints are down, later batches would fare no better. Raises :class:`AuthRejected` when
        the token is rejected (401, or 403 that is not ``denied``; nothing deleted)."""
        with self._lock:
            report = DrainReport(passes=1)
            self._set_aside_strays(report)
            denied_boots: dict[tuple[str, str], Delivery] = {}  # boots denied in this pass
            self._retry_parked(report, denied_boots, only_due=True, include_invalid=False)
            for batch in self.pending():
                outcome = self._send_pending(batch, report, denied_boots)
                if outcome is None:
                    continue
                report.outcomes.append(outcome)
                if outcome.action == "unavailable":
                    report.exhausted = True
                    break
            return self._finish(report)

    def drain(
        self,
        *,
        until_empty: bool = True,
        timeout_s: float | None = None,
        poll_s: float = 1.0,
        stop: threading.Event | None = None,
        on_progress: Callable[[DrainReport], None] | None = None,
    ) -> DrainReport:
        """Pass after pass until nothing is pending (``until_empty``), or until ``stop`` is set or
        ``timeout_s`` passes (then ``report.timed_out`` if batches are still pending). With
        ``until_empty=False`` it keeps watching the spool (``lmctl agent run --follow``), polling
        every ``poll_s``. Parked batches do not keep it running.

        Example:
            >>> report = client.drain(timeout_s=300)               # doctest: +SKIP
            >>> report.pending, report.parked_conflicts              # doctest: +SKIP
            (0, 1)
        """
        total = DrainReport()
        deadline = None if timeout_s is None else self.monotonic() + timeout_s
        self._deadline = deadline
        try:
            self._drain(total, deadline, until_empty, poll_s, stop, on_progress)
        finally:
            self._deadline = None
        return total

    def _drain(self, total: DrainReport, deadline: float | None, until_empty: bool, poll_s: float,
               stop: threading.Event | None, on_progress: Callable[[DrainReport], None] | None) -> None:
        outage = 0
        while True:
            if stop is not None and stop.is_set():
                break
            one = self.run_once()
            total.merge(one)
            if on_progress is not None:
                on_progress(total)
            if until_empty and one.pending == 0:
                break
            remaining = None if deadline is None else deadline - self.monotonic()
            if remaining is not None and remaining <= 0:
                total.timed_out = one.pending > 0
                break
            if one.exhausted:
                # An outage: keep backing off between passes (each pass already retried).
                wait = self.backoff.delay(self.backoff.max_attempts + outage, self.rng)
                outage += 1
            elif one.outcomes:
                outage = 0
                continue
            else:
                outage = 0
                wait = poll_s
            wait = wait if remaining is None else min(wait, remaining)
            if one.exhausted:
                total.backoffs.append(wait)
            if stop is not None:
                stop.wait(wait)
            else:
                self.sleep(wait)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
