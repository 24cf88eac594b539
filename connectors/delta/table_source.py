"""A Delta table as a source for the table-backfill modules: snapshot, change feed, latest version.

Everything works without Delta's JVM jars: Spark reads the Parquet files of a version (listed by
delta-rs), and the change data feed comes from delta-rs' ``load_cdf``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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

    def arrow_schema(self, version: int | None = None) -> pa.Schema:
        """The table's columns at ``version`` (latest when None), in the plain Arrow types Spark reads."""
        import pyarrow as pa

        return _plain_types(pa.schema(self._table(version).schema().to_arrow()).empty_table()).schema

    def change_feed_enabled(self) -> bool:
        """Whether the table records its change data feed (``delta.enableChangeDataFeed``)."""
        config = self._table().metadata().configuration
        return str(config.get("delta.enableChangeDataFeed", "false")).lower() == "true"

    def rows_arrow(self, version: int) -> pa.Table:
        """The table's rows at ``version``, read by delta-rs on the driver."""
        import pyarrow as pa

        return _plain_types(pa.table(self._table(version).to_pyarrow_table()))

    def changes_arrow(self, start_version: int, end_version: int | None = None) -> pa.Table:
        """Change data feed rows of versions ``start_version..end_version`` (inclusive) as Arrow.

        Each row carries ``_change_type`` (insert, delete, update_preimage, update_postimage),
        ``_commit_version`` and ``_commit_timestamp``. ``end_version`` None means the latest version; a
        range starting after it (nothing new yet, or ``end_version = start_version - 1``) is empty, not
        an error.
        """
        import pyarrow as pa

        commit_ts = pa.timestamp("ms", tz="UTC")
        table = self._table()
        end = table.version() if end_version is None else end_version
        if start_version < 0 or (end_version is not None and end_version < start_version - 1):
            msg = f"bad change feed range {start_version}..{end_version} of Delta table {self.path}"
            raise DeltaSinkError(msg)
        if start_version > end:
            return _plain_types(pa.schema(table.schema().to_arrow()).empty_table()).append_column(
                "_change_type", pa.array([], pa.string())).append_column(
                "_commit_version", pa.array([], pa.int64())).append_column(
                "_commit_timestamp", pa.array([], commit_ts))
        reader = table.load_cdf(starting_version=start_version, ending_version=end)
        changes = _plain_types(pa.table(reader.read_all()))
        i = changes.schema.get_field_index("_commit_timestamp")
        if i >= 0 and changes.schema.field(i).type != commit_ts:  # delta-rs: naive ms, in fact UTC
            changes = changes.set_column(i, "_commit_timestamp", changes.column(i).cast(commit_ts))
        return changes

    def read_changes(
        self, spark: SparkSession, start_version: int, end_version: int | None = None
    ) -> DataFrame:
        """Change data feed rows of versions ``start_version..end_version`` (inclusive) as a DataFrame.

        See :meth:`changes_arrow`; the rows are read on the driver by delta-rs (no Delta jars).
        """
        return spark.createDataFrame(self.changes_arrow(start_version, end_version))


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


class VersionIndex:
    """One version of a keyed table, ordered for chunk reads: by vnode, then primary key within a vnode.

    The table-backfill modules read a vnode's next rows above a position (``chunk``); the index sorts
    once (pyarrow) and finds each vnode's run and the position in it by bisection. A null or repeated
    primary key is refused: the modules' positions need a key that orders every row.
    """

    def __init__(self, rows: pa.Table, primary_key: Sequence[str], vnode_count: int) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from source_backfill.core.vnode import key_vnodes

        missing = [k for k in primary_key if k not in rows.column_names]
        if missing or not primary_key:
            msg = f"primary key columns {list(primary_key)} are not all in the table ({rows.column_names})"
            raise DeltaSinkError(msg)
        for k in primary_key:  # positions travel as JSON and compare as Python values: ints and strings
            kind = rows.schema.field(k).type
            if not (pa.types.is_integer(kind) or pa.types.is_string(kind)):
                msg = f"primary key column {k} is {kind}: the table-backfill modules need integer or string"
                msg += " keys"
                raise DeltaSinkError(msg)
        if any(rows.column(k).null_count for k in primary_key):
            msg = f"the table has rows with a null primary key ({', '.join(primary_key)})"
            raise DeltaSinkError(msg)
        if len(primary_key) == 1 and pa.types.is_integer(rows.schema.field(primary_key[0]).type):
            columns = [rows.column(primary_key[0]).to_numpy()]
        else:
            columns = [rows.column(k).to_pylist() for k in primary_key]
        vnodes = pa.array(key_vnodes(columns, vnode_count), pa.int32())
        order = pc.sort_indices(
            rows.append_column("__vnode", vnodes),
            sort_keys=[("__vnode", "ascending"), *((k, "ascending") for k in primary_key)],
        )
        self.rows = rows.take(order)
        n = self.rows.num_rows
        if n > 1:  # sorted by (vnode, key): a repeated key sits next to itself
            same = None
            for k in primary_key:
                col = self.rows.column(k)
                eq = pc.equal(col.slice(1), col.slice(0, n - 1))
                same = eq if same is None else pc.and_(same, eq)
            if pc.any(same).as_py():
                msg = f"the table has rows with the same primary key ({', '.join(primary_key)})"
                raise DeltaSinkError(msg)
        self._vnodes = np.asarray(vnodes.take(order))
        #: The sorted keys: one integer column as numpy (bisected in numpy), else a list of tuples.
        self._ints = columns[0][np.asarray(order)] if isinstance(columns[0], np.ndarray) else None
        self._tuples: list[tuple[Any, ...]] | None = None
        if self._ints is None:
            self._tuples = list(zip(*(self.rows.column(k).to_pylist() for k in primary_key), strict=True))
        self._bounds = np.searchsorted(self._vnodes, np.arange(vnode_count + 1), side="left")

    def key(self, position: int) -> tuple[Any, ...]:
        """The primary key of the row at ``position`` in :attr:`rows`."""
        if self._ints is not None:
            return (int(self._ints[position]),)
        assert self._tuples is not None
        return self._tuples[position]

    def keys_at(self, positions: range) -> Sequence[tuple[Any, ...]]:
        """The keys of the rows at ``positions`` (built as they are asked for)."""
        return _Keys(self, positions)

    def chunk(self, vnode: int, after: tuple[Any, ...] | None, rows: int) -> range:
        """Positions in :attr:`rows` of the first ``rows`` rows of ``vnode`` with a key above ``after``."""
        import numpy as np

        lo, hi = int(self._bounds[vnode]), int(self._bounds[vnode + 1])
        if after is None:
            start = lo
        elif self._ints is not None:
            start = lo + int(np.searchsorted(self._ints[lo:hi], after[0], side="right"))
        else:
            assert self._tuples is not None
            start = bisect.bisect_right(self._tuples, tuple(after), lo, hi)
        return range(start, min(hi, start + rows))


class _Keys(Sequence[tuple[Any, ...]]):
    """Keys of a run of an index's rows, built one at a time (a chunk's progress needs its last one)."""

    def __init__(self, index: VersionIndex, positions: range) -> None:
        self._index, self._positions = index, positions

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._index.key(p) for p in self._positions[i]]
        return self._index.key(self._positions[i])
