"""S3 Inventory's report format: the fields, schemas and destinations (AWS "Locating your inventory
list"); :mod:`lightmetrics_pipeline.inventory.report` describes the layout, :mod:`lightmetrics_pipeline.inventory.writer` writes
reports and :mod:`lightmetrics_pipeline.inventory.reader` reads them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = "2016-11-30"
CONFIG_ID = "weekly-parquet"  # infra/components/storage.py INVENTORY_ID
DEST_PREFIX = "inventory"  # infra/components/storage.py INVENTORY_PREFIX
#: What names a report's bucket in errors (the audit's --inventory; default under LM_BUCKET)
INVENTORY_SETTING = "--inventory"

#: (parquet column, CSV field name, kind) in the order the stack's configuration produces them.
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("bucket", "Bucket", "string"),
    ("key", "Key", "string"),
    ("version_id", "VersionId", "string"),
    ("is_latest", "IsLatest", "bool"),
    ("is_delete_marker", "IsDeleteMarker", "bool"),
    ("size", "Size", "long"),
    ("last_modified_date", "LastModifiedDate", "timestamp"),
    ("e_tag", "ETag", "string"),
    ("storage_class", "StorageClass", "string"),
    ("is_multipart_uploaded", "IsMultipartUploaded", "bool"),
    ("checksum_algorithm", "ChecksumAlgorithm", "string"),
)
COLUMNS = tuple(f[0] for f in FIELDS)
#: CSV field name -> parquet column, and parquet column -> kind
COLUMN_OF_CSV_FIELD = {csv_name: col for col, csv_name, _ in FIELDS}
KIND_OF_COLUMN = {col: kind for col, _, kind in FIELDS}

PARQUET_FILE_SCHEMA = "message s3.inventory { " + " ".join(
    ("required" if col in ("bucket", "key") else "optional")
    + {"string": " binary {} (STRING);", "bool": " boolean {};", "long": " int64 {};",
       "timestamp": " int64 {} (TIMESTAMP(MILLIS,true));"}[kind].format(col)
    for col, _, kind in FIELDS
) + "}"
CSV_FILE_SCHEMA = ", ".join(f[1] for f in FIELDS)

#: The Spark schema every reader produces (DDL).
SPARK_SCHEMA = ("bucket string, key string, version_id string, is_latest boolean, is_delete_marker boolean, "
                "size long, last_modified_date timestamp, e_tag string, storage_class string, "
                "is_multipart_uploaded boolean, checksum_algorithm string")


class InventoryError(ValueError):
    """A report that cannot be found or does not follow the documented format."""


def arrow_schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "bool": pa.bool_(), "long": pa.int64(), "timestamp": pa.timestamp("ms", tz="UTC")}
    return pa.schema([pa.field(col, types[kind], nullable=col not in ("bucket", "key")) for col, _, kind in FIELDS])


@dataclass(frozen=True)
class Destination:
    """Where a report goes: ``s3://bucket/prefix`` or a local directory (the prefix's stand-in)."""

    bucket: str | None
    prefix: str
    local_dir: Path | None = None

    @classmethod
    def parse(cls, text: str) -> "Destination":
        if text.startswith("s3://"):
            bucket, _, prefix = text[5:].partition("/")
            if not bucket:
                raise InventoryError(f"bad destination {text!r}")
            return cls(bucket, prefix.strip("/") or DEST_PREFIX)
        return cls(None, DEST_PREFIX, Path(text))

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}/" if self.bucket else str(self.local_dir)


__all__ = ["COLUMNS", "COLUMN_OF_CSV_FIELD", "CONFIG_ID", "CSV_FILE_SCHEMA", "DEST_PREFIX", "FIELDS", "INVENTORY_SETTING",
           "KIND_OF_COLUMN", "PARQUET_FILE_SCHEMA", "SPARK_SCHEMA", "VERSION", "Destination", "InventoryError",
           "arrow_schema"]
