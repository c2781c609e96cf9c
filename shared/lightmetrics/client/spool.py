"""The agent's durable local spool: one file per batch, the exact encoded frame bytes.

Layout of a spool directory::

    <spool>/agent=<agent-hex>.boot=<boot-hex>.<seq-start>-<seq-end>.lmframe   pending batches
    <spool>/parked/<same name>                                                parked batches
    <spool>/parked/<same name>.json                                           why it is parked
    <spool>/unreadable/<uuid>                                                 a file set aside
    <spool>/unreadable/<uuid>.json                                            why, and its name
    <spool>/.tmp-*                                                            writes in flight

File names are :attr:`BatchIdentity.spool_name` — the same hex/20-digit encoding as the object
keys (``docs/protocol.md`` §2), so names sort by boot, then sequence. The bytes are written once
and never re-encoded: re-encoding a batch can change its bytes, and different bytes for an
accepted identity are an identity conflict.

Every write is crash-safe: temp file, ``fsync``, then an atomic link/rename and an ``fsync`` of
the directory. A batch is *created* with ``link`` (fails if the name exists), so two writers of
one identity cannot replace each other's bytes.

A file the client cannot use — a name that is not a batch name, a batch name that is not
canonical, bytes that are not a valid frame of the name's identity, a file it cannot read — is
moved to ``unreadable/`` with a sidecar saying why (:meth:`Spool.set_aside`); the rest of the
spool keeps flowing. Hidden files (names starting with ``.``) are not spool files and are left
alone.

Example:
    >>> import tempfile
    >>> from lightmetrics.protocol.frame import Sample, encode_frame
    >>> spool = Spool(tempfile.mkdtemp())
    >>> ident = BatchIdentity.create("agent-a", "boot-1", 0, 9)
    >>> batch = spool.put(ident, encode_frame(ident, [Sample("up")]))
    >>> batch.path.name
    'agent=6167656e742d61.boot=626f6f742d31.00000000000000000000-00000000000000000009.lmframe'
    >>> [b.identity == ident for b in spool.pending()]
    [True]
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightmetrics.client.errors import SpoolConflictError, SpoolError
from lightmetrics.client.spool_files import (
    ASIDE_NAME_RE,
    BATCH_NAME_RE,
    PARKED_DIR,
    PARKED_SCHEMA,
    SIDECAR_SUFFIX,
    TEMP_PREFIX,
    UNREADABLE_DIR,
    UNREADABLE_SCHEMA,
    ParkedBatch,
    SpooledBatch,
    UnreadableFile,
    identity_from_spool_name,
    sha256_hex,
)
from lightmetrics.protocol.identity import BatchIdentity


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



class Spool:
    """A spool directory (created if missing). Safe against crashes at any point; one sender
    per spool at a time (a second sender is harmless to the protocol — it only causes
    duplicates — but the counts it reports would be confusing).
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.parked_dir = self.root / PARKED_DIR
        self.unreadable_dir = self.root / UNREADABLE_DIR
        self.fsync = fsync
        try:
            self.parked_dir.mkdir(parents=True, exist_ok=True)
            self.unreadable_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"cannot create spool {self.root}: {exc}") from None

    # ------------------------------------------------------------------ writes
    def _write_temp(self, directory: Path, data: bytes) -> Path:
        tmp = directory / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        return tmp

    def _sync(self, *directories: Path) -> None:
        if self.fsync:
            for d in directories:
                _fsync_dir(d)

    def put(self, identity: BatchIdentity, data: bytes) -> SpooledBatch:
        """Store ``data`` (the exact frame bytes) for ``identity``; durable when this returns.

        Idempotent for the same bytes (also if the batch is parked); raises
        :class:`SpoolConflictError` for different bytes under a held identity.
        """
        data = bytes(data)
        name = identity.spool_name
        parked = self.parked_dir / name
        if parked.exists():
            self._check_same(identity, parked, data)
            return SpooledBatch(identity, parked, parked=True)
        final = self.root / name
        tmp = self._write_temp(self.root, data)
        try:
            try:
                os.link(tmp, final)  # create-if-absent: never replaces held bytes
            except FileExistsError:
                self._check_same(identity, final, data)
                return SpooledBatch(identity, final)
        finally:
            tmp.unlink(missing_ok=True)
        self._sync(self.root)
        return SpooledBatch(identity, final)

    @staticmethod
    def _check_same(identity: BatchIdentity, path: Path, data: bytes) -> None:
        held = sha256_hex(path.read_bytes())
        new = sha256_hex(data)
        if held != new:
            raise SpoolConflictError(identity, held, new)

    def delete(self, batch: SpooledBatch) -> None:
        """Remove a batch (after a 200, or a resolved conflict). Missing is fine."""
        batch.path.unlink(missing_ok=True)
        if not batch.parked:
            self._sync(batch.path.parent)

    def park(self, batch: SpooledBatch, record: Mapping[str, Any]) -> ParkedBatch:
        """Move a pending batch to ``parked/`` with its sidecar (sidecar first, then the batch:
        a crash in between leaves the batch pending, and it is parked again on its next send)."""
        sidecar = self.parked_dir / (batch.identity.spool_name + SIDECAR_SUFFIX)
        self._write_sidecar(sidecar, record)
        target = self.parked_dir / batch.identity.spool_name
        os.replace(batch.path, target)
        self._sync(self.parked_dir, self.root)
        return self._load_parked(target)

    def update_parked(self, parked: ParkedBatch, record: Mapping[str, Any]) -> ParkedBatch:
        self._write_sidecar(parked.sidecar_path, record)
        self._sync(self.parked_dir)
        return self._load_parked(parked.path)

    def drop_parked(self, parked: ParkedBatch) -> None:
        """Delete a parked batch and then its sidecar (an orphan sidecar is ignored and cleaned)."""
        parked.path.unlink(missing_ok=True)
        parked.sidecar_path.unlink(missing_ok=True)
        self._sync(self.parked_dir)

    def _write_sidecar(self, path: Path, record: Mapping[str, Any], schema: str = PARKED_SCHEMA) -> None:
        body = json.dumps({"schema": schema, **record}, sort_keys=True, indent=1).encode()
        tmp = self._write_temp(path.parent, body)
        os.replace(tmp, path)

    def set_aside(self, path: Path, reason: str, *, at_unix_ns: int | None = None) -> UnreadableFile:
        """Move a file the client cannot use to ``unreadable/`` with a sidecar saying why (sidecar
        first: a crash in between leaves the file where it was, and it is set aside again)."""
        target = self.unreadable_dir / uuid.uuid4().hex
        sidecar = target.with_name(target.name + SIDECAR_SUFFIX)
        self._write_sidecar(sidecar, {"original_name": path.name,
                                      "original_dir": PARKED_DIR if path.parent == self.parked_dir else "",
                                      "reason": reason, "set_aside_at_unix_ns": at_unix_ns}, UNREADABLE_SCHEMA)
        os.replace(path, target)
        self._sync(self.unreadable_dir, path.parent)
        return self._load_unreadable(target)

    def strays(self) -> list[tuple[Path, str]]:
        """Files in the spool or ``parked/`` that are not batches (nor sidecars, temp or hidden
        files), with why: what :meth:`set_aside` should move out of the way."""
        out: list[tuple[Path, str]] = []
        for directory in (self.root, self.parked_dir):
            for entry in sorted(os.scandir(directory), key=lambda e: e.name):
                name = entry.name
                if name.startswith(".") or entry.is_dir(follow_symlinks=False):
                    continue  # hidden and temp files, and parked/ and unreadable/ themselves
                if directory == self.parked_dir and name.endswith(".lmframe" + SIDECAR_SUFFIX):
                    name = name[: -len(SIDECAR_SUFFIX)]  # a sidecar: fine if it names a batch
                if not BATCH_NAME_RE.match(name):
                    out.append((Path(entry.path), f"{entry.name!r} is not a spool batch name "
                                                  "(agent=<hex>.boot=<hex>.<seq-start>-<seq-end>.lmframe)"))
                    continue
                try:
                    identity_from_spool_name(name)
                except SpoolError as exc:
                    out.append((Path(entry.path), str(exc)))
        return out

    def unreadable(self) -> list[UnreadableFile]:
        """Files set aside, oldest first."""
        out = []
        for name in sorted(os.listdir(self.unreadable_dir)):
            if ASIDE_NAME_RE.match(name):
                try:
                    out.append(self._load_unreadable(self.unreadable_dir / name))
                except FileNotFoundError:
                    continue  # removed meanwhile
        return sorted(out, key=lambda u: (u.set_aside_at_unix_ns or 0, u.path.name))

    def _load_unreadable(self, path: Path) -> UnreadableFile:
        sidecar = path.with_name(path.name + SIDECAR_SUFFIX)
        try:
            rec: dict[str, Any] = json.loads(sidecar.read_bytes())
        except (FileNotFoundError, ValueError):
            rec = {"reason": "sidecar missing or unreadable"}
        data = path.read_bytes()
        return UnreadableFile(path=path, sidecar_path=sidecar, original_name=str(rec.get("original_name") or path.name),
                              original_dir=str(rec.get("original_dir") or ""), reason=str(rec.get("reason") or ""),
                              set_aside_at_unix_ns=rec.get("set_aside_at_unix_ns"), frame_sha256=sha256_hex(data),
                              frame_bytes=len(data))

    # ------------------------------------------------------------------ reads
    def _batches(self, directory: Path, parked: bool) -> list[SpooledBatch]:
        out = []
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            raise SpoolError(f"cannot list {directory}: {exc}") from None
        for name in names:
            if BATCH_NAME_RE.match(name):
                try:
                    ident = identity_from_spool_name(name)
                except SpoolError:
                    continue  # not canonical: a stray, for set_aside, never a reason to stop
                out.append(SpooledBatch(ident, directory / name, parked=parked))
        return out

    def pending(self) -> list[SpooledBatch]:
        """Pending batches in send order: by agent, boot, then sequence (the name order)."""
        return self._batches(self.root, parked=False)

    def parked(self) -> list[ParkedBatch]:
        out = []
        for b in self._batches(self.parked_dir, parked=True):
            try:
                out.append(self._load_parked(b.path))
            except FileNotFoundError:
                continue  # dropped meanwhile
        return out

    def _load_parked(self, path: Path) -> ParkedBatch:
        ident = identity_from_spool_name(path.name)
        sidecar = path.with_name(path.name + SIDECAR_SUFFIX)
        try:
            rec: dict[str, Any] = json.loads(sidecar.read_bytes())
        except FileNotFoundError:
            rec = {}
        except ValueError:
            rec = {"reason": "sidecar unreadable"}
        data = path.read_bytes()
        return ParkedBatch(
            identity=ident,
            path=path,
            sidecar_path=sidecar,
            kind=str(rec.get("kind") or "unknown"),
            http_status=rec.get("http_status"),
            status=rec.get("status"),
            reason=rec.get("reason"),
            resolution=rec.get("resolution"),
            frame_sha256=sha256_hex(data),
            frame_bytes=len(data),
            attempts=int(rec.get("attempts") or 0),
            first_attempt_unix_ns=rec.get("first_attempt_unix_ns"),
            last_attempt_unix_ns=rec.get("last_attempt_unix_ns"),
            parked_at_unix_ns=rec.get("parked_at_unix_ns"),
            endpoint=rec.get("endpoint"),
            response=rec.get("response") or {},
        )

    def clean(self, *, temp_older_than_s: float = 300.0) -> int:
        """Remove abandoned temp files (a writer crashed before its rename) and orphan sidecars.

        Temp files younger than ``temp_older_than_s`` may belong to a live writer and are kept.
        Returns how many files were removed.
        """
        removed = 0
        now = time.time()
        for directory in (self.root, self.parked_dir, self.unreadable_dir):
            for entry in os.scandir(directory):
                if entry.name.startswith(TEMP_PREFIX) and now - entry.stat().st_mtime >= temp_older_than_s:
                    Path(entry.path).unlink(missing_ok=True)
                    removed += 1
        for entry in os.scandir(self.parked_dir):
            if entry.name.endswith(".lmframe" + SIDECAR_SUFFIX) and not (self.parked_dir / entry.name[:-5]).exists():
                Path(entry.path).unlink(missing_ok=True)
                removed += 1
        for entry in os.scandir(self.unreadable_dir):  # a sidecar whose move never happened
            stem = entry.name[: -len(SIDECAR_SUFFIX)]
            if entry.name.endswith(SIDECAR_SUFFIX) and ASIDE_NAME_RE.match(stem) and not (self.unreadable_dir / stem).exists():
                Path(entry.path).unlink(missing_ok=True)
                removed += 1
        return removed
