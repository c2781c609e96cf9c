"""The rollups as Athena tables (docs/pipeline.md §6.1): a Glue database, the ``rollups`` table over
the v3 Parquet objects, the ``rollup_manifests`` table over the generation manifests, and a named
query that creates the view ``rollups_current`` (the rows of each hour's highest committed v3
generation).

No crawler and no partition maintenance: **partition projection** computes every partition's
location from the key layout (``KeyCodec.rollup_part``), and ``storage.location.template`` reads
only the v3 ``generation=`` folders, never the v1/v2 ``metric=`` folders beside them. The columns
come from ``lightmetrics_pipeline.rollup.parquet.COLUMNS`` (a test compares them with a file the rollup wrote).
Athena itself cannot run locally (moto has no query engine): tests/test_rollup_view_duckdb.py runs the
view's SQL in DuckDB (transpiled by sqlglot) over the rollups the job wrote.
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_athena as athena
from aws_cdk import aws_glue as glue
from constructs import Construct

from lightmetrics.protocol.keys import KeyKind, layout_root
from lightmetrics_pipeline.rollup.manifest import PARQUET_MANIFEST_SCHEMAS
from lightmetrics_pipeline.rollup.parquet import COLUMNS, MAX_GENERATION

ROLLUPS_TABLE = "rollups"
MANIFESTS_TABLE = "rollup_manifests"
CURRENT_VIEW = "rollups_current"
#: Projected generations per hour: the job's own limit (``MAX_GENERATION``: it builds no generation
#: past it), so every committed generation is projected; a wider range would cost a direct query of
#: ``rollups`` (filtered on date and hour only) a listing per projected folder.
MAX_PROJECTED_GENERATION = MAX_GENERATION
#: The width of ``generation=`` in the keys (``KeyCodec.rollup_part``): the view joins on it as text.
GENERATION_DIGITS = 10
FIRST_DATE = "2025-01-01"
#: The manifests' own fields the view needs: ``hour`` (manifest v3) and ``acceptance_hour`` (v4: the
#: field renamed so that it no longer collides with the ``hour=`` folder); a field a manifest lacks is null.
MANIFEST_COLUMNS = (("schema", "string"), ("hour", "string"), ("acceptance_hour", "string"), ("generation", "int"),
                    ("supersedes", "int"), ("inputs", "struct<count:bigint,sha256:string>"))
_PARQUET_SERDE = "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe"
_PARQUET_IN = "org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat"
_PARQUET_OUT = "org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat"
_JSON_SERDE = "org.openx.data.jsonserde.JsonSerDe"
_TEXT_IN = "org.apache.hadoop.mapred.TextInputFormat"
_TEXT_OUT = "org.apache.hadoop.hive.ql.io.HiveIgnoreKeyTextOutputFormat"


def database_name(stack_name: str) -> str:
    """Glue names are lower case with underscores.

    >>> database_name("Lightmetrics-Dev")
    'lightmetrics_dev_rollups'
    """
    return f"{stack_name.lower().replace('-', '_')}_rollups"


def _date_hour_projection(hour_key: str) -> dict[str, str]:
    return {"projection.enabled": "true",
            "projection.date.type": "date", "projection.date.range": f"{FIRST_DATE},NOW",
            "projection.date.format": "yyyy-MM-dd", "projection.date.interval": "1",
            "projection.date.interval.unit": "DAYS",
            f"projection.{hour_key}.type": "integer", f"projection.{hour_key}.range": "0,23",
            f"projection.{hour_key}.digits": "2"}


def current_view_sql(database: str) -> str:
    """The view of the rows of each hour's highest committed generation, if it is v3 (docs/pipeline.md §1).

    The rows are joined on the ``rollups`` table's **partition** columns (``date``, ``hour`` and
    ``generation``, the latter as the key's zero-padded text), not only on the data columns, so
    the engine prunes every other generation folder of the hour (dynamic partition pruning) instead
    of listing and reading all projected ones; the data columns are compared too."""
    manifest_key = r"'/generation=[0-9]{10}\.json$'"
    return f"""CREATE OR REPLACE VIEW {database}.{CURRENT_VIEW} AS
