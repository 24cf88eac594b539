"""A delta source's jobs on lanes: a job whose step does not end holds neither the epochs nor its neighbour.

The held job's step is a hook (as a heavy copy by files or a slow first write would be): the source's
epochs go on, the neighbour commits version after version, and once free the held job catches up by
versions (its own cursor) and ends equal to the source row for row. A drop of a held job is taken: its
step, once it ends, commits nothing.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from deltalake import DeltaTable

from source_backfill.config import JobSpec, SourceConfig
from source_backfill.errors import JobNotFoundError
from source_backfill.executors.table_backfill import TableBackfillJob
from source_backfill.runtime.registry import JobRegistry
from source_backfill.runtime.table_source import TableLiveSource
from source_backfill.testing.delta import ChangingTable, as_rows
from tests.integration.delta.conftest import run_epoch

pytestmark = pytest.mark.integration


class _Hold:
    """Holds job ``name``'s next epoch (armed once) until released."""

    def __init__(self, monkeypatch: Any, name: str) -> None:
        self.armed, self.held, self.release = False, threading.Event(), threading.Event()
        real = TableBackfillJob.run_epoch

        def held(job: TableBackfillJob, *a: Any, **kw: Any) -> Any:
            if job.name == name and self.armed:
                self.armed = False
                self.held.set()
                self.release.wait(120)
            return real(job, *a, **kw)

        monkeypatch.setattr(TableBackfillJob, "run_epoch", held)


def _source(tmp_path: Any, names: list[str]) -> tuple[TableLiveSource, JobRegistry, ChangingTable]:
    up = ChangingTable.create(str(tmp_path / "src"), 2_000, seed=11)
    registry = JobRegistry(tmp_path / "state", ["t"])
    for name in names:
        registry.create(JobSpec(name=name, source="t", sink_path=str(tmp_path / name), strategy="snapshot"))
    cfg = SourceConfig(name="t", kind="delta", table_path=str(tmp_path / "src"), primary_key=["id"],
                       trigger_interval_s=0.2, chunk_rows=500)
    source = TableLiveSource(cfg, registry)
    source.open()
    return source, registry, up


def _until_live(source: TableLiveSource) -> None:
    for _ in range(500):
        run_epoch(source)
        # at the source's version (a job's own lag_versions is of the last epoch it ran: 0 just after
        # a held step's commit, while the versions it skipped wait for its next step)
        if all(j.backfill_done and j.cursor == source.delivered for j in source.jobs.values()):
            return
    pytest.fail(f"jobs not live: { {n: (j.state, j.lag_versions) for n, j in source.jobs.items()} }")


def _hold_a_step(source: TableLiveSource, hold: _Hold, up: ChangingTable) -> None:
    """The jobs live, then the table changes and the held job's step of the next epoch is held."""
    _until_live(source)
    hold.armed = True
    up.commit()
    source.run_epoch()
    assert hold.held.wait(60)


def test_a_held_job_holds_neither_the_epochs_nor_its_neighbour_and_catches_up_by_versions(
    tmp_path, monkeypatch
):
    hold, (source, registry, up) = _Hold(monkeypatch, "held"), _source(tmp_path, ["held", "free"])
    try:
        _hold_a_step(source, hold, up)
        free, held = source.jobs["free"], source.jobs["held"]
        at, held_at = free.committed_epoch, held.committed_epoch
        for _ in range(5):  # the table changes; the free job follows it epoch after epoch
            up.commit()
            source.run_epoch()
            assert source.lanes.wait_idle("free", 60)  # (its step may outlive the epoch on a busy machine)
        assert free.committed_epoch >= (at or 0) + 5 and held.committed_epoch == held_at
        assert source.lanes.busy("held") and source.lanes.lag_s("held") > 0
        assert as_rows(DeltaTable(str(tmp_path / "free")).to_pyarrow_table()) == up.expected()
        hold.release.set()
        _until_live(source)  # the held job reads the versions it skipped after its own cursor
        for name in ("held", "free"):
            assert as_rows(DeltaTable(str(tmp_path / name)).to_pyarrow_table()) == up.expected(), name
        assert registry.failed() == []
    finally:
        hold.release.set()
        source.stop()


def test_a_drop_of_a_held_job_is_taken_and_its_step_commits_nothing(tmp_path, monkeypatch):
    hold, (source, registry, up) = _Hold(monkeypatch, "doomed"), _source(tmp_path, ["doomed", "free"])
    try:
        _hold_a_step(source, hold, up)
        version = DeltaTable(str(tmp_path / "doomed")).version()
        registry.drop("doomed")
        source.run_epoch()  # the drop: the job out of the epochs, its lane stopped
        assert "doomed" not in source.jobs
        hold.release.set()  # its step goes on to its commit, which the stopped lane refuses
        assert source.lanes.wait_idle("doomed", 60)
        for _ in range(3):
            up.commit()
            run_epoch(source)
        with pytest.raises(JobNotFoundError):  # the drop applied: the name is free again
            registry.get("doomed")
        assert DeltaTable(str(tmp_path / "doomed")).version() == version  # nothing committed after the drop
        assert as_rows(DeltaTable(str(tmp_path / "free")).to_pyarrow_table()) == up.expected()
    finally:
        hold.release.set()
        source.stop()
