"""A real query engine over the rollups (issue 27 item 10, docs/pipeline.md §6.1): the CDK app's
named query — the `rollups_current` view, as synthesized — transpiled from Athena's dialect to
DuckDB's by sqlglot and run over the objects and manifests the rollup job wrote; every row it
returns equals `lmctl query`'s numbers (``run_query``), and nothing else comes back.

The two Glue tables are transcribed as Athena reads them: ``rollups`` = the Parquet files under the
projection's template (``window=/date=/hour=/generation=`` folders, the partition values as
strings), ``rollup_manifests`` = one JSON line per manifest with the table's columns, its partition
columns ``date``/``hour_part`` taken from the template's folders, and Athena's ``"$path"``.

Issue 27 item 8: the manifests (v4: the hour is ``acceptance_hour``) are also read by DuckDB and
pyarrow with Hive partitioning from their folders, as their defaults do, without a collision."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path
from typing import Any

import duckdb
import sqlglot
from conftest import T0_NS
from pipeline_support import H0, accept_indexed, access_for, make_system, varied_samples

from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics_pipeline.rollup.committed import read_committed
from lightmetrics_pipeline.rollup.job import RollupJob
from lightmetrics_pipeline.rollup.query import run_query

_BITS = struct.Struct(">d").pack


def _named_query(cdk_synth: Any) -> tuple[str, str]:
    """(database, SQL) of the synthesized ``AWS::Athena::NamedQuery``."""
    from aws_cdk.assertions import Template

    resources = Template.from_stack(cdk_synth.stack.pipeline).to_json()["Resources"].values()
    (query,) = [r["Properties"] for r in resources if r["Type"] == "AWS::Athena::NamedQuery"]
    return query["Database"], query["QueryString"]


def _tables(con: Any, database: str, root: Path) -> None:
    """The Glue tables of infra/components/rollup_catalog.py as DuckDB views over ``root`` (a copy
    of the bucket): the same columns, partition columns and locations."""
    from sqlglot import exp

    from infra.components.rollup_catalog import MANIFEST_COLUMNS

    con.execute(f"CREATE SCHEMA {database}")
    con.execute(f"""CREATE VIEW {database}.rollups AS SELECT * FROM read_parquet(
        '{root}/rollup/v1/window=*/date=*/hour=*/generation=*/*.parquet',
        hive_partitioning = true, hive_types_autocast = false)""")
    columns = ", ".join(f"'{n}': '{exp.DataType.build(t, dialect='hive').sql('duckdb')}'" for n, t in MANIFEST_COLUMNS)
    con.execute(f"""CREATE VIEW {database}.rollup_manifests AS
        SELECT {", ".join(f'"{n}"' for n, _ in MANIFEST_COLUMNS)},
               regexp_extract(filename, '/date=([^/]+)/', 1) AS "date",
               regexp_extract(filename, '/hour=([^/]+)/', 1) AS hour_part, filename AS "$path"
        FROM read_json('{root}/manifests/v1/date=*/hour=*/*.json', columns = {{{columns}}},
                       format = 'newline_delimited', hive_partitioning = false, filename = true)""")


def _mirror(s3: Any, bucket: str, root: Path) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            path = root / o["Key"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())


def _default_reads(root: Path, hour: str) -> None:
    """The manifests as DuckDB reads them by default (Hive partitions from the folders) and as a
    pyarrow Hive dataset with the Glue table's columns: the folder's ``hour`` beside the manifest's
    own ``acceptance_hour`` (a v3 manifest's ``hour`` field collided with the folder's)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from lightmetrics_pipeline.rollup import manifest as RM

    got = duckdb.sql(f"SELECT schema, acceptance_hour, hour, generation FROM read_json('{root}/manifests/v1/*/*/*.json') "
                     "ORDER BY generation").fetchall()
    assert [(g, a, str(h)) for s, a, h, g in got if s == RM.MANIFEST_SCHEMA_V4] == [(2, hour, hour[-2:])]
    v4 = [str(p) for p in (root / "manifests/v1").rglob("generation=0000000002.json")]
    schema = pa.schema([("schema", pa.string()), ("acceptance_hour", pa.string()), ("generation", pa.int32()),
                        ("inputs", pa.struct([("count", pa.int64()), ("sha256", pa.string())])),
                        ("date", pa.string()), ("hour", pa.int32())])
    table = ds.dataset(v4, format="json", partitioning="hive", partition_base_dir=str(root / "manifests/v1"),
                       schema=schema).to_table()
    assert [(r["acceptance_hour"], r["hour"], r["date"]) for r in table.to_pylist()] == [(hour, int(hour[-2:]),
                                                                                           hour[:10])]


