"""``lmctl verify``: the bucket-wide invariant oracle (docs/protocol.md §13).

It lists every layout prefix, reads every acceptance record and every quarantine manifest, and
checks, reporting each violation with the keys involved under its rule's name from the one
catalogue, :mod:`lightmetrics.operator_tools.invariants` (whose predicates decide; the audit and the ledger use
the same names):

* ``invalid-manifest``: an acceptance record that does not parse or does not match its key
  (validation is :func:`lightmetrics.derived.indexing.load_manifest`, the same as every reader's);
  ``unsupported-version``: one written by a newer version (docs/protocol.md §17). Either way GC
  keeps every blob such a record may name, and the record's blocker says so;
* ``blob-missing`` / ``blob-size``: an accepted batch's raw blob is gone or has another size —
  unless the batch's hour is tombstoned by retention: *manifest present, blob gone, hour
  tombstoned* is the expected reaped state (counted as ``reaped``, not a violation);
* ``derived-without-source`` / ``derived-mismatch`` / ``bad-key``: a derived entry whose source does not
  exist (or names another hash), or a key under a derived prefix that is not ours;
* ``quarantine-incomplete``: a quarantine manifest that does not parse, whose acceptance record
  is missing, or whose submitted blob (the evidence) is gone;
* ``missing-derived``: an accepted manifest (or quarantine manifest) from before the index's
  completeness watermark W without its derived entry. Newer ones lacking an entry are
  ``pending`` (the event path or the next walk writes them), each listed with its age
  (:class:`PendingFinding`: W moves weekly, docs/protocol.md §13 W6); ``strict`` requires every
  entry regardless of W (for a quiet system right after a walk, as in the demo and tests);
* ``segment`` / ``segment-conflict``: a v2 segment or sealed part a reader refuses (V-D4), or two
  unequal v2 entries for one key (V-D7), by key and reason (:mod:`~lightmetrics.operator_tools.verify_v2`);
  the v2 entries read count as present for ``missing-derived`` and are checked against their sources;
* ``reaped-without-tombstone`` / ``reaped-not-empty``: a retention ``reaped`` marker without its
  tombstone, or a reaped hour that still has ``accepted-by-time`` entries (a writer re-created
  derived state under a tombstone);
* ``overlapping-ranges`` (warning): sequence ranges overlapping within one boot — legal for the protocol,
  but those samples would be counted twice.

A violation on an object whose blocker an operator skipped (``lmctl blockers skip --reason``)
is listed as *acknowledged* instead. Counts per prefix come with the report, and the expected
states found (``reaped``, ``evidence-collected``) are counted per rule in ``expected``.

Example:
    >>> report = verify(ctx, strict=True)                      # doctest: +SKIP
    >>> report.ok, report.counts["accepted/v1/"]               # doctest: +SKIP
    (True, 1000)
"""

from __future__ import annotations

import contextvars
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from lightmetrics.derived.indexing import load_manifest
from lightmetrics.operator_tools import invariants as inv
from lightmetrics.operator_tools.verify_report import Finding, PendingFinding, VerifyReport
from lightmetrics.operator_tools.verify_v2 import V2_LISTED, list_sized, read_v2
from lightmetrics.protocol.errors import KeyLayoutError, ManifestError
from lightmetrics.protocol.keys import LAYOUT_ROOTS, KeyKind, UtcHour, layout_root
from lightmetrics.protocol.manifests import AcceptedBatchManifest, IdentityConflictManifest
from lightmetrics.protocol.segment_entries import AcceptedSegmentEntry
from lightmetrics.work.outcome import PermanentWorkError
from lightmetrics.work.pool import map_in_context
from lightmetrics.work.units import WorkContext

__all__ = ["Finding", "PendingFinding", "VerifyReport", "verify"]

