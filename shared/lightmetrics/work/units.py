"""Running one unit of background work under the outcome contract.

:func:`run_unit` is the only place that turns what a unit of work did into an
:class:`~lightmetrics.work.outcome.Outcome`: exceptions that say "try later" are counted by the
durable retry budget and promoted to a blocker when it is spent; permanent failures write a
blocker first and only then report BLOCKED (if the blocker cannot be written, the unit is
RETRY_LATER, so nothing is ever silently dropped). A unit that succeeds clears its budget and
resolves its blocker (O4: a refusal that passed never blocks for good) when ``previously_failed``
says it failed before (each driver knows: SQS receive count, a retried walk page, the reconciler
checkpoint's failed entries, retention's blocked entries, an operator retry) or this process
recorded a failure for it.

Example:
    >>> result = run_unit(ctx, kind="index-accepted", object_key=key, source="event",
    ...                   fn=lambda: index_accepted(ctx, key))                    # doctest: +SKIP
    >>> result.outcome                                                             # doctest: +SKIP
    <Outcome.DONE: 'DONE'>
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from lightmetrics.aws.errors import describe, is_transient
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.clock import DEFAULT_CLOCK, Clock
from lightmetrics.protocol.control_store import ControlStore
from lightmetrics.protocol.keys import KeyCodec
from lightmetrics.protocol.metrics import MetricsSink, NoMetrics
from lightmetrics.protocol.object_store import ObjectStore, StoreAccessError, TransientStoreError
from lightmetrics.protocol.retry import RetryPolicy
from lightmetrics.protocol.tombstones import TombstoneCache
from lightmetrics.work.blockers import BlockerStore
from lightmetrics.work.outcome import Outcome, PermanentWorkError, TransientWorkError, WorkResult
from lightmetrics.work.retry_budget import RetryBudget

log = logging.getLogger(__name__)

#: Failures that say nothing about the work itself: try again later — a ``ClientError`` only when
#: :func:`lightmetrics.aws.errors.is_transient` says so (a refusal blocks the unit at once).
TRANSIENT = (TransientWorkError, TransientStoreError, BotoCoreError, ClientError, OSError)


@dataclass
class WorkContext:
    """What background work needs; built once per process (see ``services.work_context``)."""

    store: ObjectStore
    codec: KeyCodec
    budget: RetryBudget
    blockers: BlockerStore
    #: checkpoints, leases, watermarks, plans, registries
    table: ControlStore
    settings: Settings
    clock: Clock = DEFAULT_CLOCK
    metrics: MetricsSink = field(default_factory=NoMetrics)
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    #: makes the SQS client on first use (blocker retries and DLQ sweeps only), so the functions
    #: that never touch a queue never build one
    sqs_factory: Callable[[], Any] | None = None
    #: hours found tombstoned by retention, as seen by this process (made on first use)
    tombstones: TombstoneCache | None = None
    _sqs: Any = field(default=None, repr=False)

    def sqs(self) -> Any:
        """The SQS client (made once, by :attr:`sqs_factory`)."""
        if self._sqs is None:
            if self.sqs_factory is None:
                raise RuntimeError("this work context has no SQS client")
            self._sqs = self.sqs_factory()
        return self._sqs


def work_key(kind: str, object_key: str) -> str:
    return f"{kind}:{object_key}"


def run_unit(
    ctx: WorkContext,
    *,
    kind: str,
    object_key: str,
    source: str,
    fn: Callable[[], Outcome],
    payload: dict[str, Any] | None = None,
    previously_failed: bool = False,
    full_check: Callable[[], Outcome] | None = None,
) -> WorkResult:
    """Run ``fn`` and classify its end; see the module docstring. ``full_check``: the unit's whole
    check, where ``fn`` may take a shortcut past part of it (the reconciler's). A unit that failed
    before runs it instead of ``fn``: a blocker is resolved only by a run that checked again what
    opened it (O4); a shortcut's success clears and resolves nothing."""
    key = work_key(kind, object_key)
    failed_before = previously_failed or ctx.budget.failed_here(key)
    shortcut = full_check is not None and not failed_before
    try:
        outcome = (full_check if full_check is not None and failed_before else fn)()
    except PermanentWorkError as exc:
        if exc.alarm:
            ctx.metrics.add_metric(name=exc.alarm, unit="Count", value=1)
        log.error("%s blocked: %s", key, exc.reason)
        return _block(ctx, key, kind, object_key, f"{exc.kind}: {exc.reason}", source, payload)
    except StoreAccessError as exc:  # 403 and friends: a retry will not fix permissions
        return _block(ctx, key, kind, object_key, f"access: {exc}", source, payload)
    except TRANSIENT as exc:
        if isinstance(exc, ClientError) and not is_transient(exc):  # AccessDenied, ValidationException, ...
            return _block(ctx, key, kind, object_key, f"refused: {describe(exc)} (unit {object_key})", source, payload)
        reason = f"{type(exc).__name__}: {exc}"
        try:
            state = ctx.budget.record_failure(key, reason)
        except Exception as budget_exc:  # the table is down too: just try later
            log.warning("%s: retry budget not recorded (%s)", key, budget_exc)
            return WorkResult(Outcome.RETRY_LATER, key, reason)
        if state.exhausted:
            detail = f"retry budget spent after {state.count} attempts: {reason}"
            return _block(ctx, key, kind, object_key, detail, source, payload)
        return WorkResult(Outcome.RETRY_LATER, key, reason)
    if shortcut:
        return WorkResult(outcome, key)  # nothing on record for the unit when it began: nothing to clear
    return _after_success(ctx, key, source, outcome, failed_before)


def _after_success(ctx: WorkContext, key: str, source: str, outcome: Outcome, previously_failed: bool) -> WorkResult:
    """O1a: success clears the budget whenever a failure may have been recorded (the caller knows,
    or this process recorded one); O4: it resolves the unit's blocker then too. The happy path
    sends no DynamoDB request."""
    try:
        failed_before = ctx.budget.clear_after_success(key, previously_failed=previously_failed)
    except Exception as exc:  # harmless: an item left behind counts as absent once expired
        log.warning("%s: retry budget not cleared (%s)", key, exc)
        failed_before = True
    if failed_before:
        try:
            ctx.blockers.resolve_by_success(key, who=source, outcome=outcome.value)
        except Exception as exc:  # an open blocker left behind would hold its hour: check the unit again
            log.warning("%s: blocker not resolved (%s); will retry", key, exc)
            return WorkResult(Outcome.RETRY_LATER, key, f"succeeded, but its blocker was not resolved: {exc}")
    return WorkResult(outcome, key)


def _block(
    ctx: WorkContext,
    key: str,
    kind: str,
    object_key: str,
    reason: str,
    source: str,
    payload: dict[str, Any] | None,
) -> WorkResult:
    ctx.budget.remember_failure(key)  # a success later in this process resolves the blocker (O4)
    try:
        blocker = ctx.blockers.block(key, kind=kind, object_key=object_key, reason=reason, source=source,
                                     payload=payload)
    except Exception as exc:  # not durable: do not report BLOCKED
        log.warning("%s: blocker not written (%s); will retry", key, exc)
        return WorkResult(Outcome.RETRY_LATER, key, f"blocker not written: {exc}")
    if blocker.status == "skipped":
        # An operator skipped this unit (audited): its failure is accepted, so it is no longer
        # applicable — not a failure to remember, and nothing stays open for it (§11).
        return WorkResult(Outcome.NOOP_RESOLVED, key, f"skipped by an operator; it still fails: {reason}")
    ctx.metrics.add_metric(name="BlockersOpened", unit="Count", value=1)
    return WorkResult(Outcome.BLOCKED, key, reason)
