"""Reading S3 Inventory reports: :func:`open_report` finds and parses one (the latest under a
prefix, or a given manifest); :func:`inventory_dataframe` reads its data files as data — local
files, and ``s3://`` where the session has a Hadoop file system for it (EMRFS on EMR), with Spark's
Parquet and CSV readers; otherwise (S3 of the local runtime: no Hadoop S3A connector here) by
GETting each file inside an executor (``mapInPandas``). The manifest's MD5 of each file is checked
either way."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

from lightmetrics_pipeline.inventory.format import (
    COLUMN_OF_CSV_FIELD,
    COLUMNS,
    INVENTORY_SETTING,
    KIND_OF_COLUMN,
    SPARK_SCHEMA,
    InventoryError,
)
from lightmetrics_pipeline.s3io import S3Access, client, s3_errors, store

_TS_DIR = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}-\d{2}Z$")



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
        kind = KIND_OF_COLUMN[col]
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
    return [COLUMN_OF_CSV_FIELD.get(n.strip(), re.sub(r"(?<!^)(?=[A-Z])", "_", n.strip()).lower())
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
    return {"string": "string", "bool": "boolean", "long": "long", "timestamp": "timestamp"}[KIND_OF_COLUMN[col]]


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
        kind = KIND_OF_COLUMN[col]
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


__all__ = ["DataFile", "InventoryReport", "inventory_dataframe", "open_report", "read_data_file", "spark_reads_s3"]
