"""S3 Inventory reports, in the format AWS writes them.

A report (AWS "Locating your inventory list") lives under a destination prefix::

    <dest-prefix>/<source-bucket>/<config-id>/YYYY-MM-DDTHH-MMZ/manifest.json
    <dest-prefix>/<source-bucket>/<config-id>/YYYY-MM-DDTHH-MMZ/manifest.checksum   (MD5 of manifest.json)
    <dest-prefix>/<source-bucket>/<config-id>/hive/dt=YYYY-MM-DD-HH-MM/symlink.txt
    <dest-prefix>/<source-bucket>/<config-id>/data/<uuid>.parquet | .csv.gz

``manifest.json`` has ``sourceBucket``, ``destinationBucket`` (an ARN), ``version``
(``2016-11-30``), ``creationTimestamp`` (epoch milliseconds, as a string), ``fileFormat``
(``Parquet`` or ``CSV``), ``fileSchema`` and ``files`` (``key``, ``size``, ``MD5checksum``).
Parquet data files have snake_case columns (``bucket``, ``key``, ``version_id``, ``is_latest``,
``is_delete_marker``, ``size``, ``last_modified_date`` as a UTC millisecond timestamp, ``e_tag``,
``storage_class``, ``is_multipart_uploaded``, ``checksum_algorithm``); CSV data files are gzip,
no header, every value quoted, in ``fileSchema`` order (``Bucket, Key, VersionId, ...``), with
the key URL-encoded. The stack's inventory configuration (infra/components/storage.py) asks for
exactly these optional fields and all object versions.

* :func:`write_report` writes such a report from listing rows (``lmctl inventory snapshot``), into
  a bucket or a local directory, so local runs and tests read the real format;
* :func:`open_report` finds and parses a report (latest under a prefix, or a given manifest);
* :func:`inventory_dataframe` reads its data files as data: local files, and ``s3://`` where the
  session has a Hadoop file system for it (EMRFS on EMR), with Spark's Parquet and CSV readers;
  otherwise (S3 of the local runtime: no Hadoop S3A connector here) by GETting each file inside an
  executor (``mapInPandas``). The manifest's MD5 of each file is checked either way.

Example:
    >>> report = open_report("s3://ops/inventory/lm-bucket/weekly-parquet/", access)   # doctest: +SKIP
    >>> inventory_dataframe(spark, report, access).count()                            # doctest: +SKIP
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus, unquote_plus

from lightmetrics_pipeline.s3io import S3Access, client, put_if_absent, s3_errors, store

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
_CSV_TO_COLUMN = {csv_name: col for col, csv_name, _ in FIELDS}
_KIND = {col: kind for col, _, kind in FIELDS}

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

_TS_DIR = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}-\d{2}Z$")


class InventoryError(ValueError):
    """A report that cannot be found or does not follow the documented format."""


def arrow_schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "bool": pa.bool_(), "long": pa.int64(), "timestamp": pa.timestamp("ms", tz="UTC")}
    return pa.schema([pa.field(col, types[kind], nullable=col not in ("bucket", "key")) for col, _, kind in FIELDS])


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


# ----------------------------------------------------------------------------------- writing


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
    kind = _KIND[col]
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


# ----------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class DataFile:
    ref: str  # a local path, or the key in ``bucket``
    bucket: str | None
    size: int
    md5: str


@dataclass(frozen=True)
class InventoryReport:
    location: str
    manifest: dict[str, Any]
    files: tuple[DataFile, ...]

    @property
    def source_bucket(self) -> str:
        return str(self.manifest["sourceBucket"])

    @property
    def file_format(self) -> str:
        return str(self.manifest["fileFormat"])

    @property
    def created_ms(self) -> int:
        return int(self.manifest["creationTimestamp"])

    def to_json(self) -> dict[str, Any]:
        return {"manifest": self.location, "source_bucket": self.source_bucket, "format": self.file_format,
                "creation_timestamp_ms": self.created_ms, "files": len(self.files)}


def _parse_manifest(location: str, body: bytes, resolve: Any) -> InventoryReport:
    try:
        manifest = json.loads(body)
    except ValueError:
        raise InventoryError(f"{location}: manifest.json is not JSON") from None
    for name in ("sourceBucket", "destinationBucket", "version", "creationTimestamp", "fileFormat", "fileSchema", "files"):
        if name not in manifest:
            raise InventoryError(f"{location}: manifest.json lacks {name!r}")
    if manifest["fileFormat"] not in ("Parquet", "CSV"):
        raise InventoryError(f"{location}: fileFormat {manifest['fileFormat']!r} is not supported (Parquet, CSV)")
    files = tuple(resolve(f) for f in manifest["files"])
    return InventoryReport(location, manifest, files)


def _latest_stamp(names: Iterable[str]) -> str | None:
    stamps = sorted(n for n in names if _TS_DIR.match(n))
    return stamps[-1] if stamps else None


def open_report(location: str, access: S3Access | None = None) -> InventoryReport:
    """Parse a report: ``location`` is a ``manifest.json`` (local or ``s3://``) or a directory/prefix
    above one (``<dest>/<bucket>/<config-id>/`` or higher): the latest report under it is used."""
    if location.startswith("s3://"):
        if access is None:
            raise InventoryError("reading a report in S3 needs S3 access")
        bucket, _, key = location[5:].partition("/")
        acc = access.with_bucket(bucket)
        s3 = client(acc)
        with s3_errors(bucket, INVENTORY_SETTING):
            if not key.endswith("manifest.json"):
                key = _find_latest_s3(s3, bucket, key.rstrip("/") + "/" if key else "")
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            checksum = _get_or_none(s3, bucket, key.rsplit("/", 1)[0] + "/manifest.checksum")
        if checksum is not None and checksum.decode().strip() != hashlib.md5(body).hexdigest():
            raise InventoryError(f"s3://{bucket}/{key}: manifest.checksum does not match")

        def resolve(f: dict[str, Any]) -> DataFile:
            return DataFile(f["key"], bucket, int(f.get("size", 0)), str(f.get("MD5checksum", "")))

        return _parse_manifest(f"s3://{bucket}/{key}", body, resolve)
    path = Path(location)
    if path.is_dir():
        path = _find_latest_local(path)
    if not path.is_file():
        raise InventoryError(f"no inventory manifest at {location}")
    body = path.read_bytes()
    checksum = path.with_name("manifest.checksum")
    if checksum.exists() and checksum.read_text().strip() != hashlib.md5(body).hexdigest():
        raise InventoryError(f"{path}: manifest.checksum does not match")
    config_root = path.parent.parent

    def resolve_local(f: dict[str, Any]) -> DataFile:
        tail = str(f["key"]).split("/data/", 1)
        if len(tail) != 2:
            raise InventoryError(f"{path}: data file key {f['key']!r} is not under data/")
        return DataFile(str(config_root / "data" / tail[1]), None, int(f.get("size", 0)), str(f.get("MD5checksum", "")))

    return _parse_manifest(str(path), body, resolve_local)


def _get_or_none(s3: Any, bucket: str, key: str) -> bytes | None:
    """The object, or None if there is no such key (any other error raises)."""
    from botocore.exceptions import ClientError

    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise


def _find_latest_s3(s3: Any, bucket: str, prefix: str, depth: int = 0) -> str:
    page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/")
    subdirs = [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
    stamp = _latest_stamp(subdirs)
    if stamp:
        return f"{prefix}{stamp}/manifest.json"
    candidates = [d for d in subdirs if d not in ("data", "hive")]
    if depth < 3 and len(candidates) == 1:
        return _find_latest_s3(s3, bucket, f"{prefix}{candidates[0]}/", depth + 1)
    raise InventoryError(f"no inventory report under s3://{bucket}/{prefix} (give the manifest.json or the "
                         "<source-bucket>/<config-id>/ prefix)")


def _find_latest_local(path: Path, depth: int = 0) -> Path:
    subdirs = [p.name for p in path.iterdir() if p.is_dir()]
    stamp = _latest_stamp(subdirs)
    if stamp:
        return path / stamp / "manifest.json"
    candidates = [d for d in subdirs if d not in ("data", "hive")]
    if depth < 3 and len(candidates) == 1:
        return _find_latest_local(path / candidates[0], depth + 1)
    raise InventoryError(f"no inventory report under {path}")


def _normalize(pdf: Any) -> Any:
    """Any inventory pandas frame -> the columns of :data:`COLUMNS` with their types."""
    import pandas as pd

    out = pd.DataFrame(index=pdf.index)
    for col in COLUMNS:
        kind = _KIND[col]
        series = pdf[col] if col in pdf.columns else pd.Series([None] * len(pdf), index=pdf.index, dtype=object)
        if kind == "string":
            out[col] = series.astype(object).where(series.notna(), None)
        elif kind == "bool":
            out[col] = series.map(lambda v: None if v is None or (isinstance(v, float) and v != v) or v == ""
                                  else (v if isinstance(v, bool) else str(v).lower() == "true")).astype(object)
        elif kind == "long":
            out[col] = pd.to_numeric(series.replace("", None), errors="coerce").astype("Int64")
        else:
            out[col] = pd.to_datetime(series.replace("", None), utc=True, errors="coerce")
    return out


def _csv_columns(file_schema: str) -> list[str]:
    """The columns of a CSV report's fields, in ``fileSchema`` order (``LastModifiedDate`` ->
    ``last_modified_date``; a field this reader does not know keeps its snake_case name)."""
    return [_CSV_TO_COLUMN.get(n.strip(), re.sub(r"(?<!^)(?=[A-Z])", "_", n.strip()).lower())
            for n in file_schema.split(",")]


def read_data_file(data: bytes, file_format: str, file_schema: str) -> Any:
    """One data file's rows as a normalized pandas frame."""
    import pandas as pd

    if file_format == "Parquet":
        import pyarrow.parquet as pq

        pdf = pq.read_table(io.BytesIO(data)).to_pandas()
        return _normalize(pdf)
    names = _csv_columns(file_schema)
    pdf = pd.read_csv(io.BytesIO(gzip.decompress(data)), header=None, names=names, dtype=str, keep_default_na=False)
    if "key" in pdf.columns:
        pdf["key"] = pdf["key"].map(unquote_plus)
    return _normalize(pdf)


