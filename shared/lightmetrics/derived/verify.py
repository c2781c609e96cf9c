"""``lmctl verify``: the bucket-wide invariant oracle (docs/protocol.md §13).

It lists every layout prefix, reads every acceptance record and every quarantine manifest, and
checks, reporting each violation with the keys involved:

* ``invalid-manifest``: an acceptance record that does not parse or does not match its key
  (validation is :func:`lightmetrics.derived.indexing.load_manifest`, the same as every reader's);
  ``unsupported-version``: one written by a newer version (docs/protocol.md §17). Either way GC
  keeps every blob such a record may name, and the record's blocker says so;
* ``blob-missing`` / ``blob-size``: an accepted batch's raw blob is gone or has another size —
  unless the batch's hour is tombstoned by retention: *manifest present, blob gone, hour
  tombstoned* is the expected reaped state (counted as ``reaped``, not a violation);
* ``orphan-derived`` / ``derived-mismatch`` / ``bad-key``: a derived entry whose source does not
  exist (or names another hash), or a key under a derived prefix that is not ours;
* ``quarantine-incomplete``: a quarantine manifest that does not parse, whose acceptance record
  is missing, or whose submitted blob (the evidence) is gone;
* ``missing-derived``: an accepted manifest (or quarantine manifest) from before the index's
  completeness watermark W without its derived entry. Newer ones lacking an entry are only
  counted as ``pending`` (the event path or the next walk writes them); ``strict`` requires every
  entry regardless of W (for a quiet system right after a walk, as in the demo and tests);
* ``reaped-without-tombstone`` / ``reaped-not-empty``: a retention ``reaped`` marker without its
  tombstone, or a reaped hour that still has ``accepted-by-time`` entries (a writer re-created
  derived state under a tombstone);
* ``overlap`` (warning): sequence ranges overlapping within one boot — legal for the protocol,
  but those samples would be counted twice.

A violation on an object whose blocker an operator skipped (``lmctl blockers skip --reason``)
is listed as *acknowledged* instead. Counts per prefix come with the report.

Example:
    >>> report = verify(ctx, strict=True)                      # doctest: +SKIP
    >>> report.ok, report.counts["accepted/v1/"]               # doctest: +SKIP
    (True, 1000)
"""

from __future__ import annotations

import contextvars
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lightmetrics.deployment.resource_types import LAYOUT_PREFIXES
from lightmetrics.derived.indexing import load_manifest
from lightmetrics.ops.outcome import PermanentWorkError
from lightmetrics.ops.pool import map_in_context
from lightmetrics.ops.work import WorkContext
from lightmetrics.protocol.errors import KeyLayoutError, ManifestError
from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest, IdentityConflictManifest

__all__ = ["Finding", "VerifyReport", "verify"]

_DERIVED_OF = {  # derived prefix -> the index name its watermark uses
    "accepted-by-time/v1/": "accepted-by-time",
    "accepted-by-blob/v1/": "accepted-by-blob",
    "raw-blobs-by-time/v1/": "raw-blobs-by-time",
    "quarantine-by-blob/v1/": "quarantine-by-blob",
}


@dataclass(frozen=True)
class Finding:
    kind: str
    keys: tuple[str, ...]
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "keys": list(self.keys), "detail": self.detail}


@dataclass
class VerifyReport:
    strict: bool
    counts: dict[str, int] = field(default_factory=dict)
    checked: Counter[str] = field(default_factory=Counter)
    pending: Counter[str] = field(default_factory=Counter)
    watermarks: dict[str, int | None] = field(default_factory=dict)
    violations: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    acknowledged: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def violation_counts(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.violations))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "strict": self.strict,
            "counts": self.counts,
            "checked": dict(self.checked),
            "pending": dict(self.pending),
            "watermarks": self.watermarks,
            "violations": [v.to_json() for v in self.violations],
            "violation_counts": self.violation_counts(),
            "warnings": [w.to_json() for w in self.warnings],
            "acknowledged": [a.to_json() for a in self.acknowledged],
        }


