"""The exactly-once epoch sink on real Delta tables written by real Spark (delta-rs and delta-spark)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrameWriter

from connectors.delta import delta_spark_available
from connectors.delta.append import DeltaRsAppend
from connectors.delta.log import KEY_EPOCH, KEY_JOB, KEY_STATE
from connectors.delta.maintenance import MARKER, STAGING
from source_backfill.errors import DeltaSinkError, ForeignTableError, StateFormatError
from tests.integration.delta.conftest import attempt_files, referenced_files, table_ids

pytestmark = pytest.mark.integration


def test_replaying_an_epoch_any_number_of_times_leaves_the_table_unchanged(sink_factory, rows, tmp_path):
    s = sink_factory()
    first = s.commit_epoch(1, rows(range(10)), {"n": 1})
    assert first.committed and first.rows == 10 and first.version == 1
    s.commit_epoch(2, rows([10]), {"n": 2})
    version = DeltaTable(str(tmp_path / "t")).version()
    for epoch in (1, 2, 1, 2):
        again = sink_factory().commit_epoch(epoch, rows(range(100, 120)), {"n": 99})
        assert not again.committed and again.version is None
        assert not s.commit_epoch(epoch, None, {"n": 99}).committed
    assert DeltaTable(str(tmp_path / "t")).version() == version
    assert table_ids(tmp_path / "t") == list(range(11))
    assert s.recover().state == {"n": 2}
    assert attempt_files(tmp_path / "t") == referenced_files(tmp_path / "t")


def test_crash_between_file_write_and_commit_leaves_nothing_visible_and_is_cleaned(
    sink_factory, rows, tmp_path, monkeypatch
):
    path = tmp_path / "t"
    s = sink_factory()
    s.commit_epoch(1, rows([1]), {"e": 1})

    def crash(*_a, **_k):
        raise RuntimeError("killed before commit")

    monkeypatch.setattr(DeltaRsAppend, "_append", crash)
    with pytest.raises(RuntimeError, match="killed before commit"):
        s.commit_epoch(2, rows([2, 3]), {"e": 2})
    monkeypatch.undo()
    assert table_ids(path) == [1]
    assert attempt_files(path) == referenced_files(path)  # the failed attempt removed its files
    # a hard crash (no cleanup ran) leaves an attempt folder: the next sink removes it, and only it
    orphan = Path(path) / STAGING / "2-deadbeef"
    orphan.mkdir(parents=True)
    (orphan / "part-0.parquet").write_bytes(b"junk")
    committed_before = referenced_files(path)
    retry = sink_factory()
    assert not orphan.exists()
    assert all(f.exists() for f in committed_before)
    assert retry.commit_epoch(2, rows([2, 3]), {"e": 2}).committed
    assert table_ids(path) == [1, 2, 3]
    assert attempt_files(path) == referenced_files(path)  # no leftover files
    assert retry.recover().state == {"e": 2}


def test_orphans_of_committed_epochs_are_removed_by_the_log_and_committed_files_kept(
    sink_factory, rows, tmp_path
):
    path = tmp_path / "t"
    sink_factory().commit_epoch(1, rows([1, 2]), {"e": 1})
    staging = Path(path) / STAGING
    (committed,) = list(staging.iterdir())
    assert not (committed / MARKER).exists()  # sealed right after its commit
    (committed / MARKER).touch()  # as if the process died between commit and sealing
    loser = staging / "1-0badc0ffee"  # a losing duplicate killed before its own cleanup
    loser.mkdir()
    (loser / MARKER).touch()
    (loser / "part-0.parquet").write_bytes(b"junk")
    unknown = staging / "1-nomarker"  # no marker: not provably an attempt in flight, left to vacuum
    unknown.mkdir()
    before = referenced_files(path)
    sink_factory()
    assert not loser.exists()
    assert committed.exists() and not (committed / MARKER).exists()
    assert unknown.exists()
    assert all(f.exists() for f in before) and table_ids(path) == [1, 2]


def test_a_failure_after_the_commit_landed_keeps_the_committed_files(
    sink_factory, rows, tmp_path, monkeypatch
):
    real = DeltaRsAppend._append

    def commit_then_fail(self, *args):
        real(self, *args)
        raise OSError("post-commit step failed")

    s = sink_factory()
    monkeypatch.setattr(DeltaRsAppend, "_append", commit_then_fail)
    result = s.commit_epoch(1, rows([1, 2]), {"e": 1})
    monkeypatch.undo()
    assert result.committed and result.version == 1
    assert table_ids(tmp_path / "t") == [1, 2]  # files still there: readable
    assert all(f.exists() for f in referenced_files(tmp_path / "t"))
    assert s.commit_epoch(2, rows([3]), {"e": 2}).committed


def _then_swept(write, sink_factory):
    """``write``, then a second writer of the job starts: its sweep removes the in-flight attempt."""
    def wrapped(*a, **k):
        write(*a, **k)
        sink_factory()

    return wrapped


def test_an_attempt_swept_while_being_written_is_never_committed(
    spark, sink_factory, rows, tmp_path, monkeypatch
):
    s = sink_factory()
    s.commit_epoch(1, rows([1]), {"e": 1})
    monkeypatch.setattr(DataFrameWriter, "parquet", _then_swept(DataFrameWriter.parquet, sink_factory))
    with pytest.raises(DeltaSinkError, match="orphan sweep"):
        s.commit_epoch(2, rows([2]), {"e": 2})
    monkeypatch.undo()
    assert table_ids(tmp_path / "t") == [1]
    assert s.committed_epoch() == 1


def test_rows_on_the_driver_are_one_file_counted_in_its_add_action_and_a_sweep_still_refuses_them(
    sink_factory, tmp_path, monkeypatch
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    s = sink_factory()
    result = s.commit_epoch(1, pa.Table.from_pylist([{"id": i} for i in (1, 2, 3)], schema=s.arrow_schema),
                            {"e": 1})
    assert result.committed and result.rows == 3 and result.files == 1
    actions = DeltaTable(str(tmp_path / "t")).get_add_actions(flatten=True)
    assert actions.column("num_records").to_pylist() == [3]
    assert table_ids(tmp_path / "t") == [1, 2, 3]
    monkeypatch.setattr(pq, "write_table", _then_swept(pq.write_table, sink_factory))
    with pytest.raises(DeltaSinkError, match="orphan sweep"):
        s.commit_epoch(2, pa.Table.from_pylist([{"id": 4}], schema=s.arrow_schema), {"e": 2})
    monkeypatch.undo()
    assert table_ids(tmp_path / "t") == [1, 2, 3]
    assert s.committed_epoch() == 1


def test_state_read_back_equals_state_committed(sink_factory, rows):
    split = {"stage": "backfilling", "offset": 2**40 + 1, "rows": [1, 2, {"x": None}], "done": False}
    state = {"version": 1, "splits": {"t:0": split, "t:1": {"stage": "finished", "offset": None}}}
    plan = {"budget": 100, "end": {"t:0": 50}}
    sink_factory().commit_epoch(7, rows([1]), state, plan)
    got = sink_factory().recover()
    assert (got.epoch, got.state, got.plan, got.version) == (7, state, plan, 1)
    assert sink_factory(name="new").recover() is None


def test_a_deferred_state_is_taken_after_the_rows_are_written_and_commits_with_them(
    sink_factory, rows, tmp_path
):
    s = sink_factory()
    seen = []

    def state():
        seen.append(sorted(p.name for p in attempt_files(tmp_path / "t")))
        return {"written": len(seen[-1])}

    result = s.commit_epoch(1, rows([1, 2, 3]), state)
    assert result.committed and len(seen) == 1 and seen[0]  # called once, with the files on disk
    assert s.recover().state == {"written": len(seen[0])}
    assert table_ids(tmp_path / "t") == [1, 2, 3]
    replay = s.commit_epoch(1, rows([9]), lambda: pytest.fail("a replayed epoch takes no state"))
    assert replay.committed is False


def test_a_deferred_state_is_refused_where_the_commit_is_the_write(sink_factory, rows):
    s = sink_factory(mode="merge", key_columns=["id"])
    assert not s.writes_before_commit()
    with pytest.raises(DeltaSinkError, match="deferred state"):
        s.commit_epoch(1, rows([1]), lambda: {"a": 1})


def test_empty_epoch_commits_its_state(sink_factory, rows, tmp_path):
    s = sink_factory()
    first = s.commit_epoch(1, None, {"a": 1})
    assert first.committed and (first.files, first.rows) == (0, 0)
    assert s.commit_epoch(2, rows([]), {"a": 2}).committed
    assert s.recover().state == {"a": 2}
    assert s.committed_epoch() == 2
    assert table_ids(tmp_path / "t") == []


def test_concurrent_duplicate_commits_resolve_to_one(spark, sink_factory, rows, tmp_path):
    path = tmp_path / "t"
    sink_factory().commit_epoch(1, None, {"e": 1})
    results = []
    sinks = [sink_factory() for _ in range(2)]
    barrier = threading.Barrier(2)

    def commit(s, base):
        df = rows(range(base, base + 5))
        barrier.wait()
        results.append(s.commit_epoch(2, df, {"by": base}))

    threads = [threading.Thread(target=commit, args=(s, 100 * (i + 1))) for i, s in enumerate(sinks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.committed for r in results) == [False, True]
    got = table_ids(path)
    winner = 100 if got == list(range(100, 105)) else 200
    assert got == list(range(winner, winner + 5))
    assert sinks[0].recover().state == {"by": winner}  # the state is the winner's, with its rows
    assert attempt_files(path) == referenced_files(path)  # the loser's files are gone
    assert DeltaTable(str(path)).version() == 2


def test_a_table_of_another_job_is_refused_and_left_untouched(sink_factory, rows, tmp_path):
    owner = sink_factory(job="owner")
    owner.commit_epoch(1, rows([1]), {"a": 1})
    files = referenced_files(tmp_path / "t")
    # refused before its orphan sweep: the owner's committed attempt would look like one above the
    # intruder's (missing) committed epoch
    with pytest.raises(ForeignTableError, match=r'/t belongs to job "owner", not "intruder"'):
        sink_factory(job="intruder")
    assert all(f.exists() for f in files) and table_ids(tmp_path / "t") == [1]
    assert owner.recover().state == {"a": 1}
    (tmp_path / "t" / STAGING).rename(tmp_path / "away")  # no attempt folders: refused on first use
    intruder = sink_factory(job="intruder")
    with pytest.raises(ForeignTableError):
        intruder.recover()
    with pytest.raises(ForeignTableError):
        intruder.commit_epoch(1, None, {"a": 2})


def test_a_table_with_other_columns_is_refused(sink_factory, rows):
    sink_factory().commit_epoch(1, rows([1]), {})
    with pytest.raises(DeltaSinkError, match="has columns"):
        sink_factory(schema="id long, other string").commit_epoch(2, None, {})


@pytest.mark.parametrize(
    ("metadata", "error"),
    [
        ({KEY_JOB: "job", KEY_STATE: "{oops"}, "not valid JSON"),
        ({KEY_JOB: "job", KEY_STATE: "[1, 2]"}, "not a JSON object"),
        ({KEY_JOB: "job"}, "not valid JSON"),
        ({KEY_JOB: "job", KEY_EPOCH: "5", KEY_STATE: "{}"}, "last state says epoch 5"),
    ],
)
def test_malformed_state_metadata_is_refused(sink_factory, metadata, error):
    from deltalake.transaction import CommitProperties, Transaction

    s = sink_factory()
    s.commit_epoch(1, None, {"a": 1})
    DeltaTable(s.path).create_write_transaction(
        [], mode="append", schema=s.arrow_schema,
        commit_properties=CommitProperties(custom_metadata=metadata,
                                           app_transactions=[Transaction("job", 2)]),
    )
    with pytest.raises(StateFormatError, match=error) as info:
        s.recover()
    assert s.path in str(info.value)


def test_partition_values_are_committed_unescaped_and_types_conformed(spark, sink_factory, tmp_path):
    s = sink_factory(partition_by=["name"])
    df = spark.createDataFrame([(1, "a b"), (2, "x:y/z%"), (3, None)], "id int, name string")
    assert s.commit_epoch(1, df, {}).rows == 3
    table = DeltaTable(str(tmp_path / "t"))
    got = table.to_pyarrow_table()
    assert sorted(zip(got.column("id").to_pylist(), got.column("name").to_pylist(), strict=True),
                  key=lambda r: r[0]) == [(1, "a b"), (2, "x:y/z%"), (3, None)]
    logged = table.get_add_actions(flatten=False).column("partition").to_pylist()
    assert {p["name"] for p in logged} == {"a b", "x:y/z%", None}


def test_table_written_by_delta_rs_reads_back_through_spark_without_delta_jars(spark, sink_factory, rows,
                                                                               tmp_path):
    path = tmp_path / "t"
    s = sink_factory(partition_by=["name"])
    s.commit_epoch(1, rows([1, 2, 3]), {})
    files = DeltaTable(str(path)).file_uris()
    back = spark.read.option("basePath", str(path)).parquet(*files)
    assert sorted((r.id, r.name) for r in back.collect()) == [(1, "n1"), (2, "n2"), (3, "n3")]


@pytest.mark.parametrize("writer", ["delta-rs", "delta-spark"])
def test_both_writers_keep_the_exactly_once_protocol(spark, sink_factory, rows, tmp_path, writer):
    """Either writer: a replayed epoch is skipped, the job's state is in the epoch's own commit, and the
    table is the same Delta table (delta-rs reads what delta-spark wrote and the other way round)."""
    import json

    assert delta_spark_available(spark)  # the jars come with every session (connectors/jars.py)
    path = tmp_path / "t"
    s = sink_factory(writer=writer)
    assert s.commit_epoch(1, rows([1, 2]), {"a": 1}).committed
    assert s.commit_epoch(2, rows([3]), {"a": 2}).committed
    for epoch in (1, 2):  # replays: nothing written, state unchanged
        assert not sink_factory(writer=writer).commit_epoch(epoch, rows([99]), {"a": 99}).committed
    assert table_ids(path) == [1, 2, 3]
    assert sorted(r.id for r in spark.read.format("delta").load(str(path)).collect()) == [1, 2, 3]
    # the state travels in the commit that added the epoch's rows
    history = {h["version"]: h for h in DeltaTable(str(path)).history()}
    last = history[DeltaTable(str(path)).version()]
    meta = json.loads(last["userMetadata"]) if writer == "delta-spark" else last
    assert meta[KEY_JOB] == "job" and int(meta[KEY_EPOCH]) == 2
    assert json.loads(meta[KEY_STATE]) == {"a": 2}
    assert sink_factory(writer=writer).recover().state == {"a": 2}
    # the other writer takes over the same table and its protocol
    other = "delta-rs" if writer == "delta-spark" else "delta-spark"
    assert not sink_factory(writer=other).commit_epoch(2, rows([98]), {"a": 98}).committed
    assert sink_factory(writer=other).commit_epoch(3, rows([4]), {"a": 3}).committed
    assert table_ids(path) == [1, 2, 3, 4]
    assert sink_factory(writer=writer).recover().state == {"a": 3}


def test_delta_spark_writer_refused_without_its_jars(spark, sink_factory, rows):
    s = sink_factory(writer="delta-spark")
    s.committer.available = False  # what a session without the jars finds (delta_spark_available)
    with pytest.raises(DeltaSinkError, match="jars are not on Spark's classpath"):
        s.commit_epoch(1, rows([1]), {})


def _stage(sink, df, after_epoch):
    """Stage ``df``'s rows as Spark writes them, as the read ahead's tasks write theirs."""
    return sink.stage_files(lambda folder: df.write.mode("append").parquet(str(folder)), after_epoch)


def test_a_staged_spark_write_keeps_kafkas_offset_and_timestamp_out_of_the_dictionary(sink_factory, spark):
    """Offsets and timestamps are (nearly) one value per record: their dictionary would only overflow, so
    a staged Spark write (``dataframe_write``) writes them plain; other columns keep Parquet's default."""
    import datetime

    import pyarrow.parquet as pq

    schema = "offset long, timestamp timestamp, topic string, id long"
    s = sink_factory(schema=schema)
    at = datetime.datetime(2026, 11, 29, tzinfo=datetime.UTC)
    df = spark.createDataFrame([(i, at, "t", i % 3) for i in range(1000)], schema)
    staged = s.stage_files(s.staging.dataframe_write(df), -1)
    assert staged.rows == 1000
    encodings: dict[str, set[str]] = {}
    for file in staged.folder.rglob("*.parquet"):
        meta = pq.ParquetFile(file).metadata
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                column = meta.row_group(g).column(c)
                encodings.setdefault(column.path_in_schema, set()).update(column.encodings)
    dictionary = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}
    assert not encodings["offset"] & dictionary and not encodings["timestamp"] & dictionary, encodings
    assert encodings["topic"] & dictionary and encodings["id"] & dictionary, encodings
    s.discard(staged)


