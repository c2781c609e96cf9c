"""The walk's typed checkpoint (derived/walk/checkpoint.py) at the control-store boundary: an item
read and written back is the item (attributes this version does not know included), Begin stores
the checkpoint as it always has, and the progress summary's ``to_json()`` is the dict the CLI
prints and End answers.
"""

from __future__ import annotations

import json
from typing import Any

from conftest import ident
from hypothesis import given, settings
from hypothesis import strategies as st
from memory_support import memory_world

from lightmetrics.derived.walk import (
    ListCursor,
    ListLevel,
    WalkCheckpoint,
    WalkEnumeration,
    Walker,
    WalkPartition,
    summarize,
    watermark_blocker,
)
from lightmetrics.jobs.kernel import JobStatus

_NS = 1_000_000_000
OUTCOMES = {"DONE": 2, "NOOP_RESOLVED": 5, "RETRY_LATER": 0, "BLOCKED": 1, "SKIPPED": 0}
#: a running walk's summary item, every attribute in the order Begin writes them
ITEM: dict[str, Any] = {
    "pk": "checkpoint#walk", "sk": "current", "epoch": 3, "owner": "o", "scope": "all", "agent": None,
    "status": "running", "started_at_ns": 10 * _NS, "updated_at_ns": 20 * _NS, "rate_since_ns": 12 * _NS,
    "rate_keys_base": 4, "page_size": 500, "full": False, "parallelism": 2, "execution": "arn:x", "executions": 2,
    "resumes": 1, "enum": {"queue": [], "done": True}, "partitions_found": 4, "partitions_done": 1,
    "keys_accepted": 7, "keys_quarantine": 1, "keys": 8, "pages": 3, "outcomes": OUTCOMES,
    "keys_present": 4, "keys_reaped": 1}
PARTS = [WalkPartition.of({"sk": "part#accepted/v1/a/b/", "kind": "accepted", "epoch": 3, "keys": 6, "pages": 2,
                           "done": True, "outcomes": {"DONE": 1, "NOOP_RESOLVED": 5}, "keys_present": 5}),
         WalkPartition.of({"sk": "part#quarantine/v1/identity-conflict/a/c/", "kind": "quarantine", "epoch": 3,
                           "keys": 2, "pages": 1, "outcomes": {"DONE": 2}})]


def test_the_summary_is_the_dict_the_cli_prints_and_end_answers() -> None:
    """Computed by the dict-based summarize this record replaced, on the same items."""
    summary = summarize(WalkCheckpoint.of(ITEM), PARTS, 30 * _NS)
    assert json.dumps(summary.to_json()) == json.dumps({
        "scope": "all", "epoch": 3, "status": "running", "started_at_ns": 10 * _NS, "updated_at_ns": 20 * _NS,
        "executions": 2, "resumes": 1, "execution": "arn:x", "partitions_found": 4, "partitions_done": 2,
        "enumeration_complete": True, "in_progress": ["quarantine/v1/identity-conflict/a/c/"], "keys": 16,
        "keys_accepted": 13, "keys_quarantine": 3, "pages": 6, "repairs": 5,
        "outcomes": {"DONE": 5, "NOOP_RESOLVED": 10, "RETRY_LATER": 0, "BLOCKED": 1, "SKIPPED": 0},
        "keys_present": 9, "keys_reaped": 1, "keys_per_s": 0.7, "eta_s": 24.0, "watermark_ns": None,
        "watermark_withheld": None, "error": None})
    assert summary.checkpoint_pk == "checkpoint#walk" and summary.status is JobStatus.RUNNING
    # an item lacking most attributes (a planted one): missing stays missing (null), counters 0
    failed = summarize(WalkCheckpoint.of({"pk": "checkpoint#walk", "sk": "current", "status": "failed", "epoch": 4,
                                          "error": "boom"}), [], 30 * _NS).to_json()
    assert failed == {
        "scope": None, "epoch": 4, "status": "failed", "started_at_ns": None, "updated_at_ns": None,
        "executions": None, "resumes": 0, "execution": None, "partitions_found": 0, "partitions_done": 0,
        "enumeration_complete": False, "in_progress": [], "keys": 0, "keys_accepted": 0, "keys_quarantine": 0,
        "pages": 0, "repairs": 0, "outcomes": {o: 0 for o in OUTCOMES}, "keys_present": 0, "keys_reaped": 0,
        "keys_per_s": None, "eta_s": None, "watermark_ns": None, "watermark_withheld": None, "error": "boom"}


