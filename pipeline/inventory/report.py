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

from lightmetrics_pipeline.inventory.format import (
    COLUMNS,
    CONFIG_ID,
    CSV_FILE_SCHEMA,
    DEST_PREFIX,
    FIELDS,
    INVENTORY_SETTING,
    PARQUET_FILE_SCHEMA,
    SPARK_SCHEMA,
    VERSION,
    Destination,
    InventoryError,
    arrow_schema,
)
from lightmetrics_pipeline.inventory.reader import (
    DataFile,
    InventoryReport,
    inventory_dataframe,
    open_report,
    read_data_file,
    spark_reads_s3,
)
from lightmetrics_pipeline.inventory.writer import (
    WrittenReport,
    listing_rows,
    parquet_table_bytes,
    snapshot,
    write_report,
    write_report_files,
)

__all__ = [
    "COLUMNS", "CONFIG_ID", "CSV_FILE_SCHEMA", "DEST_PREFIX", "FIELDS", "INVENTORY_SETTING", "PARQUET_FILE_SCHEMA",
    "SPARK_SCHEMA", "VERSION", "DataFile", "Destination", "InventoryError", "InventoryReport", "WrittenReport",
    "arrow_schema", "inventory_dataframe", "listing_rows", "open_report", "parquet_table_bytes", "read_data_file",
    "snapshot", "spark_reads_s3", "write_report", "write_report_files",
]
