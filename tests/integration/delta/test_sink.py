"""The exactly-once epoch sink and the table source, on real Delta tables written by real Spark."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable

from connectors.delta import DeltaEpochSink, DeltaTableSource, delta_spark_available
from connectors.delta.sink import KEY_JOB, STAGING
from source_backfill.errors import ForeignTableError, StateFormatError

pytestmark = pytest.mark.integration

SCHEMA = "id long, name string"


def rows(spark, ids):
    return spark.createDataFrame([(i, f"n{i}") for i in ids], SCHEMA)


def sink(spark, path, job="job", **kw):
    return DeltaEpochSink(str(path), job, spark.createDataFrame([], SCHEMA).schema, **kw)


def ids(path):
    return sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def staged_files(path):
    staging = Path(path) / STAGING
    return sorted(p for p in staging.rglob("*.parquet")) if staging.exists() else []


def test_replaying_an_epoch_any_number_of_times_leaves_the_table_unchanged(spark, tmp_path):
    s = sink(spark, tmp_path / "t")
    first = s.commit_epoch(1, rows(spark, range(10)), {"n": 1})
    assert first.committed and first.rows == 10
    version = DeltaTable(str(tmp_path / "t")).version()
    for _ in range(3):
        again = sink(spark, tmp_path / "t").commit_epoch(1, rows(spark, range(100, 120)), {"n": 99})
        assert not again.committed
    assert DeltaTable(str(tmp_path / "t")).version() == version
    assert ids(tmp_path / "t") == list(range(10))
    assert s.recover().state == {"n": 1}


def test_crash_between_file_write_and_commit_leaves_nothing_visible_and_is_cleaned(
    spark, tmp_path, monkeypatch
):
    path = tmp_path / "t"
    s = sink(spark, path)
    s.commit_epoch(1, rows(spark, [1]), {"e": 1})

    def crash(*_a, **_k):
        raise RuntimeError("killed before commit")

    monkeypatch.setattr(DeltaEpochSink, "_commit", crash)
    with pytest.raises(RuntimeError):
        s.commit_epoch(2, rows(spark, [2, 3]), {"e": 2})
    monkeypatch.undo()
    assert ids(path) == [1]
    # a hard crash (no cleanup ran) leaves an attempt folder behind: the next sink removes it
    orphan = Path(path) / STAGING / "2-deadbeef"
    orphan.mkdir(parents=True)
    (orphan / "part-0.parquet").write_bytes(b"junk")
    retry = sink(spark, path)
    assert not orphan.exists()
    assert retry.commit_epoch(2, rows(spark, [2, 3]), {"e": 2}).committed
    assert ids(path) == [1, 2, 3]
    referenced = {Path(u) for u in DeltaTable(str(path)).file_uris()}
    assert set(staged_files(path)) == referenced  # no leftover files


def test_state_read_back_equals_state_committed(spark, tmp_path):
    split = {"stage": "backfilling", "offset": 41, "rows": [1, 2, {"x": None}]}
    state = {"version": 1, "splits": {"t:0": split}}
    plan = {"budget": 100, "end": {"t:0": 50}}
    s = sink(spark, tmp_path / "t")
    s.commit_epoch(7, rows(spark, [1]), state, plan)
    got = sink(spark, tmp_path / "t").recover()
    assert (got.epoch, got.state, got.plan) == (7, state, plan)


def test_empty_epoch_commits_its_state(spark, tmp_path):
    s = sink(spark, tmp_path / "t")
    assert s.commit_epoch(1, None, {"a": 1}).committed
    assert s.commit_epoch(2, rows(spark, []), {"a": 2}).committed
    assert s.recover().state == {"a": 2}
    assert s.committed_epoch() == 2
    assert ids(tmp_path / "t") == []


def test_concurrent_duplicate_commits_resolve_to_one(spark, tmp_path):
    path = tmp_path / "t"
    sink(spark, path).commit_epoch(1, None, {"e": 1})
    results = []
    sinks = [sink(spark, path) for _ in range(2)]
    barrier = threading.Barrier(2)

    def commit(s, base):
        df = rows(spark, range(base, base + 5))
        barrier.wait()
        results.append(s.commit_epoch(2, df, {"by": base}))

    threads = [threading.Thread(target=commit, args=(s, 100 * (i + 1))) for i, s in enumerate(sinks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.committed for r in results) == [False, True]
    got = ids(path)
    assert len(got) == 5 and (got == list(range(100, 105)) or got == list(range(200, 205)))
    referenced = {Path(u) for u in DeltaTable(str(path)).file_uris()}
    assert set(staged_files(path)) == referenced  # the loser's files are gone


def test_a_table_of_another_job_is_refused(spark, tmp_path):
    sink(spark, tmp_path / "t", job="owner").commit_epoch(1, rows(spark, [1]), {"a": 1})
    with pytest.raises(ForeignTableError, match='belongs to job "owner"'):
        sink(spark, tmp_path / "t", job="intruder").recover()


def test_malformed_state_metadata_is_refused(spark, tmp_path):
    from deltalake.transaction import CommitProperties, Transaction

    s = sink(spark, tmp_path / "t")
    s.commit_epoch(1, None, {"a": 1})
    DeltaTable(str(tmp_path / "t")).create_write_transaction(
        [], mode="append", schema=s.arrow_schema,
        commit_properties=CommitProperties(custom_metadata={KEY_JOB: "job", "source_backfill.state": "{oops"},
                                           app_transactions=[Transaction("job", 2)]),
    )
    with pytest.raises(StateFormatError, match="not valid JSON"):
        s.recover()


def test_old_version_and_change_feed_return_exactly_the_changes(spark, tmp_path):
    path = tmp_path / "t"
    s = sink(spark, path)
    s.commit_epoch(1, rows(spark, [1, 2]), {})
    s.commit_epoch(2, rows(spark, [3]), {})
    s.commit_epoch(3, rows(spark, [4, 5]), {})
    src = DeltaTableSource(str(path))
    latest = src.latest_version()
    assert latest == 3  # version 0 created the table
    old = src.read_snapshot(spark, version=2)
    assert sorted(r.id for r in old.collect()) == [1, 2, 3]
    assert sorted(r.id for r in src.read_snapshot(spark).collect()) == [1, 2, 3, 4, 5]
    changes = src.read_changes(spark, 2, 3).collect()
    assert sorted((r.id, r._change_type, r._commit_version) for r in changes) == [
        (3, "insert", 2), (4, "insert", 3), (5, "insert", 3)]
    assert src.read_snapshot(spark, version=0).count() == 0


def test_table_written_by_delta_rs_reads_back_through_spark_without_delta_jars(spark, tmp_path):
    path = tmp_path / "t"
    s = sink(spark, path, partition_by=["name"])
    s.commit_epoch(1, rows(spark, [1, 2, 3]), {})
    files = DeltaTable(str(path)).file_uris()
    back = spark.read.option("basePath", str(path)).parquet(*files)
    assert sorted((r.id, r.name) for r in back.collect()) == [(1, "n1"), (2, "n2"), (3, "n3")]


def test_merge_mode_applies_upserts_and_deletes(spark, tmp_path):
    schema = "id long, name string, _change_type string"
    path = tmp_path / "m"
    s = DeltaEpochSink(str(path), "m", spark.createDataFrame([], schema).schema, mode="merge",
                       key_columns=["id"])
    s.commit_epoch(1, spark.createDataFrame([(1, "a", "insert"), (2, "b", "insert")], schema), {})
    s.commit_epoch(2, spark.createDataFrame(
        [(1, "a", "update_preimage"), (1, "A", "update_postimage"), (2, "b", "delete"), (3, "c", "insert")],
        schema), {"e": 2})
    s.commit_epoch(2, spark.createDataFrame([(9, "z", "insert")], schema), {})  # replay: skipped
    table = DeltaTable(str(path)).to_pyarrow_table()
    assert sorted(zip(table.column("id").to_pylist(), table.column("name").to_pylist(), strict=True)) == [
        (1, "A"), (3, "c")]
    assert s.recover().state == {"e": 2}


def test_a_checkpoint_is_written_every_n_commits(spark, tmp_path):
    s = sink(spark, tmp_path / "t", checkpoint_interval=3)
    for e in range(1, 5):
        s.commit_epoch(e, None, {"e": e})
    assert list((tmp_path / "t" / "_delta_log").glob("*.checkpoint.parquet"))
    assert s.recover().state == {"e": 4}


def test_delta_spark_writer(spark, tmp_path):
    if not delta_spark_available(spark):
        pytest.skip("delta-spark's jars are not on Spark's classpath here (Maven is unreachable); "
                    "the container image can bake them")
    s = sink(spark, tmp_path / "t", writer="delta-spark")
    s.commit_epoch(1, rows(spark, [1]), {"a": 1})
    assert s.recover().state == {"a": 1}