def test_the_named_query_run_by_duckdb_returns_exactly_lmctl_query_rows(cdk_synth, runtime, clock, spark, tmp_path,
                                                                        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from lightmetrics_pipeline.rollup import manifest as RM

    system = make_system(runtime, clock)
    for n in range(2):
        accept_indexed(system, runtime, clock, BatchIdentity.create("agent-d", "boot-1", n * 10, n * 10 + 9),
                       varied_samples(n, n=30))
    access = access_for(system, runtime)
    job = RollupJob(spark, access, table=None, clock=clock)
    # Generation 1 as a job before manifest v4 wrote it (the hour named `hour`), generation 2 as v4:
    # the view takes the hour from either (coalesce), so generation 2 supersedes generation 1.
    monkeypatch.setattr(RM, "WRITTEN_MANIFEST_SCHEMA", RM.MANIFEST_SCHEMA_V3)
    assert job.run([H0], first_open=H0.next()).hours[0].generation == 1
    monkeypatch.undo()
    accept_indexed(system, runtime, clock, BatchIdentity.create("agent-d", "boot-1", 50, 59), varied_samples(5, n=30))
    assert job.run([H0], first_open=H0.next()).hours[0].generation == 2  # generation 1 stays, superseded
    root = tmp_path / "bucket"
    _mirror(runtime.boto3_client("s3"), system.settings.bucket, root)
    if access.codec.prefix:
        root = root / access.codec.prefix.rstrip("/")
    # A stray copy of a current object in the superseded generation's folder (as a lost run could
    # leave): its rows carry generation 2's columns, but the view reads only generation 2's folder.
    current = read_committed(access, H0)["parquet"]["objects"][0]["key"][len(access.codec.prefix):]
    stray = re.sub(r"generation=\d{10}/part-\d{5}\.", "generation=0000000001/part-00009.", current)
    shutil.copy(root / current, root / stray)
    _default_reads(root, str(H0))

    database, sql = _named_query(cdk_synth)
    (duck_sql,) = sqlglot.transpile(sql, read="athena", write="duckdb")
    con = duckdb.connect()
    _tables(con, database, root)
    con.execute(duck_sql)
    cur = con.execute(f'SELECT "window", metric, labels, window_start_ns, "count", nan_count, "sum", "min", "max", '
                      f'"last", last_ts_ns, sketch, rollup_generation, generation FROM {database}.rollups_current')
    rows = cur.fetchall()
    assert rows and {(r[12], r[13]) for r in rows} == {(2, "0000000002")}
    view = {}
    for w, metric, labels, ws, count, nans, s, lo, hi, last, last_ts, sketch, _g, _p in rows:
        key = (w, metric, tuple(sorted(dict(labels).items())), ws)
        assert key not in view, key  # each row once
        view[key] = (count, nans, _BITS(s), _BITS(lo), _BITS(hi), _BITS(last), last_ts, bytes(sketch))
    queried = {}
    for metric in sorted({k[1] for k in view}):
        for w in ("1m", "5m", "1h"):
            q = run_query(access, metric, start_ns=T0_NS - 3 * 3600 * 10**9, end_ns=T0_NS + 3600 * 10**9, window=w)
            assert q.generations == {str(H0): 2}
            for series in q.series:
                for p in series.points:
                    queried[(w, metric, tuple(sorted(series.labels.items())), p.window_start_ns)] = (
                        p.count, p.nan_count, _BITS(p.sum), _BITS(p.min), _BITS(p.max), _BITS(p.last), p.last_ts_ns,
                        p.sketch)
    assert view == queried
