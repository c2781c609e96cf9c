"""The audit's Spark stages, modelled for the simulation: the candidate rows its classification and
candidate joins (``lightmetrics_pipeline.audit.classify``, ``audit.candidates``) select from an
inventory that is S3's listing of the in-memory bucket now (no request). Everything after them —
the confirmation, the marks, the watermarks — is the job's own code (:mod:`.audit_actor`).

The queries, as the pipeline's: by manifest-id, records lacking an entry; by sha256, a referenced
blob absent or without its ``raw-blobs-by-time`` entry (hours with a tombstone left out); quarantine
manifests without their entry; derived entries whose source is absent; blobs no entry names past
the horizon; a boot's overlapping ranges.
"""

from __future__ import annotations

import json
from typing import Any

from lightmetrics.harness.sim.world import World
from lightmetrics.protocol.errors import KeyLayoutError
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics.protocol.keys import KeyKind, ParsedKey, UtcHour

Row = dict[str, Any]
_NS = 1_000_000_000
_DERIVED = "derived-without-source"


def _row(check: str, cand: str, **cols: Any) -> Row:
    """A candidate in the confirmation's columns (``audit.confirm.CANDIDATE_COLUMNS``; null where unset)."""
    from lightmetrics_pipeline.audit.confirm import CANDIDATE_COLUMNS

    return {"check": check, "cand": cand, **{c: None for c in CANDIDATE_COLUMNS[2:]}, **cols}


def _ident(p: ParsedKey) -> BatchIdentity:
    assert p.identity is not None
    return p.identity


