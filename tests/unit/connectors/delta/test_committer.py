"""The sink's committers: which one a writer and mode get, and each on a small real table (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from connectors.delta.append import DeltaRsAppend
from connectors.delta.log import KEY_ATTEMPT, KEY_STATE
from connectors.delta.maintenance import MARKER, STAGING
from connectors.delta.merge import CHANGE_TYPE, DeltaRsMerge
from connectors.delta.sink import DeltaEpochSink
from connectors.delta.spark_writer import DeltaSparkAppend
from source_backfill.errors import DeltaSinkError

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
CHANGES = pa.schema([*SCHEMA, (CHANGE_TYPE, pa.string())])


def rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


def changes(*items: tuple[int, str]) -> pa.Table:
    ids = [i for i, _ in items]
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids], CHANGE_TYPE: [c for _, c in items]},
                    schema=CHANGES)


def table_ids(path: Path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


@pytest.fixture
def sink(tmp_path):
    def make(**kw):
        schema = CHANGES if kw.get("mode") == "merge" else SCHEMA
        kw.setdefault("key_columns", ("id",) if kw.get("mode") == "merge" else ())
        return DeltaEpochSink(str(tmp_path / "t"), "job", schema, **kw)

    return make


class _SparkLike:
    """Stands in for a Spark DataFrame where only its kind matters (no session is asked)."""


@pytest.mark.parametrize(("mode", "writer", "chain"), [
    ("append", "delta-rs", (DeltaRsAppend,)),
    ("append", "delta-spark", (DeltaSparkAppend, DeltaRsAppend)),
    ("merge", "delta-rs", (DeltaRsMerge, DeltaRsAppend)),
    ("merge", "delta-spark", (DeltaRsMerge, DeltaSparkAppend, DeltaRsAppend)),
])
def test_the_committers_are_chosen_once_from_mode_and_writer(sink, mode, writer, chain):
    s = sink(mode=mode, writer=writer)
    assert tuple(type(c) for c in s.committers) == chain
    assert s.committer is s.committers[0]
    assert s.writes_before_commit() == (chain[0] is DeltaRsAppend)


def test_each_epoch_goes_to_the_first_committer_that_takes_its_rows(sink):
    merge = sink(mode="merge", writer="delta-spark")
    merge.committers[1].available = True  # delta-spark's jars load (not asked of a session here)
    assert isinstance(merge.committer_for(changes((1, "insert"))), DeltaRsMerge)
    assert isinstance(merge.committer_for(None), DeltaRsMerge)
    # new keys only: appended instead of merged, by delta-spark for a DataFrame, else delta-rs
    assert isinstance(merge.committer_for(_SparkLike(), new_keys_only=True), DeltaSparkAppend)
    assert isinstance(merge.committer_for(rows([1]), new_keys_only=True), DeltaRsAppend)
    spark = sink(writer="delta-spark")
    spark.committer.available = True
    assert isinstance(spark.committer_for(_SparkLike()), DeltaSparkAppend)
    assert isinstance(spark.committer_for(rows([1])), DeltaRsAppend)  # rows on the driver
    assert isinstance(spark.committer_for(None), DeltaRsAppend)  # a state-only commit


def test_delta_spark_without_its_jars_is_refused_before_anything_is_written(sink, tmp_path):
    s = sink(writer="delta-spark")
    s.committer.available = False
    with pytest.raises(DeltaSinkError, match="jars are not on Spark's classpath"):
        s.commit_epoch(1, _SparkLike(), {"e": 1})
    assert s.committed_epoch() is None
    assert not (tmp_path / "t" / STAGING).exists()


def test_append_commits_each_epoch_once_with_its_state(sink, tmp_path):
    s = sink()
    first = s.commit_epoch(1, rows([1, 2]), {"e": 1}, {"plan": 1})
    assert (first.committed, first.version, first.files, first.rows) == (True, 1, 1, 2)
    assert not s.commit_epoch(1, rows([99]), {"e": 99}).committed  # a replay
    assert s.commit_epoch(2, None, {"e": 2}).committed  # no rows: still the state
    got = sink().recover()
    assert (got.epoch, got.state, got.plan) == (2, {"e": 2}, None)
    assert table_ids(tmp_path / "t") == [1, 2]
    assert not any(f.name == MARKER for f in (tmp_path / "t" / STAGING).rglob("*"))  # sealed


def test_a_deferred_state_is_taken_after_the_write_and_staged_files_join_the_commit(sink, tmp_path):
    s = sink()
    ahead = s.stage_files(lambda folder: pq.write_table(rows([10, 11]), folder / "part-0.parquet"), 0)

    def state():  # what the write observed, before the commit
        files = len(list((tmp_path / "t" / STAGING).rglob("*.parquet")))
        return {"files": files, "committed": s.committed_epoch()}

    result = s.commit_epoch(1, rows([1]), state, staged=[ahead])
    assert (result.files, result.rows) == (2, 3)
    assert not ahead.folder.exists()  # moved into the attempt
    assert s.recover().state == {"files": 2, "committed": None}
    assert table_ids(tmp_path / "t") == [1, 10, 11]


def test_merge_applies_the_last_change_per_key_and_new_keys_only_appends(sink, tmp_path):
    s = sink(mode="merge")
    assert CHANGE_TYPE not in s.arrow_schema.names
    inserted = s.commit_epoch(1, changes((1, "insert"), (2, "insert")), {"e": 1}, new_keys_only=True)
    assert (inserted.files, inserted.rows) == (1, 2)  # appended as files
    merged = s.commit_epoch(2, changes((1, "delete"), (3, "insert"), (3, "update_preimage"),
                                       (2, "delete"), (2, "insert")), {"e": 2})
    assert merged.committed and (merged.files, merged.rows) == (0, 3)  # last per key: 1, 3, 2
    assert table_ids(tmp_path / "t") == [2, 3]
    assert s.commit_epoch(3, None, {"e": 3}).committed  # an empty merge: state only
    assert s.recover().state == {"e": 3}
    with pytest.raises(DeltaSinkError, match="deferred state"):
        s.commit_epoch(4, None, dict)


def test_a_failed_commit_removes_its_attempt_and_one_that_landed_keeps_it(sink, tmp_path, monkeypatch):
    s = sink()
    s.commit_epoch(1, rows([1]), {"e": 1})
    real = DeltaRsAppend._append

    def crash(*_a, **_k):
        raise RuntimeError("killed before commit")

    monkeypatch.setattr(DeltaRsAppend, "_append", crash)
    with pytest.raises(RuntimeError, match="killed before commit"):
        s.commit_epoch(2, rows([2]), {"e": 2})
    assert [f.name.split("-")[0] for f in (tmp_path / "t" / STAGING).iterdir()] == ["1"]

    def commit_then_fail(self, *args):
        real(self, *args)
        raise OSError("post-commit step failed")

    monkeypatch.setattr(DeltaRsAppend, "_append", commit_then_fail)
    result = s.commit_epoch(2, rows([2]), {"e": 2})
    assert (result.committed, result.version, result.files) == (True, 2, -1)
    monkeypatch.undo()
    assert table_ids(tmp_path / "t") == [1, 2]
    commit = s.read_commit(2)
    assert commit is not None and json.loads(commit[KEY_STATE]) == {"e": 2}
    assert (tmp_path / "t" / STAGING / commit[KEY_ATTEMPT]).is_dir()


def test_only_files_with_the_table_s_columns_are_staged_whole_linked_or_else_copied(sink, tmp_path,
                                                                                     monkeypatch):
    import os

    s = sink()
    same, other = tmp_path / "same.parquet", tmp_path / "other.parquet"
    pq.write_table(rows([20, 21]), same)
    pq.write_table(rows([30]).cast(pa.schema([("id", pa.int32()), ("name", pa.string())])), other)
    assert s.staging.takes_whole([same, other]) == [same]  # another type: not the table's file
    staged = s.stage_files(lambda folder: s.staging.link_files([same], folder), 0)
    (linked,) = staged.folder.glob("*.parquet")
    assert linked.stat().st_ino == same.stat().st_ino  # the same bytes, no copy
    s.commit_epoch(1, rows([1]), {}, staged=[staged])
    assert table_ids(tmp_path / "t") == [1, 20, 21]
    assert same.exists()  # the other name stays

    def no_link(*_):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)  # another filesystem: copied instead
    folder = tmp_path / "copies"
    folder.mkdir()
    assert s.staging.link_files([same], folder) == same.stat().st_size
    (copy,) = folder.glob("*.parquet")
    assert copy.stat().st_ino != same.stat().st_ino and copy.read_bytes() == same.read_bytes()
    parted = DeltaEpochSink(str(tmp_path / "p"), "job", SCHEMA, partition_by=("name",))
    assert parted.staging.takes_whole([same]) == []  # a partitioned table's files lack its columns
