"""A job's table grows with its work, not with time (issue 27): table jobs and the log's retention.

A live table job on a quiet table commits nothing; once its table's log retention would take its last
commit it writes its state again, so Delta's log cleanup leaves a restart its exact state. The epochs
are run by the test; restarts are new source objects recovering from the jobs' tables.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from source_backfill.config import JobSpec, SourceConfig
from source_backfill.runtime.registry import JobRegistry
from source_backfill.runtime.table_source import TableLiveSource
from source_backfill.testing.delta import ChangingTable, as_rows

pytestmark = pytest.mark.integration


def _source(tmp_path, registry):
    cfg = SourceConfig(name="t", kind="delta", table_path=str(tmp_path / "src"), primary_key=["id"],
                       trigger_interval_s=0.5, chunk_rows=64)
    source = TableLiveSource(cfg, registry)
    source.open()
    return source


def _live(source, limit=500):
    for _ in range(limit):
        source.run_epoch()
        if all(j.backfill_done and j.lag_versions == 0 for j in source.jobs.values()):
            return
    pytest.fail("job not live")


def _log_versions(table: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (table / "_delta_log").glob("*.json"))


@pytest.mark.parametrize("strategy", ["snapshot", "arrangement"])
def test_a_live_table_job_on_a_quiet_table_adds_no_version(tmp_path, strategy):
    up = ChangingTable.create(str(tmp_path / "src"), 300, seed=3)
    registry = JobRegistry(tmp_path / "state", ["t"])
    registry.create(JobSpec(name="j", source="t", sink_path=str(tmp_path / "j"), strategy=strategy,
                            mode="merge"))
    source = _source(tmp_path, registry)
    _live(source)
    job = source.jobs["j"]
    version = DeltaTable(str(tmp_path / "j")).version()
    for _ in range(30):
        source.run_epoch()
    assert DeltaTable(str(tmp_path / "j")).version() == version  # 30 quiet epochs, no version
    assert job.processed_epoch == source._epoch  # noqa: SLF001 - the epochs were run all the same
    up.commit()
    source.run_epoch()
    assert DeltaTable(str(tmp_path / "j")).version() == version + 1  # a change commits once
    for _ in range(5):
        source.run_epoch()
    assert DeltaTable(str(tmp_path / "j")).version() == version + 1
    assert as_rows(DeltaTable(str(tmp_path / "j")).to_pyarrow_table()) == up.expected()


def test_an_idle_table_job_past_the_log_retention_restarts_with_its_exact_state(tmp_path):
    up = ChangingTable.create(str(tmp_path / "src"), 200, seed=5)
    registry = JobRegistry(tmp_path / "state", ["t"])
    registry.create(JobSpec(name="j", source="t", sink_path=str(tmp_path / "j"), strategy="snapshot",
                            mode="merge"))
    source = _source(tmp_path, registry)
    _live(source)
    table = tmp_path / "j"
    retention_s = 3
    DeltaTable(str(table)).alter.set_table_properties(
        {"delta.logRetentionDuration": f"interval {retention_s} seconds", "delta.checkpointInterval": "1000"})
    source.stop()
    source = _source(tmp_path, registry)  # the job reads the retention: it refreshes its state after 1.5 s
    job = source.jobs["j"]
    state, rows = job.state.to_json(), dict(job.rows)
    log = DeltaTable(str(table))
    log.create_checkpoint()  # covering every commit so far
    first = log.version()
    deadline = time.monotonic() + retention_s + 1.5
    while time.monotonic() < deadline:  # idle past the retention; epochs every 0.25 s
        source.run_epoch()
        time.sleep(0.25)
    refreshed = DeltaTable(str(table)).version() - first
    assert refreshed <= 4  # a fresh state every half retention, not a commit per epoch
    DeltaTable(str(table)).cleanup_metadata()
    assert min(_log_versions(table)) >= first  # the commits the retention expired are gone
    source.stop()
    source = _source(tmp_path, registry)
    job = source.jobs["j"]
    assert job.state.to_json() == state and dict(job.rows) == rows
    up.commit()
    _live(source)
    assert as_rows(DeltaTable(str(table)).to_pyarrow_table()) == up.expected()