class InventoryView:
    """One listing, grouped as the candidate joins group it (by manifest-id and by sha256)."""

    def __init__(self, world: World) -> None:
        store, self.codec = world.system.store, world.system.ctx.codec
        self.listed = dict(store.list_modified(self.codec.prefix, limit=1 << 30))
        self.parsed: dict[str, ParsedKey] = {}
        for key in self.listed:
            try:
                self.parsed[key] = self.codec.parse(key)
            except KeyLayoutError:
                continue
        self.of = {kind: sorted(k for k, p in self.parsed.items() if p.kind is kind) for kind in KeyKind}
        self.mid = {k: p.identity.manifest_id for k, p in self.parsed.items() if p.identity is not None}
        self.record_of = {self.mid[k]: k for k in self.of[KeyKind.ACCEPTED]}
        self.tombstoned = {self.parsed[k].hour for k in self.of[KeyKind.RETENTION_TOMBSTONE]
                           if self.parsed[k].scope == "raw"}
        self.by_time = self._by_mid(KeyKind.ACCEPTED_BY_TIME)
        self.by_blob = self._by_mid(KeyKind.ACCEPTED_BY_BLOB)
        self.acc_hour = {m: min(self._hour_s(k) for k in ks) for m, ks in self.by_time.items()}
        self.blob_of = {self._sha(k): k for k in self.of[KeyKind.RAW_BLOB]}
        self.blob_entries: dict[str, list[str]] = {}
        for k in self.of[KeyKind.RAW_BLOBS_BY_TIME]:
            self.blob_entries.setdefault(self._sha(k), []).append(k)
        self.referenced: dict[str, list[str]] = {}  # sha -> the manifest-ids of its accepted-by-blob entries
        for k in self.of[KeyKind.ACCEPTED_BY_BLOB]:
            self.referenced.setdefault(self._sha(k), []).append(self.mid[k])

    def _by_mid(self, kind: KeyKind) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for k in self.of[kind]:
            out.setdefault(self.mid[k], []).append(k)
        return out

    def _sha(self, key: str) -> str:
        return self.parsed[key].sha256 or ""

    def _hour_s(self, key: str) -> int:
        hour = self.parsed[key].hour
        assert hour is not None
        return hour.start_unix_s

    def manifest_rows(self) -> list[Row]:
        """``missing-derived`` / ``blob-missing`` / ``blob-size`` candidates: one row per record."""
        cand: dict[str, set[str]] = {}
        hour_of: dict[str, int | None] = {}
        for m, key in self.record_of.items():
            if m not in self.by_time or m not in self.by_blob:
                cand.setdefault(key, set()).add("repair")
                hour_of.setdefault(key, self.acc_hour.get(m))
        for sha, mids in sorted(self.referenced.items()):
            keys = [self.record_of[m] for m in mids if m in self.record_of]
            if not keys:
                continue
            if sha in self.blob_of and not self.blob_entries.get(sha):
                cand.setdefault(keys[0], set()).add("repair")
            elif sha not in self.blob_of:
                cand.setdefault(keys[0], set()).add("integrity")
            if hour_of.get(keys[0]) is None:
                hour_of[keys[0]] = min((self.acc_hour[m] for m in mids if m in self.acc_hour), default=None)
        tomb_hours = {h.start_unix_s for h in self.tombstoned if h is not None}
        return [_row("manifest", ",".join(sorted(c)), key=k) for k, c in sorted(cand.items())
                if hour_of.get(k) not in tomb_hours]

    def quarantine_rows(self) -> list[Row]:
        indexed = {(self.mid[k], self._sha(k)) for k in self.of[KeyKind.QUARANTINE_BY_BLOB]}
        rows = []
        for k in self.of[KeyKind.QUARANTINE]:
            if (self.mid[k], self._sha(k)) not in indexed:
                ident = _ident(self.parsed[k])
                rows.append(_row("quarantine", "repair", key=k, sha=self._sha(k), agent=ident.agent_hex,
                                 boot=ident.boot_hex, s=str(ident.seq_start), e=str(ident.seq_end)))
        return rows

    def derived_rows(self) -> list[Row]:
        codec, rows = self.codec, []
        for m in sorted(set(self.by_time) | set(self.by_blob)):
            if m in self.record_of:
                continue
            for kind, keys in (("accepted-by-time", self.by_time.get(m, [])),
                               ("accepted-by-blob", self.by_blob.get(m, []))):
                rows += [_row("derived", _DERIVED, entry_key=k, entry_kind=kind,
                              source_key=codec.accepted(_ident(self.parsed[k]))) for k in keys]
        for sha, entries in sorted(self.blob_entries.items()):
            if sha not in self.blob_of:
                rows += [_row("derived", _DERIVED, entry_key=k, entry_kind="raw-blobs-by-time",
                              source_key=codec.raw_blob(sha)) for k in entries if self.parsed[k].hour not in self.tombstoned]
        quarantined = {(self.mid[k], self._sha(k)) for k in self.of[KeyKind.QUARANTINE]}
        rows += [_row("derived", _DERIVED, entry_key=k, entry_kind="quarantine-by-blob",
                      source_key=codec.quarantine(_ident(self.parsed[k]), self._sha(k)))
                 for k in self.of[KeyKind.QUARANTINE_BY_BLOB] if (self.mid[k], self._sha(k)) not in quarantined]
        return rows

    def orphan_rows(self, horizon_before_s: int) -> list[Row]:
        return [_row("orphan", "orphan-blob-candidates", key=k, sha=sha) for sha, k in sorted(self.blob_of.items())
                if not self.referenced.get(sha) and self.listed[k] // _NS < horizon_before_s]

    def overlap_rows(self) -> list[Row]:
        ranges: dict[tuple[str, str], list[tuple[int, int, str]]] = {}
        for k in self.of[KeyKind.ACCEPTED]:
            ident = _ident(self.parsed[k])
            ranges.setdefault((ident.agent_hex, ident.boot_hex), []).append((ident.seq_start, ident.seq_end, k))
        rows = []
        for _, boot in sorted(ranges.items()):
            prev: tuple[int, str, int] | None = None  # the highest (end, key, start) sorted before
            for s, e, k in sorted(boot):
                if prev is not None and s <= prev[0]:
                    rows.append(_row("overlap", "overlapping-ranges", key=k, s=str(s), e=str(e), prev_key=prev[1],
                                     prev_range=f"{prev[2]}-{prev[0]}"))
                prev = max(prev, (e, k, s)) if prev is not None else (e, k, s)
        return rows


    def candidates(self, horizon_before_s: int) -> list[Row]:
        """Every candidate row of every query."""
        return (self.manifest_rows() + self.quarantine_rows() + self.derived_rows()
                + self.orphan_rows(horizon_before_s) + self.overlap_rows())

    def unproven(self, world: World, proved: dict[str, int]) -> list[str]:
        """W6 held against the world, not against the job's own findings: for each index proved up
        to ``w``, every source this inventory showed that predates ``w`` (its hour not tombstoned)
        has its entry — in the inventory, or now. A record is read as bytes (a newer writer's too)."""
        store, codec = world.system.store, self.codec
        now = set(store.keys(codec.prefix))
        found = []

        def need(index: str, at_ns: int, entry: str, source: str) -> None:
            w = proved.get(index)
            if w is not None and at_ns < int(w) and entry not in self.listed and entry not in now:
                found.append(f"W6: {index} proved complete up to {w} but {source} (at {at_ns}) has no {entry}")

        for key in self.of[KeyKind.ACCEPTED]:
            raw = store.get(key)
            if raw is None:
                continue
            doc = json.loads(raw)
            at_ns, sha, ident = int(doc["accepted_at_unix_ns"]), str(doc["frame_sha256"]), _ident(self.parsed[key])
            hour = UtcHour.of_unix_ns(at_ns)
            if codec.retention_tombstone("raw", hour) in now:
                continue  # reaped, or being reaped: nothing is indexed under a tombstone
            need("accepted-by-time", at_ns, codec.accepted_by_time(hour, ident), key)
            need("accepted-by-blob", at_ns, codec.accepted_by_blob(sha, ident), key)
            blob = codec.raw_blob(sha)
            if blob in self.listed and blob in now:
                blob_ns = self.listed[blob]
                need("raw-blobs-by-time", blob_ns, codec.raw_blobs_by_time(UtcHour.of_unix_ns(blob_ns), sha), blob)
        for key in self.of[KeyKind.QUARANTINE]:
            if key in now:
                need("quarantine-by-blob", self.listed[key],
                     codec.quarantine_by_blob(self._sha(key), _ident(self.parsed[key])), key)
        return found


def inventory_candidates(world: World, horizon_before_s: int) -> list[Row]:
    """Every candidate row of every query, from S3's listing now."""
    return InventoryView(world).candidates(horizon_before_s)


__all__ = ["InventoryView", "inventory_candidates"]
