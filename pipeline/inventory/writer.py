"""Writing S3 Inventory reports from listings (``lmctl inventory snapshot``), in the format AWS
writes them (:mod:`lightmetrics_pipeline.inventory.format`), into a bucket or a local directory, so local runs
and tests read the real format."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote_plus

from lightmetrics_pipeline.inventory.format import (
    COLUMNS,
    CONFIG_ID,
    CSV_FILE_SCHEMA,
    KIND_OF_COLUMN,
    PARQUET_FILE_SCHEMA,
    VERSION,
    Destination,
    InventoryError,
    arrow_schema,
)
from lightmetrics_pipeline.s3io import S3Access, client, put_if_absent, s3_errors

# ----------------------------------------------------------------------------------- listing


def listing_rows(s3: Any, bucket: str, prefix: str = "") -> Iterator[dict[str, Any]]:
    """Inventory rows of every object version and delete marker under ``prefix`` (ListObjectVersions).
    A bucket that does not exist (or refuses us) raises: it is not an inventory without rows."""
    paginator = s3.get_paginator("list_object_versions")
    with s3_errors(bucket):
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for v in page.get("Versions", []):
                etag = str(v.get("ETag", "")).strip('"')
                algos = v.get("ChecksumAlgorithm") or []
                yield {
                    "bucket": bucket, "key": v["Key"], "version_id": v.get("VersionId"),
                    "is_latest": bool(v.get("IsLatest")), "is_delete_marker": False, "size": int(v.get("Size", 0)),
                    "last_modified_date": v["LastModified"], "e_tag": etag,
                    "storage_class": v.get("StorageClass", "STANDARD"), "is_multipart_uploaded": "-" in etag,
                    "checksum_algorithm": algos[0] if algos else None,
                }
            for m in page.get("DeleteMarkers", []):
                yield {
                    "bucket": bucket, "key": m["Key"], "version_id": m.get("VersionId"),
                    "is_latest": bool(m.get("IsLatest")), "is_delete_marker": True, "size": None,
                    "last_modified_date": m["LastModified"], "e_tag": None, "storage_class": None,
                    "is_multipart_uploaded": None, "checksum_algorithm": None,
                }



@dataclass
class WrittenReport:
    manifest_location: str
    rows: int
    files: list[dict[str, Any]] = field(default_factory=list)
    file_format: str = "Parquet"
    created_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"manifest": self.manifest_location, "rows": self.rows, "files": len(self.files),
                "format": self.file_format, "creation_timestamp_ms": self.created_ms}


def _parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    table = pa.Table.from_pylist(rows, schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="snappy")
    return buf.getvalue()


def _csv_value(col: str, value: Any) -> str:
    if value is None:
        return ""
    if col == "key":
        return quote_plus(value, safe="/")
    kind = KIND_OF_COLUMN[col]
    if kind == "bool":
        return "true" if value else "false"
    if kind == "timestamp":
        dt = value if isinstance(value, datetime) else datetime.fromtimestamp(value / 1000, tz=timezone.utc)
        return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
    return str(value)


def _csv_gz_bytes(rows: list[dict[str, Any]]) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for row in rows:
        writer.writerow([_csv_value(col, row.get(col)) for col in COLUMNS])
    return gzip.compress(text.getvalue().encode("utf-8"), mtime=0)


def _batches(rows: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def write_report(
    rows: Iterable[dict[str, Any]],
    destination: Destination,
    *,
    source_bucket: str,
    access: S3Access | None = None,
    file_format: str = "Parquet",
    config_id: str = CONFIG_ID,
    now_ms: int | None = None,
    rows_per_file: int = 1_000_000,
) -> WrittenReport:
    """Write an inventory report of ``rows`` (see :func:`listing_rows`) in AWS's layout."""
    if file_format not in ("Parquet", "CSV"):
        raise InventoryError("file format must be Parquet or CSV")
    encode = _parquet_bytes if file_format == "Parquet" else _csv_gz_bytes
    bodies = ((encode(batch), len(batch)) for batch in _batches(rows, rows_per_file))
    return write_report_files(bodies, destination, source_bucket=source_bucket, access=access,
                              file_format=file_format, config_id=config_id, now_ms=now_ms)


def parquet_table_bytes(table: Any) -> bytes:
    """One Parquet data file from a pyarrow table with the inventory columns (generators)."""
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table.cast(arrow_schema()), buf, compression="snappy")
    return buf.getvalue()


