"""The Delta table source: snapshots at a version and the change feed, read without Delta jars."""

from __future__ import annotations

import pytest

from connectors.delta import DeltaTableSource
from source_backfill.errors import DeltaSinkError

pytestmark = pytest.mark.integration


def test_old_version_and_change_feed_return_exactly_the_changes(spark, sink_factory, rows, tmp_path):
    s = sink_factory()
    s.commit_epoch(1, rows([1, 2]), {})
    s.commit_epoch(2, rows([3]), {})
    s.commit_epoch(3, None, {})  # a state-only commit: a version without changes
    s.commit_epoch(4, rows([4, 5]), {})
    src = DeltaTableSource(str(tmp_path / "t"))
    assert src.latest_version() == 4  # version 0 created the table
    assert src.read_snapshot(spark, version=0).count() == 0
    assert sorted(r.id for r in src.read_snapshot(spark, version=2).collect()) == [1, 2, 3]
    assert sorted(r.id for r in src.read_snapshot(spark).collect()) == [1, 2, 3, 4, 5]
    changes = src.read_changes(spark, 2, 4)
    assert {"_change_type", "_commit_version", "_commit_timestamp"} <= set(changes.columns)
    assert sorted((r.id, r.name, r._change_type, r._commit_version) for r in changes.collect()) == [
        (3, "n3", "insert", 2), (4, "n4", "insert", 4), (5, "n5", "insert", 4)]
    assert src.read_changes(spark, 3, 3).count() == 0
    nothing_new = src.read_changes(spark, 5)
    assert nothing_new.count() == 0 and nothing_new.schema == changes.schema  # same columns and types
    assert src.changes_arrow(3, 2).num_rows == 0  # the empty range right after version 2: nothing new
    with pytest.raises(DeltaSinkError, match="bad change feed range"):
        src.changes_arrow(3, 1)


def test_snapshot_of_a_partitioned_table(spark, sink_factory, rows, tmp_path):
    sink_factory(partition_by=["name"]).commit_epoch(1, rows([1, 2]), {})
    snap = DeltaTableSource(str(tmp_path / "t")).read_snapshot(spark)
    assert sorted((r.id, r.name) for r in snap.collect()) == [(1, "n1"), (2, "n2")]


def test_tables_spark_cannot_read_from_parquet_alone_are_refused(tmp_path):
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "dv")
    write_deltalake(path, pa.table({"id": [1]}), configuration={"delta.enableDeletionVectors": "true"})
    if "deletionVectors" not in (DeltaTable(path).protocol().reader_features or []):
        pytest.skip("this delta-rs does not enable deletion vectors on request")
    with pytest.raises(DeltaSinkError, match="deletion vectors"):
        DeltaTableSource(path).latest_version()


def test_a_missing_table_is_a_clear_error(tmp_path):
    with pytest.raises(DeltaSinkError, match="no Delta table at"):
        DeltaTableSource(str(tmp_path / "nope")).latest_version()