def test_a_finished_walk_without_its_enumeration_sets_no_watermark() -> None:
    finished = WalkCheckpoint.of({**ITEM, "status": "finished", "finished_at_ns": 25 * _NS, "watermark_ns": 5,
                                  "enum": {"queue": [], "done": False}})
    assert watermark_blocker(finished, []) == "the walk did not cover every partition"
    summary = summarize(finished, [], 30 * _NS).to_json()
    assert (summary["status"], summary["keys_per_s"], summary["eta_s"], summary["watermark_ns"]) == \
        ("finished", 0.3, None, 5)  # the rate up to when it finished
    no_enum = WalkCheckpoint.of({k: v for k, v in ITEM.items() if k != "enum"})
    assert no_enum.enum is None and watermark_blocker(no_enum, []) == "the walk did not cover every partition"
    assert watermark_blocker(WalkCheckpoint.of(ITEM), []) == "items ended BLOCKED: 1"


_KNOWN = set(ITEM) | {"finished_at_ns", "failed_at_ns", "watermark_ns", "watermark_withheld", "error",
                      "next_execution"}
_values = st.one_of(st.integers(-10**18, 10**18), st.text(max_size=8), st.booleans(),
                    st.lists(st.text(max_size=4), max_size=3))
_extra = st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda k: k not in _KNOWN), _values, max_size=4)
_cursor = st.builds(lambda p, lv, t: {"prefix": p, "level": lv, "token": t}, st.text(min_size=1, max_size=20),
                    st.sampled_from(["agents", "boots"]), st.one_of(st.none(), st.text(min_size=1, max_size=8)))


@settings(max_examples=60, deadline=None)
@given(extra=_extra, queue=st.lists(_cursor, max_size=3), done=st.booleans(),
       later=st.fixed_dictionaries({}, optional={"finished_at_ns": st.integers(0, 10**19), "watermark_ns": st.integers(0, 10**19),
                                                 "watermark_withheld": st.text(max_size=10), "error": st.text(max_size=10),
                                                 "next_execution": st.text(max_size=10)}),
       cursor_extra=st.dictionaries(st.sampled_from(["hint", "v"]), st.integers(), max_size=1))
def test_an_item_read_and_written_back_is_the_item(extra: dict[str, Any], queue: list[dict[str, Any]], done: bool,
                                                   later: dict[str, Any], cursor_extra: dict[str, Any]) -> None:
    """Stored form unchanged, attribute order included; attributes this version does not model (a
    write token, a newer version's) are carried through a rewrite, in the queue's cursors too."""
    queue = [{**c, **cursor_extra} for c in queue]
    # the attributes End and Continue add, in the order stored() writes them
    later = {k: later[k] for k in ("finished_at_ns", "watermark_ns", "watermark_withheld", "error", "next_execution")
             if k in later}
    item = {**ITEM, "enum": {"queue": queue, "done": done}, **later, **extra}
    cp = WalkCheckpoint.of(item)
    assert json.dumps(cp.stored()) == json.dumps(item)
    assert all(isinstance(c, ListCursor) and isinstance(c.level, ListLevel) for c in (cp.enum or WalkEnumeration()).queue)
    assert cp.status is JobStatus.RUNNING and cp.counters.outcomes == OUTCOMES and cp.extra == extra


def test_begin_stores_the_checkpoint_as_before_and_plan_its_enumeration() -> None:
    w = memory_world(settle_s=600)
    for i in range(3):
        w.accept(ident(i, agent=f"agent-{i % 2}"))
    walker = Walker(w.ctx, w.settings)
    run = walker.begin({"input": {"page_size": 2, "parallelism": 1}, "execution_arn": "inline"})["walk"]
    item = w.table.get(run["checkpoint_pk"], "current")
    assert [k for k in item if k != "write_token"] == [
        "pk", "sk", "epoch", "owner", "scope", "status", "started_at_ns", "updated_at_ns", "rate_since_ns",
        "rate_keys_base", "page_size", "full", "parallelism", "execution", "executions", "resumes", "enum",
        "partitions_found", "partitions_done", "keys_accepted", "keys_quarantine", "keys", "pages", "outcomes",
        "keys_present", "keys_reaped"]  # ("agent": None is not stored by the table)
    assert item["enum"] == {"queue": [{"prefix": "accepted/v1/", "level": "agents", "token": None},
                                      {"prefix": "quarantine/v1/identity-conflict/", "level": "agents", "token": None}],
                            "done": False}
    walker.plan({"walk": run})
    enum = w.table.get(run["checkpoint_pk"], "current")["enum"]
    assert json.dumps(enum) == json.dumps({"queue": [
        {"prefix": "accepted/v1/agent=6167656e742d31/", "level": "boots", "token": None},
        {"prefix": "quarantine/v1/identity-conflict/", "level": "agents", "token": None}], "done": False})