def write_report_files(
    bodies: Iterable[tuple[bytes, int]],
    destination: Destination,
    *,
    source_bucket: str,
    access: S3Access | None = None,
    file_format: str = "Parquet",
    config_id: str = CONFIG_ID,
    now_ms: int | None = None,
) -> WrittenReport:
    """Write encoded data files ``(bytes, rows)`` and then the manifest that makes them a report.

    Data files first, then ``manifest.json`` and ``manifest.checksum`` (the manifest is what makes
    a report visible to readers), then the Hive ``symlink.txt``. In S3 every object is a
    conditional create; a report for the same minute that already exists is refused.
    """
    if destination.bucket and access is None:
        raise InventoryError("an S3 destination needs S3 access")
    now_ms = now_ms if now_ms is not None else int(datetime.now(timezone.utc).timestamp() * 1000)
    created = datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc)
    stamp = created.strftime("%Y-%m-%dT%H-%MZ")
    root_key = f"{destination.prefix}/{source_bucket}/{config_id}"
    dest_bucket = destination.bucket or "local"
    ext = ".parquet" if file_format == "Parquet" else ".csv.gz"
    dest_access = access.with_bucket(destination.bucket) if (access and destination.bucket) else None

    def put(rel: str, body: bytes, content_type: str) -> None:
        if dest_access is not None:
            outcome = put_if_absent(dest_access, f"{root_key}/{rel}", body, content_type=content_type)
            if outcome != "created":
                raise InventoryError(f"s3://{dest_bucket}/{root_key}/{rel} already exists")
        else:
            assert destination.local_dir is not None
            path = destination.local_dir / source_bucket / config_id / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "xb") as fh:  # never overwrite, like the conditional create
                fh.write(body)

    total, files = 0, []
    for body, nrows in bodies:
        name = f"data/{uuid.uuid4()}{ext}"
        put(name, body, "application/octet-stream")
        files.append({"key": f"{root_key}/{name}", "size": len(body), "MD5checksum": hashlib.md5(body).hexdigest()})
        total += nrows
    manifest = {
        "sourceBucket": source_bucket,
        "destinationBucket": f"arn:aws:s3:::{dest_bucket}",
        "version": VERSION,
        "creationTimestamp": str(now_ms),
        "fileFormat": file_format,
        "fileSchema": PARQUET_FILE_SCHEMA if file_format == "Parquet" else CSV_FILE_SCHEMA,
        "files": files,
    }
    manifest_body = json.dumps(manifest, indent=2).encode("utf-8")
    put(f"{stamp}/manifest.json", manifest_body, "application/json")
    put(f"{stamp}/manifest.checksum", hashlib.md5(manifest_body).hexdigest().encode(), "text/plain")
    symlinks = "".join(f"s3://{dest_bucket}/{f['key']}\n" for f in files).encode()
    put(f"hive/dt={created.strftime('%Y-%m-%d-%H-%M')}/symlink.txt", symlinks, "text/plain")
    if destination.bucket:
        location = f"s3://{destination.bucket}/{root_key}/{stamp}/manifest.json"
    else:
        assert destination.local_dir is not None
        location = str(destination.local_dir / source_bucket / config_id / stamp / "manifest.json")
    return WrittenReport(location, total, files, file_format, now_ms)




def _reporting(rows: Any, say: Any, every: int = 100_000) -> Any:
    n = 0
    for n, row in enumerate(rows, start=1):
        if n % every == 0:
            say(f"listed {n:,} versions")
        yield row
    say(f"listed {n:,} versions; writing the report")


def snapshot(access: S3Access, destination: Destination, *, file_format: str = "Parquet",
             now_ms: int | None = None, rows_per_file: int = 1_000_000,
             progress: Any = None) -> WrittenReport:
    """``lmctl inventory snapshot``: list the namespace's layout prefixes (all versions) and write a
    report; ``progress`` is told each prefix and every 100,000 versions listed."""
    from itertools import chain

    from lightmetrics.deployment.resource_types import LAYOUT_PREFIXES

    # The key layout of the namespace (docs/protocol.md §3); anything else in the bucket — such as
    # earlier reports written next to it locally — is not part of the authority's inventory.
    s3 = client(access)
    rows = chain.from_iterable(listing_rows(s3, access.bucket, access.prefix + p) for p in LAYOUT_PREFIXES)
    if progress is not None:
        rows = _reporting(rows, progress)
    return write_report(rows, destination, source_bucket=access.bucket, access=access, file_format=file_format,
                        now_ms=now_ms, rows_per_file=rows_per_file)




__all__ = ["WrittenReport", "listing_rows", "parquet_table_bytes", "snapshot", "write_report", "write_report_files"]
