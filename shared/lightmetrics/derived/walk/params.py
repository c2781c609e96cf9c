"""What a walk is asked to do: its execution input (:class:`WalkParams`), the input's limits and
defaults (docs/walks.md, "Console input"), its Lambda tasks, and how many rounds one execution may
run under Step Functions' history limit (docs/walks.md, "History").

Example::

    >>> WalkParams.parse({"page_size": 500, "parallelism": 2}).page_size
    500
    >>> history_bound(4, max_rounds_for(4)) <= HISTORY_BUDGET
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightmetrics.derived.walk.errors import InvalidWalkInput
from lightmetrics.protocol.executions import HISTORY_BUDGET, HISTORY_LIMIT, ExecutionInput
from lightmetrics.protocol.identity import id_to_hex, validate_id
from lightmetrics.work.leases import task_lease_rule_broken

# --- input limits and defaults (docs/walks.md, "Console input") --------------------------------------
# A page task lists up to page_size keys in ListObjectsV2 calls of at most 1,000 each: a bigger page
# costs fewer tasks and state transitions per key (most keys of a year-old bucket are in reaped
# hours and cost nothing but their listing, rule W4). 10,000 keys whose entries are all missing
# take ~60 s to repair at 16 at a time, well inside the page task's 300 s.
DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, LIST_MAX_KEYS = 1000, 10_000, 1000
# An inline Map runs at most 40 iterations at once in AWS; the ASL's MaxConcurrency is 40 and Plan hands
# out at most ``parallelism`` pages a round.
DEFAULT_PARALLELISM, MAX_PARALLELISM = 4, 40
DEFAULT_MAX_ROUNDS = 100
DEFAULT_LEASE_S, MAX_LEASE_S = 900, 86400
MIN_LEASE_S = 60  # the input's range; rule L1 (min_lease_s of the walk's tasks) is checked on top
INPUT_FIELDS = ("agent", "resume", "full", "page_size", "parallelism", "max_rounds_per_execution", "lease_seconds")

# --- the execution history bound (docs/walks.md, "History") ------------------------------------------
#: Events outside the rounds: start, Begin, the last Plan and Route, Continue or Finish, the end
#: state, and the Abort path — each task with its worst case of retries.
EVENTS_FIXED = 100
#: Per round: Plan (5 events + up to 5 retries of 3 events), Route (2), the Map's own 4 events ...
EVENTS_PER_ROUND = 5 + 15 + 2 + 4
#: ... and per page: 7 events (iteration, task, Lambda) plus 3 per retry, at most 6 + 3 retries.
EVENTS_PER_PAGE = 7 + 3 * (6 + 3)


def history_bound(parallelism: int, rounds: int) -> int:
    """Most history events an execution of ``rounds`` rounds of ``parallelism`` pages can have."""
    return EVENTS_FIXED + rounds * (EVENTS_PER_ROUND + parallelism * EVENTS_PER_PAGE)


def max_rounds_for(parallelism: int) -> int:
    """The most rounds one execution may run and stay inside :data:`HISTORY_BUDGET`."""
    return (HISTORY_BUDGET - EVENTS_FIXED) // (EVENTS_PER_ROUND + parallelism * EVENTS_PER_PAGE)


# --- the Lambda tasks (functions/walk_*/app.py are one line each) ------------------------------------
STEPS = {"begin": "begin", "plan": "plan", "page": "page", "continue": "cont", "end": "end"}
#: function name in the resource spec -> walk step (functions/walk_<step>/app.py)
TASK_STEPS = {f"walk-{step}": step for step in STEPS}


@dataclass(frozen=True)
class WalkParams:
    """A validated execution input (every field optional; unknown fields are refused)."""

    agent: str | None = None
    resume: bool = False
    #: repair every key in full (W5's presence check skipped): after derived entries were deleted
    #: behind the system's back, which a present accepted-by-time entry does not reveal
    full: bool = False
    page_size: int = DEFAULT_PAGE_SIZE
    parallelism: int = DEFAULT_PARALLELISM
    max_rounds: int = DEFAULT_MAX_ROUNDS
    lease_s: int = DEFAULT_LEASE_S

    @classmethod
    def parse(cls, raw: Any) -> "WalkParams":
        integer = ExecutionInput(raw, INPUT_FIELDS, InvalidWalkInput).integer
        agent = raw.get("agent")
        if agent in ("", None):
            agent = None
        else:
            try:
                agent = validate_id(agent, "agent")
            except Exception as exc:
                raise InvalidWalkInput(f"agent: {exc}") from None
        resume = raw.get("resume", False)
        if not isinstance(resume, bool):
            raise InvalidWalkInput("resume must be true or false")
        full = raw.get("full", False)
        if not isinstance(full, bool):
            raise InvalidWalkInput("full must be true or false")
        parallelism = integer("parallelism", DEFAULT_PARALLELISM, 1, MAX_PARALLELISM)
        limit = max_rounds_for(parallelism)
        lease_s = integer("lease_seconds", DEFAULT_LEASE_S, MIN_LEASE_S, MAX_LEASE_S)
        broken = task_lease_rule_broken(lease_s, TASK_STEPS)
        if broken:
            raise InvalidWalkInput(broken)
        return cls(
            agent=agent,
            resume=resume,
            full=full,
            page_size=integer("page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE),
            parallelism=parallelism,
            max_rounds=min(integer("max_rounds_per_execution", DEFAULT_MAX_ROUNDS, 1, 10**6), limit),
            lease_s=lease_s,
        )

    @property
    def agent_hex(self) -> str | None:
        return None if self.agent is None else id_to_hex(self.agent)


__all__ = ["DEFAULT_LEASE_S", "DEFAULT_MAX_ROUNDS", "DEFAULT_PAGE_SIZE", "DEFAULT_PARALLELISM", "EVENTS_FIXED",
           "EVENTS_PER_PAGE", "EVENTS_PER_ROUND", "HISTORY_BUDGET", "HISTORY_LIMIT", "INPUT_FIELDS", "LIST_MAX_KEYS",
           "MAX_LEASE_S", "MAX_PAGE_SIZE", "MAX_PARALLELISM", "MIN_LEASE_S", "STEPS", "TASK_STEPS", "WalkParams",
           "history_bound", "max_rounds_for"]