def test_staged_files_commit_with_a_later_epoch_and_are_swept_when_no_commit_takes_them(
    sink_factory, rows, tmp_path, monkeypatch
):
    path = tmp_path / "t"
    s = sink_factory()
    s.commit_epoch(1, rows([1]), {"e": 1})
    ahead = _stage(s, rows([10, 11, 12]), after_epoch=1)
    assert ahead.rows == 3 and (ahead.folder / MARKER).exists()
    assert table_ids(path) == [1]  # staged is not committed
    # a replayed epoch does not take them: they stay where they are
    assert not s.commit_epoch(1, rows([2]), {"e": 1}, staged=[ahead]).committed
    assert ahead.folder.exists()
    # the next epoch commits them with its own rows, in one version
    result = s.commit_epoch(2, rows([2]), {"e": 2}, staged=[ahead])
    assert result.committed and result.rows == 4
    assert table_ids(path) == [1, 2, 10, 11, 12]
    assert not ahead.folder.exists()  # moved into the attempt
    assert attempt_files(path) == referenced_files(path)
    assert not any((f / MARKER).exists() for f in (path / STAGING).iterdir())  # sealed
    # staged files of a commit that failed go with its attempt
    failed = _stage(s, rows([20]), after_epoch=2)
    monkeypatch.setattr(DeltaRsAppend, "_append", lambda *_a, **_k: (_ for _ in ()).throw(OSError("x")))
    with pytest.raises(OSError, match="x"):
        s.commit_epoch(3, None, {"e": 3}, staged=[failed])
    monkeypatch.undo()
    assert attempt_files(path) == referenced_files(path)
    # staged files a crash left behind are swept by the next sink; the committed ones stay
    _stage(s, rows([30]), after_epoch=2)  # below-or-at the committed epoch after the next commit
    _stage(s, rows([31]), after_epoch=5)  # above it
    s.commit_epoch(3, rows([3]), {"e": 3})
    (next(f for f in (path / STAGING).iterdir() if ".s" in f.name) / MARKER).touch()  # died before sealing
    sink_factory()
    assert attempt_files(path) == referenced_files(path)
    assert table_ids(path) == [1, 2, 3, 10, 11, 12]