# The listings are keyed by layout root (also the report's counts).
_ACCEPTED, _BLOBS, _QUARANTINE = (layout_root(k) for k in (KeyKind.ACCEPTED, KeyKind.RAW_BLOB, KeyKind.QUARANTINE))
_RESOLUTIONS, _RETENTION = layout_root(KeyKind.CONFLICT_RESOLUTION), layout_root(KeyKind.RETENTION_TOMBSTONE)
_BY_TIME, _BY_BLOB = layout_root(KeyKind.ACCEPTED_BY_TIME), layout_root(KeyKind.ACCEPTED_BY_BLOB)
_BLOBS_BY_TIME, _QUARANTINE_BY_BLOB = layout_root(KeyKind.RAW_BLOBS_BY_TIME), layout_root(KeyKind.QUARANTINE_BY_BLOB)
_DERIVED_OF = {  # derived root -> the index name its watermark uses
    _BY_TIME: "accepted-by-time",
    _BY_BLOB: "accepted-by-blob",
    _BLOBS_BY_TIME: "raw-blobs-by-time",
    _QUARANTINE_BY_BLOB: "quarantine-by-blob",
}


def _list_all(ctx: WorkContext, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` with its size."""
    return list_sized(ctx.store, prefix)


def verify(ctx: WorkContext, *, strict: bool = False, watermarks: dict[str, int | None] | None = None,
           workers: int = 16, progress: Callable[[str], None] | None = None) -> VerifyReport:
    """Check the whole namespace; see the module docstring for what is checked. ``progress`` is
    told each phase as it begins (``lmctl verify`` shows it on stderr)."""
    say = progress or (lambda _: None)
    from lightmetrics.derived.walk import read_watermarks

    report = VerifyReport(strict=strict)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lm-verify")

    def call(fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return pool.submit(contextvars.copy_context().run, fn, *args)

    try:
        roots = (*LAYOUT_ROOTS, *V2_LISTED)
        say(f"listing {len(roots)} prefixes")
        prefix = ctx.codec.prefix
        listed = {p: f.result() for p, f in {p: call(_list_all, ctx, prefix + p) for p in roots}.items()}
        report.counts = {p: len(v) for p, v in listed.items()}
        say(f"listed {sum(report.counts.values()):,} objects")
        table = ctx.table
        if watermarks is None:
            watermarks = read_watermarks(table) if table is not None else {i: None for i in _DERIVED_OF.values()}
        report.watermarks = dict(watermarks)
        # A context without a control table has no operator decisions; a configured table that
        # cannot be read is an error (ResourceAccessError), never "nothing was skipped".
        skipped = {b.object_key for b in ctx.blockers.list(status="skipped")} if table is not None else set()
        run = _Run(ctx, report, listed, skipped, pool)
        run.retention_markers()
        say(f"reading {len(listed[_ACCEPTED]):,} acceptance records")
        run.acceptance_records()
        say(f"reading {len(listed[_QUARANTINE]):,} quarantine manifests")
        run.quarantine_manifests()
        say("checking derived entries against their sources")
        run.derived_sources()
        run.v2_entries()
        run.derived_entries(lambda index, at_ns: strict or (
            (w := (watermarks or {}).get(index)) is not None and at_ns < w))
        run.overlapping_ranges()
        report.pending_findings.sort(key=lambda p: (p.accepted_at_ns, p.keys))  # the oldest first
    finally:
        pool.shutdown(wait=True)
    return report


class _Run:
    """One verification: the listings, what was read so far, and where findings go. Each method is
    one phase; every decision is a predicate of :mod:`lightmetrics.operator_tools.invariants`."""

    def __init__(self, ctx: WorkContext, report: VerifyReport, listed: dict[str, dict[str, int]],
                 skipped: set[str], pool: ThreadPoolExecutor) -> None:
        self.ctx, self.codec, self.report, self.listed, self.skipped, self.pool = \
            ctx, ctx.codec, report, listed, skipped, pool
        self.accepted, self.blobs = listed[_ACCEPTED], listed[_BLOBS]
        self.tombstoned: set[UtcHour] = set()
        self.manifests: dict[str, AcceptedBatchManifest] = {}
        self.conflicts: dict[str, IdentityConflictManifest] = {}
        self.raw_by_time_shas: set[str] = set()
        self.v2_accepted: set[str] = set()  # the records a v2 accepted-by-time entry names

    def note(self, rule: inv.Rule, keys: list[str], detail: str) -> None:
        finding = Finding(rule.name, tuple(keys), detail)
        if rule.severity is inv.Severity.WARNING:
            self.report.warnings.append(finding)
        elif rule.severity is inv.Severity.EXPECTED:
            self.report.expected[rule.name] += 1
        elif any(k in self.skipped for k in keys):
            self.report.acknowledged.append(finding)
        else:
            self.report.violations.append(finding)

    def hour_tombstoned(self, m: AcceptedBatchManifest) -> bool:
        return UtcHour.of_unix_ns(m.accepted_at_unix_ns) in self.tombstoned

    def retention_markers(self) -> None:
        """Tombstones and reaped markers. Retention (docs/protocol.md §10): a reaped marker is
        written only after its tombstone and after the hour's accepted-by-time entries are gone;
        writers never re-create them."""
        codec, reaped = self.codec, set()
        for key in self.listed[_RETENTION]:
            try:
                parsed = codec.parse(key)
            except KeyLayoutError:
                self.note(inv.BAD_KEY, [key], "not a retention key of the layout")
                continue
            if parsed.kind is KeyKind.RETENTION_TOMBSTONE and parsed.scope == "raw" and parsed.hour is not None:
                self.tombstoned.add(parsed.hour)
            elif parsed.kind is KeyKind.RETENTION_REAPED and parsed.scope == "raw" and parsed.hour is not None:
                reaped.add(parsed.hour)
        for hour in sorted(reaped - self.tombstoned):
            self.note(inv.REAPED_WITHOUT_TOMBSTONE, [codec.retention_reaped("raw", hour)], f"{hour} has no tombstone")
        for hour in sorted(reaped):
            left = [k for k in self.listed[_BY_TIME] if k.startswith(codec.accepted_by_time_hour(hour))]
            if left:
                self.note(inv.REAPED_NOT_EMPTY, left[:10],
                          f"{hour} is reaped but {len(left)} accepted-by-time entries remain")

    def acceptance_records(self) -> None:
        """Every record valid, its blob present with its size (or the hour reaped)."""
        def read(key: str) -> AcceptedBatchManifest | Finding:
            try:
                return load_manifest(self.ctx, key)
            except PermanentWorkError as exc:
                rule = inv.UNSUPPORTED_VERSION if exc.kind == "unsupported-version" else inv.INVALID_MANIFEST
                return Finding(rule.name, (key,), exc.reason)

        for key, m in zip(self.accepted, map_in_context(self.pool, read, self.accepted)):
            self.report.checked["acceptance records"] += 1
            if isinstance(m, Finding):
                self.note(inv.by_name(m.rule), list(m.keys), m.detail)
                continue
            self.manifests[key] = m
            hour = UtcHour.of_unix_ns(m.accepted_at_unix_ns)
            size = self.blobs.get(m.raw_blob_key)
            rule = inv.blob_state(blob_size=size, record_bytes=m.frame_bytes, hour_tombstoned=hour in self.tombstoned)
            if rule is not None:
                detail = f"accepted at {hour}, hour not tombstoned" if size is None else \
                    f"blob is {size} bytes, the record says {m.frame_bytes}"
                self.note(rule, [key, m.raw_blob_key], detail)

    def quarantine_manifests(self) -> None:
        """Every quarantine manifest complete: its record, and its evidence until GC may collect it."""
        codec, resolutions = self.codec, self.listed[_RESOLUTIONS]
        quarantine = self.listed[_QUARANTINE]
        for key, (q, why) in zip(quarantine, map_in_context(self.pool, self._read_quarantine, quarantine)):
            self.report.checked["quarantine manifests"] += 1
            if q is None:
                self.note(inv.QUARANTINE_INCOMPLETE, [key], why)
                continue
            self.conflicts[key] = q
            if q.accepted_manifest_key not in self.accepted:
                self.note(inv.QUARANTINE_INCOMPLETE, [key, q.accepted_manifest_key], "its acceptance record is missing")
            accepted_m = self.manifests.get(q.accepted_manifest_key)
            rule = inv.evidence_state(
                blob_present=q.submitted_raw_blob_key in self.blobs,
                resolved=codec.conflict_resolution(q.identity, q.submitted_frame_sha256) in resolutions,
                hour_tombstoned=accepted_m is not None and self.hour_tombstoned(accepted_m))
            if rule is not None:
                self.note(rule, [key, q.submitted_raw_blob_key], "the submitted blob (evidence) is missing")

    def _read_quarantine(self, key: str) -> tuple[IdentityConflictManifest | None, str]:
        try:
            parsed = self.codec.parse(key)
        except KeyLayoutError as exc:
            return None, str(exc)
        if parsed.kind is not KeyKind.QUARANTINE:
            return None, f"a {parsed.kind.value} key under {_QUARANTINE}"
        raw = self.ctx.store.get(key)
        if raw is None:
            return None, "vanished while verifying"
        try:
            q = IdentityConflictManifest.from_bytes(raw)
        except ManifestError as exc:
            return None, str(exc)
        if q.identity != parsed.identity or q.submitted_frame_sha256 != parsed.sha256:
            return None, "content does not match its key"
        return q, ""

    def derived_sources(self) -> None:
        """Every derived entry points at an existing source (a blob reaped with its hour excused)."""
        codec, quarantine = self.codec, self.listed[_QUARANTINE]
        reaped_shas = {m.frame_sha256 for m in self.manifests.values() if self.hour_tombstoned(m)}
        for prefix in _DERIVED_OF:
            for key in self.listed[prefix]:
                self.report.checked["derived entries"] += 1
                try:
                    parsed = codec.parse(key)
                except KeyLayoutError:
                    self.note(inv.BAD_KEY, [key], f"not a {prefix} key of the layout")
                    continue
                if parsed.kind is KeyKind.ACCEPTED_BY_TIME or parsed.kind is KeyKind.ACCEPTED_BY_BLOB:
                    assert parsed.identity is not None
                    src = codec.accepted(parsed.identity)
                    rule = inv.derived_source_state(source_present=src in self.accepted)
                    if rule is not None:
                        self.note(rule, [key, src], "its acceptance record does not exist")
                    elif parsed.sha256 and src in self.manifests and self.manifests[src].frame_sha256 != parsed.sha256:
                        self.note(inv.DERIVED_MISMATCH, [key, src], "names another blob than the record")
                elif parsed.kind is KeyKind.RAW_BLOBS_BY_TIME:
                    assert parsed.sha256 is not None
                    self.raw_by_time_shas.add(parsed.sha256)
                    blob = codec.raw_blob(parsed.sha256)
                    rule = inv.derived_source_state(
                        source_present=blob in self.blobs, source_is_blob=True,
                        hour_tombstoned=parsed.hour in self.tombstoned or parsed.sha256 in reaped_shas)
                    if rule is not None and rule is not inv.REAPED:  # the record's blob_state counted it
                        self.note(rule, [key, blob], "its raw blob does not exist")
                elif parsed.kind is KeyKind.QUARANTINE_BY_BLOB:
                    assert parsed.identity is not None and parsed.sha256 is not None
                    src = codec.quarantine(parsed.identity, parsed.sha256)
                    rule = inv.derived_source_state(source_present=src in quarantine)
                    if rule is not None:
                        self.note(rule, [key, src], "its quarantine manifest does not exist")
                else:
                    self.note(inv.BAD_KEY, [key], f"a {parsed.kind.value} key under {prefix}")

    def v2_entries(self) -> None:
        """v2 segments and seals: refusals are findings; each entry's source exists (as for v1)."""
        got = read_v2(self.ctx, self.listed, self.pool)
        self.report.checked["v2 objects"] += got.objects
        for refusal, keys, detail in got.refusals:
            self.note(refusal, keys, detail)
        reaped_shas = {m.frame_sha256 for m in self.manifests.values() if self.hour_tombstoned(m)}
        for _, hour, source, entry in got.entries:
            if isinstance(entry, AcceptedSegmentEntry):
                self.v2_accepted.add(entry.manifest_key)
                rule = inv.derived_source_state(source_present=entry.manifest_key in self.accepted)
                m = self.manifests.get(entry.manifest_key)
                if rule is not None:
                    self.note(rule, [source, entry.manifest_key], "its acceptance record does not exist")
                elif m is not None and m.frame_sha256 != entry.frame_sha256:
                    self.note(inv.DERIVED_MISMATCH, [source, entry.manifest_key], "names another blob than the record")
            else:
                self.raw_by_time_shas.add(entry.sha256)
                rule = inv.derived_source_state(source_present=entry.raw_blob_key in self.blobs, source_is_blob=True,
                                                hour_tombstoned=hour in self.tombstoned or entry.sha256 in reaped_shas)
                if rule is not None and rule is not inv.REAPED:
                    self.note(rule, [source, entry.raw_blob_key], "its raw blob does not exist")

    def derived_entries(self, required: Callable[[str, int], bool]) -> None:
        """Nothing accepted before W (per index; everything when strict) lacks a derived entry."""
        codec = self.codec
        present = {p: set(self.listed[p]) for p in _DERIVED_OF}
        for key, m in self.manifests.items():
            hour, ident = UtcHour.of_unix_ns(m.accepted_at_unix_ns), m.identity
            has = {
                "accepted-by-time": codec.accepted_by_time(hour, ident) in present[_BY_TIME] or key in self.v2_accepted,
                "accepted-by-blob": codec.accepted_by_blob(m.frame_sha256, ident) in present[_BY_BLOB],
                # an absent blob is blob_state's finding, not a missing index entry
                "raw-blobs-by-time": m.frame_sha256 in self.raw_by_time_shas or m.raw_blob_key not in self.blobs,
            }
            for index, ok in has.items():
                rule = inv.derived_entry_state(entry_present=ok, hour_tombstoned=hour in self.tombstoned,
                                               required=required(index, m.accepted_at_unix_ns))
                self._derived(rule, index, [key], f"no {index} entry (accepted at {hour})", m.accepted_at_unix_ns)
        for key, q in self.conflicts.items():
            entry = codec.quarantine_by_blob(q.submitted_frame_sha256, q.identity)
            rule = inv.derived_entry_state(entry_present=entry in present[_QUARANTINE_BY_BLOB],
                                           hour_tombstoned=False,
                                           required=required("quarantine-by-blob", q.observed_at_unix_ns))
            self._derived(rule, "quarantine-by-blob", [key, entry], "no quarantine-by-blob entry", q.observed_at_unix_ns)

    def _derived(self, rule: inv.Rule | None, index: str, keys: list[str], detail: str, at_ns: int) -> None:
        if rule is inv.PENDING:  # expected for now; its age shows how long it has been waiting
            self.report.pending[index] += 1
            age_s = max(0, (self.ctx.clock.now_ns() - at_ns) // 1_000_000_000)
            self.report.pending_findings.append(PendingFinding(index, tuple(keys), at_ns, age_s))
        elif rule is inv.MISSING_DERIVED:
            self.note(rule, keys, detail)
        # None: present; REAPED: nothing is (re-)created under a tombstone (the record's blob counts it)

    def overlapping_ranges(self) -> None:
        """Sequence ranges overlapping within one boot (warnings: double counting)."""
        by_boot: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
        for key in self.accepted:
            try:
                parsed = self.codec.parse(key)
            except KeyLayoutError:
                continue  # already reported as invalid-manifest
            if parsed.kind is KeyKind.ACCEPTED and parsed.identity is not None:
                i = parsed.identity
                by_boot[(i.agent_hex, i.boot_hex)].append((i.seq_start, i.seq_end, key))
        for ranges in by_boot.values():
            ranges.sort()
            prev_end, prev_key = -1, ""
            for start, end, key in ranges:
                rule = inv.overlaps(prev_end, start)
                if rule is not None:
                    self.note(rule, [prev_key, key], f"sequence ranges overlap (up to {prev_end} and from {start})")
                if end > prev_end:
                    prev_end, prev_key = end, key