def _read_files_udf(file_format: str, file_schema: str, access: S3Access | None) -> Any:
    def read(batches: Iterator[Any]) -> Iterator[Any]:
        from lightmetrics_pipeline import s3io

        for pdf in batches:
            for ref, bucket, md5 in zip(pdf["ref"], pdf["bucket"], pdf["md5"]):
                if bucket:
                    assert access is not None
                    body = s3io.client(access.with_bucket(bucket)).get_object(Bucket=bucket, Key=ref)["Body"].read()
                else:
                    with open(ref, "rb") as fh:
                        body = fh.read()
                if md5 and hashlib.md5(body).hexdigest() != md5:
                    raise InventoryError(f"inventory data file {ref}: MD5 does not match the manifest")
                yield read_data_file(body, file_format, file_schema)

    return read


def _spark_type(col: str) -> str:
    return {"string": "string", "bool": "boolean", "long": "long", "timestamp": "timestamp"}[_KIND[col]]


def _spark_csv(spark: Any, paths: list[str], file_schema: str) -> Any:
    """CSV data files through Spark's CSV reader (gzip from the ``.gz`` name), normalized exactly
    as :func:`read_data_file` does: keys URL-decoded (``+`` is a space), empty values empty strings
    in string columns and nulls elsewhere, unparseable numbers and times null."""
    from pyspark.sql import functions as F

    names = _csv_columns(file_schema)
    raw = spark.read.csv(paths, schema=", ".join(f"`{n}` string" for n in names), header=False, quote='"',
                         escape='"', mode="FAILFAST")
    cols = []
    for col in COLUMNS:
        if col not in names:
            cols.append(F.lit(None).cast(_spark_type(col)).alias(col))
            continue
        value = F.coalesce(F.col(col), F.lit(""))
        kind = _KIND[col]
        if col == "key":
            out = F.url_decode(value)
        elif kind == "string":
            out = value
        elif kind == "bool":
            out = F.when(value == "", F.lit(None).cast("boolean")).otherwise(F.lower(value) == "true")
        else:  # long, timestamp: what does not parse is null (pandas' errors="coerce")
            out = F.when(value == "", F.lit(None)).otherwise(value).try_cast(_spark_type(col))
        cols.append(out.alias(col))
    return raw.select(*cols)


