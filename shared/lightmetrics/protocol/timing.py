"""The protocol's timing rules (docs/protocol.md §18): the numbers they share and the checks that
refuse a configuration breaking them. The bounds that come from the deployment (the functions'
timeouts) are :mod:`lightmetrics.deployment.timeouts`; the settings apply these checks at start.

* **H1** ``LM_GC_GRACE_S`` > the longest accept + ``LM_CLOCK_SKEW_S`` (§15);
* **H2** ``LM_GC_GRACE_S`` ≥ the longest reap task + :data:`LEASE_MARGIN_S` (§15);
* **L1** a lease ≥ its longest task + :data:`LEASE_MARGIN_S` (§13; the lease's own check is
  :func:`lightmetrics.work.leases.lease_rule_broken`);
* **D1** a retention's ``tombstone_wait_s`` > the writers' tombstone cache, :data:`TOMBSTONE_CACHE_S`
  (§16; :func:`check_tombstone_wait`).

Only a local host (:mod:`lightmetrics.protocol.hosting`) may run shorter waits.

Example:
    >>> gc_grace_rule_broken(900, clock_skew_s=60, longest_accept_s=30, longest_reap_task_s=660) is None
    True
    >>> check_tombstone_wait(61)
    61
"""

from __future__ import annotations

from lightmetrics.protocol.errors import ConfigError

#: Default ``LM_CLOCK_SKEW_S``: how far two hosts' clocks may disagree (H1's allowance).
DEFAULT_CLOCK_SKEW_S = 60
#: How long a writer caches "this hour is not tombstoned" (:class:`~lightmetrics.protocol.tombstones.TombstoneCache`, rule D1).
TOMBSTONE_CACHE_S = 60
#: What a lease must outlast beyond its longest task: clock skew between tasks and a request still
#: in flight when its task ends (rules L1, H2; docs/protocol.md §13, §15).
LEASE_MARGIN_S = 60


def gc_grace_rule_broken(gc_grace_s: int, *, clock_skew_s: int | None, longest_accept_s: int,
                         longest_reap_task_s: int) -> str | None:
    """Why ``gc_grace_s`` breaks rule H1 or H2, or None (H1 is not judged without a valid skew)."""
    # H1: an accept whose blob PUT answered 412 before GC's mark creates its record within the
    # longest accept; the re-check after the grace must see it, on any host's clock.
    if clock_skew_s is not None and gc_grace_s <= longest_accept_s + clock_skew_s:
        return (f"must be longer than the longest accept (the ingest function's timeout, {longest_accept_s} s) "
                f"plus LM_CLOCK_SKEW_S ({clock_skew_s} s), got {gc_grace_s}: rule H1 (docs/protocol.md §15)")
    # H2: every marker a page's invocations place (a retried task's twin included) has landed
    # before the page is settled, so the settle's re-check and restore see all of them.
    if gc_grace_s < longest_reap_task_s:
        return (f"must be at least the longest reap task (its Lambda timeout plus the lease margin, "
                f"{longest_reap_task_s} s), got {gc_grace_s}: rule H2 (docs/protocol.md §15)")
    return None


def check_tombstone_wait(seconds: int, *, enforced: bool | None = None) -> int:
    """``seconds`` if it is a valid retention ``tombstone_wait_s`` (rule D1), else ConfigError.

    The wait between a tombstone and the first delete must outlast every writer's cached
    "not tombstoned" answer, or a writer could re-create an entry the reap already deleted.
    ``enforced`` defaults to the host's choice (:mod:`lightmetrics.protocol.hosting`; always on AWS).
    """
    from lightmetrics.protocol.hosting import current

    if (current().timing_rules if enforced is None else enforced) and seconds <= TOMBSTONE_CACHE_S:
        raise ConfigError(
            f"tombstone_wait_s = {seconds}: must be longer than the writers' tombstone cache "
            f"({TOMBSTONE_CACHE_S} s), rule D1 (docs/protocol.md §9, §16)"
        )
    return seconds


__all__ = ["DEFAULT_CLOCK_SKEW_S", "LEASE_MARGIN_S", "TOMBSTONE_CACHE_S", "check_tombstone_wait", "gc_grace_rule_broken"]