def test_discarded_staged_files_are_removed(sink_factory, rows, tmp_path):
    s = sink_factory()
    s.commit_epoch(0, None, {"e": 0})
    ahead = _stage(s, rows([1]), after_epoch=0)
    s.discard(ahead)
    assert not ahead.folder.exists()
    s.discard(ahead)  # idempotent
    assert s.commit_epoch(1, None, {"e": 1}).committed
    assert table_ids(tmp_path / "t") == []


def test_staged_files_of_another_schema_are_refused_and_leave_nothing(sink_factory, rows, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    s = sink_factory()
    s.commit_epoch(0, None, {"e": 0})
    with pytest.raises(DeltaSinkError, match="staged file"):
        s.stage_files(lambda folder: pq.write_table(pa.table({"other": [1]}), folder / "x.parquet"), 0)
    assert not [f for f in (tmp_path / "t" / STAGING).iterdir() if f.is_dir()]
    # files of the table's schema written by any writer are staged and commit with the next epoch
    good = s.stage_files(lambda folder: pq.write_table(pa.Table.from_batches(
        [pa.RecordBatch.from_pylist([{"id": 7}], schema=s.arrow_schema)]), folder / "y.parquet"), 0)
    assert good.rows == 1
    assert s.commit_epoch(1, None, {"e": 1}, staged=[good]).committed
    assert table_ids(tmp_path / "t") == [7]


def _conflicting(monkeypatch, times, change):
    """Run ``change()`` (another writer's commit) just before each of the first ``times`` log appends.

    Either way an append goes: written straight into the log (``write_append``) or by delta-rs.
    """
    from deltalake import DeltaTable as _Table

    import connectors.delta.table as sink_table

    real = _Table.create_write_transaction
    real_direct = sink_table.write_append
    left = {"n": times}

    def first(*a, **kw):
        if left["n"] > 0:
            left["n"] -= 1
            change()

    def create_write_transaction(self, *a, **kw):
        first()
        return real(self, *a, **kw)

    def write_append(*a, **kw):
        first()
        return real_direct(*a, **kw)

    monkeypatch.setattr(_Table, "create_write_transaction", create_write_transaction)
    monkeypatch.setattr(sink_table, "write_append", write_append)
    return left


def _set_property(path):
    n = {"i": 0}

    def change():
        n["i"] += 1
        props = {"delta.logRetentionDuration": f"interval {n['i']} days"}
        DeltaTable(str(path)).alter.set_table_properties(props)

    return change


def test_a_commit_conflicting_with_another_writer_is_retried_and_lands_once(
    sink_factory, rows, tmp_path, monkeypatch
):
    path = tmp_path / "t"
    conflicts = []
    s = sink_factory(on_conflict=lambda: conflicts.append(1))
    s.commit_epoch(1, rows([1, 2]), {"e": 1})
    _conflicting(monkeypatch, 2, _set_property(path))
    result = s.commit_epoch(2, rows([3, 4]), {"e": 2})
    assert result.committed and len(conflicts) == 2
    assert table_ids(path) == [1, 2, 3, 4]
    assert s.recover().state == {"e": 2} and s.committed_epoch() == 2
    assert attempt_files(path) == referenced_files(path)


def test_a_commit_that_keeps_conflicting_fails_clearly_and_leaves_nothing(
    sink_factory, rows, tmp_path, monkeypatch
):
    from connectors.delta.append import COMMIT_RETRIES
    from source_backfill.errors import ConcurrentCommitError

    path = tmp_path / "t"
    s = sink_factory()
    s.commit_epoch(1, rows([1]), {"e": 1})
    left = _conflicting(monkeypatch, COMMIT_RETRIES + 1, _set_property(path))
    with pytest.raises(ConcurrentCommitError, match='commit of job "job" epoch 2 conflicted'):
        s.commit_epoch(2, rows([2]), {"e": 2})
    assert left["n"] == 0
    assert table_ids(path) == [1] and s.committed_epoch() == 1
    assert attempt_files(path) == referenced_files(path)  # the failed attempt's files are gone
    assert s.commit_epoch(2, rows([2]), {"e": 2}).committed  # the replay of the epoch then lands
    assert table_ids(path) == [1, 2]


def test_the_same_epoch_committed_by_another_instance_during_a_retry_is_never_doubled(
    sink_factory, rows, tmp_path, monkeypatch
):
    path = tmp_path / "t"
    s = sink_factory()
    s.commit_epoch(1, rows([1]), {"e": 1})
    other = sink_factory()

    def other_instance_commits_epoch_2():
        monkeypatch.undo()  # its own commit must not be intercepted
        assert other.commit_epoch(2, rows([20]), {"by": "other"}).committed

    _conflicting(monkeypatch, 1, other_instance_commits_epoch_2)
    result = s.commit_epoch(2, rows([2]), {"by": "us"})
    assert not result.committed
    assert table_ids(path) == [1, 20]
    assert s.recover().state == {"by": "other"}
    assert attempt_files(path) == referenced_files(path)