def _typed(df: Any) -> Any:
    """A Parquet report's columns as :data:`SPARK_SCHEMA` (a column the file lacks is null)."""
    from pyspark.sql import functions as F

    return df.select(*[(F.col(col) if col in df.columns else F.lit(None)).cast(_spark_type(col)).alias(col)
                       for col in COLUMNS])


def spark_reads_s3(spark: Any, access: S3Access | None) -> bool:
    """Whether this session reads ``s3://`` itself: it runs against AWS (no endpoint override, so not
    the local runtime) and Hadoop has a file system for the ``s3`` scheme (EMRFS on EMR; no such
    jars locally, where data files are fetched by executors with boto3 instead)."""
    if access is not None and access.endpoint_url:
        return False
    try:
        jvm = spark.sparkContext._jvm
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass("s3", spark.sparkContext._jsc.hadoopConfiguration())
        return True
    except Exception:  # py4j: UnsupportedFileSystemException (no s3 scheme), or no JVM view
        return False


def _check_s3_md5(spark: Any, report: InventoryReport, access: S3Access) -> None:
    """The manifest's MD5 of each data file in S3: the ETag of a single-part upload is its MD5 (one
    HEAD per file, on the driver); a multipart one is hashed by Spark's ``md5`` in the executors."""
    from pyspark.sql import functions as F

    unsure = []
    for f in report.files:
        if not f.md5:
            continue
        assert f.bucket is not None
        head = store(access.with_bucket(f.bucket)).head(f.ref)
        if head is None:
            raise InventoryError(f"inventory data file s3://{f.bucket}/{f.ref} named by the manifest does not exist")
        etag = head.etag
        if "-" in etag:
            unsure.append(f)
        elif etag != f.md5:
            raise InventoryError(f"inventory data file s3://{f.bucket}/{f.ref}: MD5 does not match the manifest")
    if unsure:
        got = {r["path"]: r["md5"] for r in spark.read.format("binaryFile").load(
            [f"s3://{f.bucket}/{f.ref}" for f in unsure]).select("path", F.md5("content").alias("md5")).collect()}
        for f in unsure:
            if got.get(f"s3://{f.bucket}/{f.ref}") != f.md5:
                raise InventoryError(f"inventory data file s3://{f.bucket}/{f.ref}: MD5 does not match the manifest")