WITH manifests AS (
  SELECT m."date" AS manifest_date, m.hour_part, coalesce(m.acceptance_hour, m.hour) AS hour, m.generation, m.schema,
         m.inputs.sha256 AS inputs_sha256
  FROM {database}.{MANIFESTS_TABLE} m
  WHERE regexp_like(m."$path", {manifest_key})
), highest AS (
  SELECT hour, max(generation) AS generation FROM manifests GROUP BY hour
), committed AS (
  SELECT m.manifest_date, m.hour_part, m.hour, m.generation, m.inputs_sha256,
         lpad(CAST(m.generation AS varchar), {GENERATION_DIGITS}, '0') AS generation_folder
  FROM manifests m JOIN highest h ON m.hour = h.hour AND m.generation = h.generation
  WHERE m.schema IN ({", ".join(f"'{s}'" for s in PARQUET_MANIFEST_SCHEMAS)})
)
SELECT r.*
FROM {database}.{ROLLUPS_TABLE} r
JOIN committed c
  ON r."date" = c.manifest_date AND r.hour = c.hour_part AND r.generation = c.generation_folder
  AND r.acceptance_hour = c.hour AND r.rollup_generation = c.generation AND r.inputs_sha256 = c.inputs_sha256
"""


class RollupCatalog(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, stack_name: str, bucket_name: str,
                 prefix: str) -> None:
        super().__init__(scope, construct_id)
        account = Stack.of(self).account
        self.database_name = database_name(stack_name)
        self.database = glue.CfnDatabase(
            self, "Database", catalog_id=account, database_input=glue.CfnDatabase.DatabaseInputProperty(
                name=self.database_name, description="Lightmetrics hourly rollups (docs/pipeline.md §6.1)"))
        rollups_root = f"s3://{bucket_name}/{prefix}{layout_root(KeyKind.ROLLUP_PART)}"
        manifests_root = f"s3://{bucket_name}/{prefix}{layout_root(KeyKind.ROLLUP_MANIFEST)}"
        part_keys = [glue.CfnTable.ColumnProperty(name=n, type="string") for n in ("window", "date", "hour", "generation")]
        self.rollups = glue.CfnTable(self, "RollupsTable", catalog_id=account, database_name=self.database_name,
                                     table_input=glue.CfnTable.TableInputProperty(
            name=ROLLUPS_TABLE, table_type="EXTERNAL_TABLE",
            description="Rollup format v3: Parquet rows per series and window start (docs/pipeline.md §6)",
            parameters={"classification": "parquet", "EXTERNAL": "TRUE", **_date_hour_projection("hour"),
                        "projection.window.type": "enum", "projection.window.values": "1m,5m,1h",
                        "projection.generation.type": "integer",
                        "projection.generation.range": f"1,{MAX_PROJECTED_GENERATION}",
                        "projection.generation.digits": "10",
                        "storage.location.template": f"{rollups_root}window=${{window}}/date=${{date}}/hour=${{hour}}/"
                                                     "generation=${generation}/"},
            partition_keys=part_keys,
            storage_descriptor=glue.CfnTable.StorageDescriptorProperty(
                columns=[glue.CfnTable.ColumnProperty(name=n, type=t) for n, t in COLUMNS],
                location=rollups_root, input_format=_PARQUET_IN, output_format=_PARQUET_OUT,
                serde_info=glue.CfnTable.SerdeInfoProperty(serialization_library=_PARQUET_SERDE))))
        self.manifests = glue.CfnTable(self, "ManifestsTable", catalog_id=account, database_name=self.database_name,
                                       table_input=glue.CfnTable.TableInputProperty(
            name=MANIFESTS_TABLE, table_type="EXTERNAL_TABLE",
            description="Rollup generation manifests, one JSON line each (docs/pipeline.md §6)",
            parameters={"classification": "json", "EXTERNAL": "TRUE", **_date_hour_projection("hour_part"),
                        "storage.location.template": f"{manifests_root}date=${{date}}/hour=${{hour_part}}/"},
            partition_keys=[glue.CfnTable.ColumnProperty(name=n, type="string") for n in ("date", "hour_part")],
            storage_descriptor=glue.CfnTable.StorageDescriptorProperty(
                columns=[glue.CfnTable.ColumnProperty(name=n, type=t) for n, t in MANIFEST_COLUMNS],
                location=manifests_root, input_format=_TEXT_IN, output_format=_TEXT_OUT,
                serde_info=glue.CfnTable.SerdeInfoProperty(serialization_library=_JSON_SERDE,
                                                           parameters={"ignore.malformed.json": "true"}))))
        for table in (self.rollups, self.manifests):
            table.add_dependency(self.database)
        self.view_query = athena.CfnNamedQuery(
            self, "CurrentViewQuery", database=self.database_name, name=f"{self.database_name}-create-{CURRENT_VIEW}",
            description="Creates the view of each hour's highest committed rollup generation (docs/pipeline.md §6.1)",
            query_string=current_view_sql(self.database_name))
        self.view_query.add_dependency(self.database)
