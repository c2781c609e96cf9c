"""The one invariant catalogue (issue 16): its predicates, table-driven; the table in
docs/protocol.md §13.1 equals it; and ``lmctl verify``, the inventory audit and the ledger name the
same planted fault by the same rule (and none of them reports the reaped state)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import FAST, T0_NS, ident, make_frame
from pipeline_support import access_for, make_system

from lightmetrics.acceptance.accept import accept_batch
from lightmetrics.composition.services import accept_context
from lightmetrics.derived.indexing import index_accepted, index_raw_blob
from lightmetrics.harness.ledger import check_acknowledged, missing_derived, missing_derived_lines
from lightmetrics.operator_tools import invariants as inv
from lightmetrics.operator_tools.verify import verify
from lightmetrics.protocol.clock import FrozenClock
from lightmetrics.protocol.keys import UtcHour
from lightmetrics_pipeline.audit.job import CATEGORIES, read_findings, run_audit
from lightmetrics_pipeline.inventory import report as inv_report

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------- predicates

BLOB = [  # (blob_size, record_bytes, hour_tombstoned, gc_marked) -> rule name or None
    ((10, 10, False, False), None),
    ((10, 10, True, False), None),  # a late retry re-created the blob of a reaped hour: fine
    ((9, 10, False, False), "blob-size"),
    ((9, None, False, False), None),  # presence only (the ledger)
    ((None, 10, False, False), "blob-missing"),
    ((None, 10, True, False), "reaped"),
    ((None, 10, True, True), "reaped"),
    ((None, 10, False, True), "gc-held"),
]
ENTRY = [  # (entry_present, hour_tombstoned, required)
    ((True, False, True), None),
    ((True, True, True), None),
    ((False, False, True), "missing-derived"),
    ((False, False, False), "pending"),
    ((False, True, True), "reaped"),
    ((False, True, False), "reaped"),
]
SOURCE = [  # (source_present, source_is_blob, hour_tombstoned, gc_marked)
    ((True, False, False, False), None),
    ((False, False, False, False), "derived-without-source"),
    ((False, False, True, True), "derived-without-source"),  # a record or quarantine manifest is never excused
    ((False, True, False, False), "derived-without-source"),
    ((False, True, True, False), "reaped"),
    ((False, True, False, True), "gc-held"),
]
EVIDENCE = [  # (blob_present, resolved, hour_tombstoned)
    ((True, False, False), None),
    ((False, False, False), "quarantine-incomplete"),
    ((False, True, False), "evidence-collected"),
    ((False, False, True), "evidence-collected"),
]
ACKS = [  # (hashes, record_sha)
    (({"a"}, "a"), None),
    (({"a", "b"}, "a"), "acknowledged-twice"),
    (({"a"}, None), "acknowledged-not-accepted"),
    (({"a"}, "b"), "acknowledged-other-hash"),
]


def _name(rule: inv.Rule | None) -> str | None:
    return None if rule is None else rule.name


@pytest.mark.parametrize(("facts", "want"), BLOB)
def test_blob_state(facts: tuple[Any, ...], want: str | None) -> None:
    size, record, tomb, marked = facts
    assert _name(inv.blob_state(blob_size=size, record_bytes=record, hour_tombstoned=tomb, gc_marked=marked)) == want


@pytest.mark.parametrize(("facts", "want"), ENTRY)
def test_derived_entry_state(facts: tuple[Any, ...], want: str | None) -> None:
    present, tomb, required = facts
    assert _name(inv.derived_entry_state(entry_present=present, hour_tombstoned=tomb, required=required)) == want


@pytest.mark.parametrize(("facts", "want"), SOURCE)
def test_derived_source_state(facts: tuple[Any, ...], want: str | None) -> None:
    present, is_blob, tomb, marked = facts
    got = inv.derived_source_state(source_present=present, source_is_blob=is_blob, hour_tombstoned=tomb,
                                   gc_marked=marked)
    assert _name(got) == want


@pytest.mark.parametrize(("facts", "want"), EVIDENCE)
def test_evidence_state(facts: tuple[Any, ...], want: str | None) -> None:
    present, resolved, tomb = facts
    assert _name(inv.evidence_state(blob_present=present, resolved=resolved, hour_tombstoned=tomb)) == want


@pytest.mark.parametrize(("facts", "want"), ACKS)
def test_acknowledged_state(facts: tuple[Any, ...], want: str | None) -> None:
    hashes, record_sha = facts
    assert _name(inv.acknowledged_state(hashes=hashes, record_sha=record_sha)) == want


def test_overlaps_and_the_tombstone_exemption() -> None:
    assert inv.overlaps(9, 5) is inv.OVERLAPPING_RANGES and inv.overlaps(9, 9) is inv.OVERLAPPING_RANGES
    assert inv.overlaps(9, 10) is None and inv.overlaps(-1, 0) is None
    assert inv.tombstone_exemption(True) is inv.REAPED and inv.tombstone_exemption(False) is None


def test_every_rule_has_one_name_a_severity_and_a_checker() -> None:
    assert all(name == rule.name for name, rule in inv.RULES.items())
    assert all(rule.checked_by and set(rule.checked_by) <= {"verify", "audit", "ledger"} for rule in inv.RULES.values())
    assert {r.name for r in inv.RULES.values() if r.severity is inv.Severity.EXPECTED} == {
        "reaped", "gc-held", "pending", "evidence-collected", "orphan-blob"}
    assert inv.is_violation(inv.BLOB_MISSING) and not inv.is_violation(inv.REAPED) and not inv.is_violation(None)


def test_the_protocol_table_lists_exactly_the_catalogue() -> None:
    """docs/protocol.md §13.1: one row per rule, in the catalogue's order, with its severity and
    checkers; the audit's rules name their output folder; and each rule's meaning follows the table."""
    from lightmetrics_pipeline.audit.confirm import CATEGORY_OF_RULE

    text = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    section = text.split("### 13.1 ", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \| (violation|warning|expected) \| ([^|]+) \|$", section, re.M)
    assert [name for name, _, _ in rows] == list(inv.RULES)
    assert re.findall(r"^\* `([a-z-]+)`: \S", section, re.M) == list(inv.RULES)
    for name, severity, checked in rows:
        rule = inv.RULES[name]
        assert severity == rule.severity.value, name
        checkers = set(re.findall(r"verify|audit|ledger", checked))
        assert checkers == set(rule.checked_by), name
        if name in CATEGORY_OF_RULE:
            assert f"`{CATEGORY_OF_RULE[name]}`" in checked, name
    assert set(CATEGORY_OF_RULE.values()) == set(CATEGORIES)


# ------------------------------------------------------------------ one fault, one name, three tools


def test_verify_the_audit_and_the_ledger_name_a_planted_fault_alike(runtime, clock, spark):  # type: ignore[no-untyped-def]
    """Three planted states: a record without its accepted-by-time entry, a blob gone in an hour
    without a tombstone, and a blob gone in a tombstoned hour (expected: reported by none)."""
    system = make_system(runtime, clock)
    s3, b = runtime.boto3_client("s3"), system.bucket
    actx = accept_context(system.settings, client=s3, clock=clock, policy=FAST)
    earlier = FrozenClock(T0_NS - 2 * 3600 * 10**9)  # another acceptance hour, tombstoned below
    old_ctx = accept_context(system.settings, client=s3, clock=earlier, policy=FAST)
    results = [accept_batch(actx, ident(n), make_frame(ident(n))) for n in range(3)]
    reaped = accept_batch(old_ctx, ident(7), make_frame(ident(7)))
    ctx = system.work_context(policy=FAST)
    for r in (*results, reaped):
        index_accepted(ctx, r.manifest_key)
        index_raw_blob(ctx, r.blob_key)
    codec = ctx.codec
    no_time, no_blob = results[1], results[2]
    s3.delete_object(Bucket=b, Key=codec.accepted_by_time(UtcHour.of_unix_ns(T0_NS), ident(1)))
    s3.delete_object(Bucket=b, Key=no_blob.blob_key)
    s3.delete_object(Bucket=b, Key=reaped.blob_key)
    s3.put_object(Bucket=b, Key=codec.retention_tombstone("raw", UtcHour.of_unix_ns(earlier.now_ns())), Body=b"{}")
    (no_blob_entry,) = [k for k in _keys(s3, b, "raw-blobs-by-time/v1/") if no_blob.frame_sha256 in k]
    want = {("missing-derived", no_time.manifest_key), ("blob-missing", no_blob.manifest_key),
            ("derived-without-source", no_blob_entry)}

    # lmctl verify
    report = verify(ctx, strict=True)
    assert {(v.rule, v.keys[0]) for v in report.violations} == want
    assert report.expected["reaped"] == 1 and not report.warnings

    # the inventory audit: every finding line names its rule; the folders stay the consumers'
    access = access_for(system, runtime, "pipeline-audit")
    written = inv_report.snapshot(access, inv_report.Destination.parse(f"s3://{b}/inventory"))
    inventory = inv_report.open_report(written.manifest_location, access)
    audit = run_audit(spark, inv_report.inventory_dataframe(spark, inventory, access), access, run_id="names",
                      now_s=int(time.time()), retry_horizon_s=7 * 86400)
    found = {c: read_findings(access, "names", c) for c in CATEGORIES}
    assert all("rule" in f for rows in found.values() for f in rows)
    assert {(f["rule"], f.get("manifest_key") or f["entry_key"]) for rows in found.values() for f in rows} == want
    assert {f["rule"] for f in found["repair"]} == {"missing-derived"}
    assert {f["rule"] for f in found["integrity"]} == {"blob-missing"}
    assert audit.confirmed_by_rule == {"missing-derived": 1, "blob-missing": 1, "derived-without-source": 1}

    # the ledger
    acked = {ident(n): {r.frame_sha256} for n, r in enumerate(results)} | {ident(7): {reaped.frame_sha256}}
    check = check_acknowledged(ctx.store, codec, acked)
    assert dict(check.rules) == {"blob-missing": 1} and check.reaped == 1 and check.verified == 2
    assert check.violations == [f"blob-missing: {ident(2)}: blob {no_blob.blob_key} missing and its hour is not reaped"]
    missing = missing_derived(ctx.store, codec, check.manifests)
    assert missing_derived_lines(missing) == ["missing-derived: 1 accepted batches lack their accepted-by-time entry"]


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]