def _list_all(ctx: WorkContext, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` with its size."""
    out: dict[str, int] = {}
    token: str | None = None
    while True:
        page = ctx.store.list_page(prefix, continuation_token=token)
        out.update(zip(page.keys, page.sizes))
        if not (page.truncated and page.next_token):
            return out
        token = page.next_token


def verify(ctx: WorkContext, *, strict: bool = False, watermarks: dict[str, int | None] | None = None,
           workers: int = 16, progress: Callable[[str], None] | None = None) -> VerifyReport:
    """Check the whole namespace; see the module docstring for what is checked. ``progress`` is
    told each phase as it begins (``lmctl verify`` shows it on stderr)."""
    say = progress or (lambda _: None)
    from lightmetrics.derived.walk import read_watermarks

    codec = ctx.codec
    report = VerifyReport(strict=strict)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lm-verify")

    def call(fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return pool.submit(contextvars.copy_context().run, fn, *args)

    try:
        say(f"listing {len(LAYOUT_PREFIXES)} prefixes")
        listed = {p: f.result() for p, f in {p: call(_list_all, ctx, codec.prefix + p) for p in LAYOUT_PREFIXES}.items()}
        report.counts = {p: len(v) for p, v in listed.items()}
        say(f"listed {sum(report.counts.values()):,} objects")
        table = ctx.table
        if watermarks is None:
            watermarks = read_watermarks(table) if table is not None else {i: None for i in _DERIVED_OF.values()}
        report.watermarks = dict(watermarks)
        # A context without a control table has no operator decisions; a configured table that
        # cannot be read is an error (ResourceAccessError), never "nothing was skipped".
        skipped = {b.object_key for b in ctx.blockers.list(status="skipped")} if table is not None else set()

        def note(kind: str, keys: list[str], detail: str, *, warning: bool = False) -> None:
            finding = Finding(kind, tuple(keys), detail)
            if warning:
                report.warnings.append(finding)
            elif any(k in skipped for k in keys):
                report.acknowledged.append(finding)
            else:
                report.violations.append(finding)

        accepted, blobs = listed["accepted/v1/"], listed["raw-blobs/v1/"]
        quarantine = listed["quarantine/v1/"]
        tombstoned: set[UtcHour] = set()
        reaped: set[UtcHour] = set()
        for key in listed["retention/v1/"]:
            try:
                parsed = codec.parse(key)
            except KeyLayoutError:
                note("bad-key", [key], "not a retention key of the layout")
                continue
            if parsed.kind is KeyKind.RETENTION_TOMBSTONE and parsed.scope == "raw" and parsed.hour is not None:
                tombstoned.add(parsed.hour)
            elif parsed.kind is KeyKind.RETENTION_REAPED and parsed.scope == "raw" and parsed.hour is not None:
                reaped.add(parsed.hour)
        # Retention (docs/protocol.md §10): a reaped marker is written only after its tombstone and
        # after the hour's accepted-by-time entries are gone; writers never re-create them.
        for hour in sorted(reaped - tombstoned):
            note("reaped-without-tombstone", [codec.retention_reaped("raw", hour)], f"{hour} has no tombstone")
        for hour in sorted(reaped):
            left = [k for k in listed["accepted-by-time/v1/"] if k.startswith(codec.accepted_by_time_hour(hour))]
            if left:
                note("reaped-not-empty", left[:10], f"{hour} is reaped but {len(left)} accepted-by-time entries remain")

        # -- acceptance records: valid, blob present with its size (or the hour reaped) ----------------
        say(f"reading {len(listed['accepted/v1/']):,} acceptance records")
        def read_manifest(key: str) -> AcceptedBatchManifest | Finding:
            try:
                return load_manifest(ctx, key)
            except PermanentWorkError as exc:
                kind = "unsupported-version" if exc.kind == "unsupported-version" else "invalid-manifest"
                return Finding(kind, (key,), exc.reason)

        manifests: dict[str, AcceptedBatchManifest] = {}
        for key, result in zip(accepted, map_in_context(pool, read_manifest, accepted)):
            report.checked["acceptance records"] += 1
            if isinstance(result, Finding):
                note(result.kind, list(result.keys), result.detail)
                continue
            manifests[key] = result
            m = result
            hour = UtcHour.of_unix_ns(m.accepted_at_unix_ns)
            size = blobs.get(m.raw_blob_key)
            if size is None:
                if hour in tombstoned:
                    report.checked["reaped (blob gone, hour tombstoned)"] += 1
                else:
                    note("blob-missing", [key, m.raw_blob_key], f"accepted at {hour}, hour not tombstoned")
            elif size != m.frame_bytes:
                note("blob-size", [key, m.raw_blob_key], f"blob is {size} bytes, the record says {m.frame_bytes}")
        reaped_shas = {m.frame_sha256 for m in manifests.values()
                       if UtcHour.of_unix_ns(m.accepted_at_unix_ns) in tombstoned}

        # -- quarantine manifests: complete evidence ---------------------------------------------------
        say(f"reading {len(listed['quarantine/v1/']):,} quarantine manifests")
        def read_quarantine(key: str) -> tuple[IdentityConflictManifest | None, str]:
            try:
                parsed = codec.parse(key)
            except KeyLayoutError as exc:
                return None, str(exc)
            if parsed.kind is not KeyKind.QUARANTINE:
                return None, f"a {parsed.kind.value} key under quarantine/v1/"
            raw = ctx.store.get(key)
            if raw is None:
                return None, "vanished while verifying"
            try:
                q = IdentityConflictManifest.from_bytes(raw)
            except ManifestError as exc:
                return None, str(exc)
            if q.identity != parsed.identity or q.submitted_frame_sha256 != parsed.sha256:
                return None, "content does not match its key"
            return q, ""

        conflicts: dict[str, IdentityConflictManifest] = {}
        for key, (q, why) in zip(quarantine, map_in_context(pool, read_quarantine, quarantine)):
            report.checked["quarantine manifests"] += 1
            if q is None:
                note("quarantine-incomplete", [key], why)
                continue
            conflicts[key] = q
            if q.accepted_manifest_key not in accepted:
                note("quarantine-incomplete", [key, q.accepted_manifest_key], "its acceptance record is missing")
            if q.submitted_raw_blob_key not in blobs:
                accepted_m = manifests.get(q.accepted_manifest_key)
                if codec.conflict_resolution(q.identity, q.submitted_frame_sha256) in listed["conflict-resolutions/v1/"]:
                    # GC collects conflict evidence after its resolution plus the evidence window.
                    report.checked["conflict evidence collected after resolution"] += 1
                elif accepted_m is not None and UtcHour.of_unix_ns(accepted_m.accepted_at_unix_ns) in tombstoned:
                    report.checked["conflict evidence collected with its reaped hour"] += 1
                else:
                    note("quarantine-incomplete", [key, q.submitted_raw_blob_key],
                         "the submitted blob (evidence) is missing")

        # -- derived entries point at existing sources --------------------------------------------------
        say("checking derived entries against their sources")
        present: dict[str, set[str]] = {p: set(listed[p]) for p in _DERIVED_OF}
        raw_by_time_shas: set[str] = set()
        for prefix in _DERIVED_OF:
            for key in listed[prefix]:
                report.checked["derived entries"] += 1
                try:
                    parsed = codec.parse(key)
                except KeyLayoutError:
                    note("bad-key", [key], f"not a {prefix} key of the layout")
                    continue
                if parsed.kind is KeyKind.ACCEPTED_BY_TIME or parsed.kind is KeyKind.ACCEPTED_BY_BLOB:
                    assert parsed.identity is not None
                    src = codec.accepted(parsed.identity)
                    if src not in accepted:
                        note("orphan-derived", [key, src], "its acceptance record does not exist")
                    elif parsed.sha256 and src in manifests and manifests[src].frame_sha256 != parsed.sha256:
                        note("derived-mismatch", [key, src], "names another blob than the record")
                elif parsed.kind is KeyKind.RAW_BLOBS_BY_TIME:
                    assert parsed.sha256 is not None
                    raw_by_time_shas.add(parsed.sha256)
                    blob = codec.raw_blob(parsed.sha256)
                    if blob not in blobs and parsed.hour not in tombstoned and parsed.sha256 not in reaped_shas:
                        note("orphan-derived", [key, blob], "its raw blob does not exist")
                elif parsed.kind is KeyKind.QUARANTINE_BY_BLOB:
                    assert parsed.identity is not None and parsed.sha256 is not None
                    src = codec.quarantine(parsed.identity, parsed.sha256)
                    if src not in quarantine:
                        note("orphan-derived", [key, src], "its quarantine manifest does not exist")
                else:
                    note("bad-key", [key], f"a {parsed.kind.value} key under {prefix}")

        # -- nothing accepted before W lacks a derived entry -------------------------------------------
        def required(index: str, at_ns: int) -> bool:
            w = watermarks.get(index) if watermarks else None
            return strict or (w is not None and at_ns < w)

        for key, m in manifests.items():
            hour = UtcHour.of_unix_ns(m.accepted_at_unix_ns)
            if hour in tombstoned:
                continue  # retention: derived entries are not (re-)created under a tombstone
            ident = m.identity
            wanted = {
                "accepted-by-time": codec.accepted_by_time(hour, ident) in present["accepted-by-time/v1/"],
                "accepted-by-blob": codec.accepted_by_blob(m.frame_sha256, ident) in present["accepted-by-blob/v1/"],
                "raw-blobs-by-time": m.frame_sha256 in raw_by_time_shas or m.raw_blob_key not in blobs,
            }
            for index, ok in wanted.items():
                if ok:
                    continue
                if required(index, m.accepted_at_unix_ns):
                    note("missing-derived", [key], f"no {index} entry (accepted at {hour})")
                else:
                    report.pending[index] += 1
        for key, q in conflicts.items():
            entry = codec.quarantine_by_blob(q.submitted_frame_sha256, q.identity)
            if entry in present["quarantine-by-blob/v1/"]:
                continue
            if required("quarantine-by-blob", q.observed_at_unix_ns):
                note("missing-derived", [key, entry], "no quarantine-by-blob entry")
            else:
                report.pending["quarantine-by-blob"] += 1

        # -- overlapping sequence ranges within one boot (warnings: double counting) --------------------
        by_boot: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
        for key in accepted:
            try:
                parsed = codec.parse(key)
            except KeyLayoutError:
                continue  # already reported as invalid-manifest
            if parsed.kind is KeyKind.ACCEPTED and parsed.identity is not None:
                i = parsed.identity
                by_boot[(i.agent_hex, i.boot_hex)].append((i.seq_start, i.seq_end, key))
        for ranges in by_boot.values():
            ranges.sort()
            prev_end, prev_key = -1, ""
            for start, end, key in ranges:
                if start <= prev_end:
                    note("overlap", [prev_key, key], f"sequence ranges overlap (up to {prev_end} and from {start})",
                         warning=True)
                if end > prev_end:
                    prev_end, prev_key = end, key
    finally:
        pool.shutdown(wait=True)
    return report