def inventory_dataframe(spark: Any, report: InventoryReport, access: S3Access | None = None, *,
                        spark_reader: bool | None = None) -> Any:
    """The report's rows as a DataFrame with :data:`SPARK_SCHEMA`.

    Local data files, and ``s3://`` ones where the session can read S3 (:func:`spark_reads_s3`, or
    ``spark_reader``), are read by Spark's Parquet or CSV reader (column pruning, no Python); the
    manifest's MD5 of each file is checked first (local: hashed on the driver; S3: the ETag). Data
    files in S3 otherwise (the local runtime) are fetched and parsed inside executors
    (``mapInPandas``), their MD5 checked there; ``spark_reader`` forces one way (tests). The rows
    and columns are the same either way."""
    if not report.files:
        return spark.createDataFrame([], SPARK_SCHEMA)
    local = all(f.bucket is None for f in report.files)
    in_s3 = all(f.bucket is not None for f in report.files)
    use_spark = (local or (in_s3 and spark_reads_s3(spark, access))) if spark_reader is None else spark_reader
    if not use_spark:
        refs = spark.createDataFrame([(f.ref, f.bucket, f.md5) for f in report.files],
                                     "ref string, bucket string, md5 string")
        refs = refs.repartition(min(len(report.files), 64))
        return refs.mapInPandas(_read_files_udf(report.file_format, report.manifest["fileSchema"], access), SPARK_SCHEMA)
    if local:
        for f in report.files:  # the manifest's MD5s, checked where the files are
            if f.md5 and _md5_file(f.ref) != f.md5:
                raise InventoryError(f"inventory data file {f.ref}: MD5 does not match the manifest")
        paths = [f.ref for f in report.files]
    else:
        assert access is not None
        _check_s3_md5(spark, report, access)
        paths = [f"s3://{f.bucket}/{f.ref}" for f in report.files]
    if report.file_format == "Parquet":
        return _typed(spark.read.parquet(*paths))
    return _spark_csv(spark, paths, report.manifest["fileSchema"])


def _md5_file(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


__all__ = [
    "COLUMNS", "CONFIG_ID", "CSV_FILE_SCHEMA", "DEST_PREFIX", "PARQUET_FILE_SCHEMA", "SPARK_SCHEMA",
    "DataFile", "Destination", "InventoryError", "InventoryReport", "WrittenReport", "inventory_dataframe",
    "listing_rows", "open_report", "parquet_table_bytes", "read_data_file", "snapshot", "spark_reads_s3", "write_report",
    "write_report_files",
]

