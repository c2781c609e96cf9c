"""The agents' ledger against the bucket: what was acknowledged must be there, exactly once.

The demo and the soak keep, per identity, the hashes agents saw acknowledged (``200`` accepted or
duplicate) and the batches they still hold. The check, from authoritative reads:

* every acknowledged identity was acknowledged with one hash only, and its acceptance record
  exists with that hash (nothing acknowledged that differs);
* the record's blob exists — or the record's acceptance hour is tombstoned by retention (the
  expected reaped state, protocol §7);
* (soak) every batch an agent produced is acknowledged or still in its spool, pending or parked
  (nothing unacknowledged is lost);
* every accepted batch has its three derived entries (after the indexers drained, one reconcile
  and one walk): a v1 object or an entry of a v2 segment or seal (docs/protocol.md §4.10, §9.1),
  read as ``lmctl verify`` reads them; a refused v2 object is counted under its rule (``segment``,
  ``segment-conflict``), never skipped.

Each decision is a predicate of :mod:`lightmetrics.operator_tools.invariants`, and each violation line starts
with its rule's name (``blob-missing: ...``), the names ``lmctl verify`` and the audit use.

Blob presence and v1 derived entries come from listings (one LIST pass per prefix), v2 entries
from a LIST pass of each v2 root and a GET of each part-hour's newest seal (two ranged GETs) and of
each segment it does not cover, records from concurrent GETs: the check costs a request per
identity plus about 2/m per v2 entry (m entries a segment), not a request per object in the bucket.

Example:
    >>> check = check_acknowledged(store, codec, {ident: {sha}})        # doctest: +SKIP
    >>> check.verified, check.violations                                  # doctest: +SKIP
    (1, [])
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lightmetrics.aws.s3_store import S3ObjectStore
from lightmetrics.operator_tools import invariants as inv
from lightmetrics.operator_tools.verify_v2 import V2_LISTED, list_sized, read_v2_objects
from lightmetrics.protocol.errors import KeyLayoutError
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyCodec, KeyKind, ParsedKey, UtcHour
from lightmetrics.protocol.manifests import AcceptedBatchManifest
from lightmetrics.protocol.segment_entries import AcceptedSegmentEntry, RawBlobSegmentEntry

_ALL = 10**8


@dataclass
class LedgerCheck:
    verified: int = 0
    reaped: int = 0  # acknowledged, record present, blob gone because its hour was reaped
    manifests: dict[BatchIdentity, AcceptedBatchManifest] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)  # "<rule>: <identity>: <detail>"
    rules: Counter[str] = field(default_factory=Counter)  # violations per rule name

    def violate(self, rule: inv.Rule, ident: BatchIdentity, detail: str) -> None:
        self.rules[rule.name] += 1
        self.violations.append(f"{rule.name}: {ident}: {detail}")


def tombstoned_hours(store: S3ObjectStore, codec: KeyCodec, scope: str = "raw") -> set[UtcHour]:
    """Every hour with a retention tombstone (one listing)."""
    hours = set()
    for key in store.list_keys(codec.retention_scope_root(scope), limit=_ALL):
        parsed = _parsed(codec, key)
        if parsed is not None and parsed.kind is KeyKind.RETENTION_TOMBSTONE and parsed.hour is not None:
            hours.add(parsed.hour)
    return hours


def _parsed(codec: KeyCodec, key: str) -> ParsedKey | None:
    """The key's fields, or None for a key outside the layout (not this check's to judge)."""
    try:
        return codec.parse(key)
    except KeyLayoutError:
        return None


def check_acknowledged(store: S3ObjectStore, codec: KeyCodec, acked: Mapping[BatchIdentity, Collection[str]],
                       *, workers: int = 8) -> LedgerCheck:
    """Every acknowledged identity: one hash, a record with that hash, its blob (or a reaped hour)."""
    check = LedgerCheck()
    blobs = set(store.list_keys(codec.root(KeyKind.RAW_BLOB), limit=_ALL))
    tombstoned = tombstoned_hours(store, codec)
    with ThreadPoolExecutor(workers) as pool:
        records = dict(zip(acked, pool.map(lambda i: store.get(codec.accepted(i)), acked)))
    for ident, hashes in acked.items():
        raw = records[ident]
        manifest = AcceptedBatchManifest.from_bytes(raw) if raw is not None else None
        rule = inv.acknowledged_state(hashes=hashes, record_sha=manifest.frame_sha256 if manifest else None)
        if rule is not None:
            check.violate(rule, ident, {
                inv.ACKNOWLEDGED_TWICE: f"acknowledged with {len(set(hashes))} different hashes",
                inv.ACKNOWLEDGED_NOT_ACCEPTED: "acknowledged but no acceptance record",
            }.get(rule, f"record hash {manifest and manifest.frame_sha256} differs from the acknowledged one"))
            continue
        assert manifest is not None  # acknowledged_state: no record is a rule
        check.manifests[ident] = manifest
        # Presence only (blob_size 0 for "there"): verify and the audit compare sizes too.
        state = inv.blob_state(blob_size=0 if manifest.raw_blob_key in blobs else None, record_bytes=None,
                               hour_tombstoned=UtcHour.of_unix_ns(manifest.accepted_at_unix_ns) in tombstoned)
        if state is None:
            check.verified += 1
        elif state is inv.REAPED:
            check.reaped += 1
        else:
            check.violate(state, ident, f"blob {manifest.raw_blob_key} missing and its hour is not reaped")
    return check


def missing_derived(store: S3ObjectStore, codec: KeyCodec,
                    manifests: Mapping[BatchIdentity, AcceptedBatchManifest]) -> Counter[str]:
    """How many of ``manifests`` lack each derived entry, per index (each one a ``missing-derived``
    violation; hours tombstoned by retention excused: :func:`lightmetrics.operator_tools.invariants.derived_entry_state`),
    v1 objects and v2 entries alike; refused v2 objects counted under their rule (:data:`REFUSAL_RULES`)."""
    by_time = set(store.list_keys(codec.root(KeyKind.ACCEPTED_BY_TIME), limit=_ALL))
    by_blob = set(store.list_keys(codec.root(KeyKind.ACCEPTED_BY_BLOB), limit=_ALL))
    blob_shas = {p.sha256 for k in store.list_keys(codec.root(KeyKind.RAW_BLOBS_BY_TIME), limit=_ALL)
                 if (p := _parsed(codec, k)) is not None}
    missing: Counter[str] = Counter()
    v2_records, v2_shas = _v2_entries(store, codec, missing)
    tombstoned = tombstoned_hours(store, codec)
    for ident, m in manifests.items():
        hour = UtcHour.of_unix_ns(m.accepted_at_unix_ns)
        present = {"accepted-by-time": codec.accepted_by_time(hour, ident) in by_time
                   or codec.accepted(ident) in v2_records,
                   "accepted-by-blob": codec.accepted_by_blob(m.frame_sha256, ident) in by_blob,
                   "raw-blobs-by-time": m.frame_sha256 in blob_shas or m.frame_sha256 in v2_shas}
        for index, ok in present.items():
            if inv.is_violation(inv.derived_entry_state(entry_present=ok, hour_tombstoned=hour in tombstoned)):
                missing[index] += 1
    return missing


def _v2_entries(store: S3ObjectStore, codec: KeyCodec, refused: Counter[str]) -> tuple[set[str], set[str]]:
    """The record keys of every v2 ``accepted-by-time`` entry and the hashes of every v2
    ``raw-blobs-by-time`` entry; each refused object (or conflict) counted in ``refused`` by its rule."""
    listed = {root: list_sized(store, codec.prefix + root) for root in V2_LISTED}
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="lm-ledger") as pool:
        got = read_v2_objects(store, codec, listed, pool)
    for rule, _, _ in got.refusals:
        refused[rule.name] += 1
    records = {e.manifest_key for _, _, _, e in got.entries if isinstance(e, AcceptedSegmentEntry)}
    shas = {e.sha256 for _, _, _, e in got.entries if isinstance(e, RawBlobSegmentEntry)}
    return records, shas


#: the rules :func:`missing_derived` counts refused v2 objects under (the others are index names)
REFUSAL_RULES = (inv.SEGMENT.name, inv.SEGMENT_CONFLICT.name)


def missing_derived_lines(missing: Mapping[str, int]) -> list[str]:
    """:func:`missing_derived`'s counts as violation lines, named by their rule."""
    return [f"{index}: {n} v2 objects refused (lmctl verify names them)" if index in REFUSAL_RULES
            else f"{inv.MISSING_DERIVED.name}: {n} accepted batches lack their {index} entry"
            for index, n in sorted(missing.items()) if n]
