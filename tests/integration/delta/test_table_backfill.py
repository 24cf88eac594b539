"""Table backfill of a changing Delta table: snapshot, arrangement and chain, merged and as a changelog.

A source table of 20k rows keeps changing under a writer (inserts between and after the first rows,
updates, deletes, upserts — of rows copied already, of rows not reached yet, at the positions) while
the jobs copy it in small chunks; after the writer stops and every job follows the live stream, each
job's table equals the source's latest version row for row (merge), and each changelog replayed strictly
rebuilds it (an insert of a present key or a change of a missing one fails). The source's epochs are run
by the test (``run_epoch``); restarts are new source objects recovering from the jobs' tables.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from source_backfill.config import JobSpec, SourceConfig
from source_backfill.core.table_backfill import Phase
from source_backfill.runtime.registry import JobRegistry
from source_backfill.runtime.table_source import TableLiveSource
from source_backfill.testing.delta import ChangingTable, as_rows, replay_changelog
from tests.integration.delta.conftest import run_epoch

pytestmark = pytest.mark.integration

ROWS = 20_000


def _source(tmp_path, registry, spark=None, **kw):
    cfg = SourceConfig(name="t", kind="delta", table_path=str(tmp_path / "src"), primary_key=["id"],
                       trigger_interval_s=0.5, **({"chunk_rows": 8, "replay_versions_per_epoch": 2} | kw))
    source = TableLiveSource(cfg, registry, spark)
    source.open()
    return source


def _job(registry, tmp_path, name, strategy, mode, **kw):
    registry.create(JobSpec(name=name, source="t", sink_path=str(tmp_path / name), strategy=strategy,
                            mode=mode, **kw))


def _content(job):
    table = DeltaTable(job.sink.path).to_pyarrow_table()
    return as_rows(table) if job.mode == "merge" else replay_changelog(table)


def _until_live(source, limit=2000):
    for _ in range(limit):
        run_epoch(source)
        if all(j.backfill_done and j.lag_versions == 0 for j in source.jobs.values()):
            return
    pytest.fail(f"jobs not live: { {n: (j.state, j.lag_versions) for n, j in source.jobs.items()} }")


@pytest.mark.parametrize(("strategy", "index"), [("snapshot", "memory"), ("arrangement", "memory"),
                                                  ("chain", "memory"), ("snapshot", "spilled"),
                                                  ("arrangement", "spilled"), ("snapshot", "files"),
                                                  ("chain", "files")])
def test_each_strategy_ends_equal_to_the_changing_source(tmp_path, strategy, index, monkeypatch, request):
    """``spilled``: every version indexed on disk by vnode (``table_index_rows = 0``), the spill removed
    once the copy is done. ``files``: the copy by files with Spark (``spark_copy_rows = 0``), a data file
    of 2,500 rows an epoch (``spark_copy_epoch_rows``)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    by_files = index == "files"
    up = ChangingTable.create(str(tmp_path / "src"), ROWS, seed=7, files=8 if by_files else 1)
    registry = JobRegistry(tmp_path / "state", ["t"])
    _job(registry, tmp_path, "merged", strategy, "merge")
    _job(registry, tmp_path, "log", strategy, "changelog", rate_limit=4000.0)
    spark = request.getfixturevalue("spark") if by_files else None
    files = {"spark_copy_rows": 0, "spark_copy_epoch_rows": 3_000} if by_files else {}
    source = _source(tmp_path, registry, spark, table_index_rows=0 if index == "spilled" else 1_000_000,
                     **files)
    thread, stop = up.writer_thread(0.01)
    copying_while_writing, spilled = 0, False
    try:  # 12 epochs at least, and until the writer has made 10 versions (a busy machine slows it)
        for i in range(400):
            run_epoch(source)
            copying_while_writing += not source.jobs["log"].backfill_done
            # seen while the snapshots copy: a copy done before the writer's 10th version lets it go
            spilled = spilled or bool(list((tmp_path / "tmp").glob("source-backfill-spill-*")))
            if i >= 11 and up.versions >= 10:
                break
    finally:
        stop.set()
        thread.join()
    # the copy really overlapped the changes (chain in memory reads its snapshot in one pass, and follows
    # the stream from the next epoch when no version arrived during it)
    one_pass = (strategy, index) == ("chain", "memory")
    assert up.versions >= 10 and copying_while_writing >= (0 if one_pass else 8)
    assert spilled == (index == "spilled")
    _until_live(source)
    assert not list((tmp_path / "tmp").glob("source-backfill-spill-*"))  # let go with the copy
    want = up.expected()
    for job in source.jobs.values():
        assert _content(job) == want, job.name
    assert registry.failed() == []
    progress = registry.progress("merged")
    assert progress.status == "finished" and progress.table.phase == Phase.CONSUME_UPSTREAM.value
    assert progress.table.lag_versions == 0 and progress.rows_history > 0
    for job in source.jobs.values():  # by files: every data file of the pinned version, one an epoch
        assert job.state.files == (8 if by_files else None), job.name
        table = registry.progress(job.name).table
        assert (table.files_copied, table.files_total) == ((8, 8) if by_files else (None, None))
    if by_files:
        copied = [n for _, n in _rows_copied_per_commit(tmp_path / "merged") if n]
        assert copied == [ROWS // 8] * 8, copied
    if strategy == "arrangement":  # the copy overlapped changes to copied rows, yet no chunk was merged
        copied = _rows_copied_per_commit(tmp_path / "merged")
        merged = [n for op, n in copied if op == "MERGE"]
        assert merged and max(merged) <= 256, copied  # a merging epoch reads one row per unfinished vnode
        assert any(op != "MERGE" and n > 256 for op, n in copied), copied


def _rows_copied_per_commit(path):
    """``(operation, snapshot rows copied)`` of each commit of a table-backfill job's table, oldest first."""
    import json

    from connectors.delta.log import KEY_STATE

    out, before = [], 0
    for commit in reversed(DeltaTable(str(path)).history()):
        if KEY_STATE not in commit:
            continue
        total = json.loads(commit[KEY_STATE])["rows"].get(Phase.CONSUMING_SNAPSHOT.value, 0)
        out.append((commit["operation"], total - before))
        before = total
    return out


def test_a_restart_mid_snapshot_and_mid_replay_resumes_from_the_committed_state(tmp_path):
    up = ChangingTable.create(str(tmp_path / "src"), ROWS, seed=3)
    registry = JobRegistry(tmp_path / "state", ["t"])
    for strategy in ("snapshot", "arrangement", "chain"):
        _job(registry, tmp_path, strategy, strategy, "changelog", rate_limit=4_000.0)
    source = _source(tmp_path, registry, chunk_rows=64)
    run_epoch(source)
    assert source.jobs["snapshot"].state.phase is Phase.CONSUMING_SNAPSHOT
    phases = set()
    for _ in range(12):  # restart after every few epochs, while versions keep coming
        for _ in range(3):
            up.commit()
            run_epoch(source)
            phases |= {j.state.phase for j in source.jobs.values()}
        source.stop()
        source = _source(tmp_path, registry, chunk_rows=64)  # a new process: state from the tables only
    assert {Phase.CONSUMING_SNAPSHOT, Phase.CONSUMING_LOG_STORE} <= phases
    _until_live(source)
    want = up.expected()
    for job in source.jobs.values():
        assert _content(job) == want, job.name


def test_rate_zero_then_raised_loses_nothing(tmp_path):
    up = ChangingTable.create(str(tmp_path / "src"), 2_000, seed=5)
    registry = JobRegistry(tmp_path / "state", ["t"])
    _job(registry, tmp_path, "a", "arrangement", "changelog", rate_limit=0.0)
    _job(registry, tmp_path, "s", "snapshot", "merge", rate_limit=0.0)
    source = _source(tmp_path, registry)
    for _ in range(5):
        up.commit()
        run_epoch(source)
    for job in source.jobs.values():  # paused: nothing copied, nothing replayed
        assert job.rows.get(Phase.CONSUMING_SNAPSHOT.value, 0) == 0
        assert job.state.phase is Phase.CONSUMING_SNAPSHOT
    registry.throttle("a", None)
    registry.throttle("s", 500.0)
    for _ in range(5):
        up.commit()
        run_epoch(source)
    _until_live(source)
    want = up.expected()
    for job in source.jobs.values():
        assert _content(job) == want, job.name


def test_a_replayed_log_store_epoch_is_applied_once(tmp_path):
    """An epoch of the replay phase run again (its commit made, the process gone before it knew) is
    skipped by the table's transaction, so the changelog holds each replayed change once."""
    up = ChangingTable.create(str(tmp_path / "src"), 500, seed=9)
    registry = JobRegistry(tmp_path / "state", ["t"])
    _job(registry, tmp_path, "s", "snapshot", "changelog")
    source = _source(tmp_path, registry, chunk_rows=1024, replay_versions_per_epoch=1)
    for _ in range(6):
        up.commit()
    run_epoch(source)  # the whole snapshot, pinned before the six versions now pending in the log store
    job = source.jobs["s"]
    assert job.state.phase is Phase.CONSUMING_LOG_STORE and source.delivered == job.state.cursor + 6
    before, epoch = job.state, source._epoch + 1  # noqa: SLF001
    run_epoch(source)
    assert job.state.phase is Phase.CONSUMING_LOG_STORE and job.state.cursor == before.cursor + 1
    replayed = DeltaTable(job.sink.path).version()
    job.state = before  # the epoch again, from the state it started with
    assert not job.run_epoch(epoch, source.delivered, source.delivered, None)
    assert DeltaTable(job.sink.path).version() == replayed and job.state.cursor == before.cursor + 1
    assert job.rows[Phase.CONSUMING_SNAPSHOT.value] == 500  # recovered from the table, not counted twice
    _until_live(source)
    assert _content(job) == up.expected()


def test_a_job_on_a_table_without_change_feed_or_with_a_bad_key_fails_clearly(tmp_path):
    from deltalake import write_deltalake

    from source_backfill.errors import ConfigError
    from source_backfill.testing.delta import SCHEMA

    write_deltalake(str(tmp_path / "src"), SCHEMA.empty_table())
    with pytest.raises(ConfigError, match="change data feed"):
        _source(tmp_path, JobRegistry(tmp_path / "state", ["t"]))
    ChangingTable.create(str(tmp_path / "keyed"), 10)
    registry = JobRegistry(tmp_path / "state2", ["t"])
    _job(registry, tmp_path, "j", "snapshot", "merge")
    cfg = SourceConfig(name="t", kind="delta", table_path=str(tmp_path / "keyed"), primary_key=["nope"])
    source = TableLiveSource(cfg, registry)
    source.open()
    run_epoch(source)
    assert "j" not in source.jobs
    assert "nope" in registry.get("j").error


@pytest.mark.parametrize("strategy", ["snapshot", "chain"])
def test_a_copy_by_files_resumes_after_restarts_and_a_replayed_epoch(tmp_path, spark, strategy):
    """Restarted after every two epochs of a copy by files (a new source: state from the tables only),
    one epoch run again after its commit (skipped by the table's transaction), the changes of the
    pinned version's later versions replayed after it: each job's table equals the source's latest
    version, each changelog replayed strictly (a file copied twice would insert its keys twice). A
    daemon without Spark then cannot go on with it and fails the job saying why."""
    up = ChangingTable.create(str(tmp_path / "src"), 8_000, seed=11, files=8)
    registry = JobRegistry(tmp_path / "state", ["t"])
    _job(registry, tmp_path, "m", strategy, "merge")
    _job(registry, tmp_path, "c", strategy, "changelog")
    opts = {"spark_copy_rows": 1, "spark_copy_epoch_rows": 1_000}
    source = _source(tmp_path, registry, spark, **opts)
    run_epoch(source)
    job = source.jobs["c"]
    assert job.state.files == 1 and job.state.phase is Phase.CONSUMING_SNAPSHOT
    before, epoch = job.state, source._epoch + 1  # noqa: SLF001
    run_epoch(source)
    version = DeltaTable(job.sink.path).version()
    job.state = before  # the epoch again, from the state it started with: committed, so skipped
    assert not job.run_epoch(epoch, source.delivered, source.delivered, None)
    assert DeltaTable(job.sink.path).version() == version and job.state.files == 2
    for _ in range(2):
        up.commit()
        run_epoch(source)
        source.stop()
        source = _source(tmp_path, registry, spark, **opts)
        run_epoch(source)
    assert 2 < source.jobs["c"].state.files < 8
    table = registry.progress("c").table  # the copy by files, as the API shows it
    assert table.files_copied == source.jobs["c"].state.files and table.files_total == 8
    assert table.rows_total == 8_000 and table.rows_copied == 1_000 * table.files_copied
    _until_live(source)
    want = up.expected()
    for job in source.jobs.values():
        assert _content(job) == want, job.name
        assert job.state.files == 8
    assert registry.failed() == []


def test_a_copy_by_files_fails_clearly_where_the_daemon_runs_no_spark(tmp_path, spark):
    ChangingTable.create(str(tmp_path / "src"), 2_000, seed=2, files=4)
    registry = JobRegistry(tmp_path / "state", ["t"])
    _job(registry, tmp_path, "s", "snapshot", "merge")
    opts = {"spark_copy_rows": 1, "spark_copy_epoch_rows": 500}
    source = _source(tmp_path, registry, spark, **opts)
    run_epoch(source)
    assert source.jobs["s"].state.files == 1
    source.stop()
    source = _source(tmp_path, registry, None, **opts)  # restarted without Spark: cannot go on
    run_epoch(source)
    (failed,) = registry.failed()
    assert failed.name == "s" and "runs no Spark" in failed.error and "spark.tables" in failed.error
    source.stop()
