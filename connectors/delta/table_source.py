"""A Delta table as a source for the table-backfill modules: snapshot, change feed, latest version.

Everything works without Delta's JVM jars: Spark reads the Parquet files of a version (listed by
delta-rs), and the change data feed comes from delta-rs' ``load_cdf``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from source_backfill.errors import DeltaSinkError

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


class DeltaTableSource:
    """Read a Delta table at a version, and its changes between versions."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _table(self, version: int | None = None) -> DeltaTable:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.path):
            msg = f"no Delta table at {self.path}"
            raise DeltaSinkError(msg)
        table = DeltaTable(self.path, version=version) if version is not None else DeltaTable(self.path)
        features = set(table.protocol().reader_features or [])
        mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
        if "deletionVectors" in features or mapping not in (None, "none"):
            msg = (f"Delta table {self.path} uses deletion vectors or column mapping, which Spark cannot "
                   "read from its Parquet files alone; use delta-spark for this table")
            raise DeltaSinkError(msg)
        return table

    def latest_version(self) -> int:
        """The table's newest version."""
        return int(self._table().version())

    def read_snapshot(self, spark: SparkSession, version: int | None = None) -> DataFrame:
        """The table's rows at ``version`` (latest when None), read by Spark from that version's files."""
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema

        table = self._table(version)
        schema = from_arrow_schema(pa.schema(table.schema().to_arrow()))
        files = table.file_uris()
        if not files:
            return spark.createDataFrame([], schema)
        return spark.read.schema(schema).option("basePath", self.path).parquet(*files)

    def read_changes(
        self, spark: SparkSession, start_version: int, end_version: int | None = None
    ) -> DataFrame:
        """Change data feed rows of versions ``start_version..end_version`` (inclusive)."""
        import pyarrow as pa

        table = self._table()
        end = table.version() if end_version is None else end_version
        if start_version > end:
            msg = f"start version {start_version} is after end version {end} of {self.path}"
            raise DeltaSinkError(msg)
        changes = pa.table(table.load_cdf(starting_version=start_version, ending_version=end).read_all())
        return spark.createDataFrame(_plain_types(changes))


def _plain_types(table: pa.Table) -> pa.Table:
    """Cast Arrow view and large types (delta-rs emits them) to the plain ones Spark converts."""
    import pyarrow as pa

    casts = {
        pa.string_view(): pa.string(), pa.large_string(): pa.string(),
        pa.binary_view(): pa.binary(), pa.large_binary(): pa.binary(),
        pa.uint64(): pa.int64(), pa.uint32(): pa.int64(),
    }
    schema = pa.schema([f.with_type(casts.get(f.type, f.type)) for f in table.schema])
    return table.cast(schema) if schema != table.schema else table
