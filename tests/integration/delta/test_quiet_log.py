"""A job's table grows with its work, not with time (issue 27): table jobs and the log's retention.

A live table job on a quiet table commits nothing; once its table's log retention would take its last
commit it writes its state again, so Delta's log cleanup leaves a restart its exact state. The epochs
are run by the test; restarts are new source objects recovering from the jobs' tables.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from connectors.delta.log import KEY_STATE
from source_backfill.config import JobSpec, SourceConfig
from source_backfill.runtime.registry import JobRegistry
from source_backfill.runtime.table_source import TableLiveSource
from source_backfill.testing.delta import ChangingTable, as_rows
from tests.integration.delta.conftest import run_epoch

pytestmark = pytest.mark.integration


def _source(tmp_path, registry):
    cfg = SourceConfig(name="t", kind="delta", table_path=str(tmp_path / "src"), primary_key=["id"],
                       trigger_interval_s=0.5, chunk_rows=64)
    source = TableLiveSource(cfg, registry)
    source.open()
    return source


def _live(source, limit=500):
    for _ in range(limit):
        run_epoch(source)
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
        run_epoch(source)
    assert DeltaTable(str(tmp_path / "j")).version() == version  # 30 quiet epochs, no version
    assert job.processed_epoch == source._epoch  # noqa: SLF001 - the epochs were run all the same
    up.commit()
    run_epoch(source)
    assert DeltaTable(str(tmp_path / "j")).version() == version + 1  # a change commits once
    for _ in range(5):
        run_epoch(source)
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
        run_epoch(source)
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


def _chain_table(tmp_path):
    """A job's log of a snapshot and two deltas, written with the codec through the sink."""
    import pyarrow as pa

    from connectors.delta.sink import DeltaEpochSink
    from source_backfill.core.codec import delta_to_json, snapshot_to_json
    from source_backfill.core.state_log import Changes

    row = {"stage": "finished", "offset": 4, "num_consumed_rows": 5, "target_offset": 4}
    sink = DeltaEpochSink(str(tmp_path / "j"), "j", pa.schema([("a", pa.int64())]))
    snap = sink.commit_epoch(1, None, snapshot_to_json({"splits": {"t:0": row, "t:1": row},
                                                        "end": {"t:0": 5, "t:1": 5}}))
    d1 = sink.commit_epoch(2, None, delta_to_json(Changes({"end": {"t:0": 7}}), base=snap.version,
                                                  prev=snap.version))
    moved = {**row, "offset": 9}
    d2 = sink.commit_epoch(3, None, delta_to_json(Changes({"splits": {"t:1": moved}, "end": {"t:1": 10}}),
                                                  base=snap.version, prev=d1.version))
    return sink, (snap.version, d1.version, d2.version), {"splits": {"t:0": row, "t:1": moved},
                                                          "end": {"t:0": 7, "t:1": 10}}


def test_the_state_chain_rebuilds_exactly_and_a_broken_link_fails_naming_the_table(tmp_path):
    from source_backfill.errors import StateFormatError
    from source_backfill.executors.job_log import read_state_chain

    sink, (snap, d1, d2), expected = _chain_table(tmp_path)
    sections, chain = read_state_chain(sink, sink.recover())
    assert sections == expected
    assert (chain.base, chain.prev, chain.deltas_since) == (snap, d2, 2)
    log = tmp_path / "j" / "_delta_log"
    middle = log / f"{d1:020d}.json"
    text = middle.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    for action in lines:
        if KEY_STATE in action.get("commitInfo", {}):
            action["commitInfo"][KEY_STATE] = '{"version": 2, "kind": "delta", "splits": [torn'
    middle.write_text("\n".join(json.dumps(a) for a in lines) + "\n")  # a garbled state mid-chain
    with pytest.raises(StateFormatError, match=f"{tmp_path / 'j'}.*version {d1} is damaged"):
        read_state_chain(sink, sink.recover())
    middle.write_text(text[:-40])  # a torn commit file: the log itself is unreadable, said as much
    with pytest.raises(StateFormatError, match=f"{tmp_path / 'j'}.*cannot be read"):
        read_state_chain(sink, sink.recover())
    middle.write_text(text)
    DeltaTable(str(tmp_path / "j")).create_checkpoint()
    for version in range(d1 + 1):  # links gone as a log cleanup removes them (a checkpoint after them)
        (log / f"{version:020d}.json").unlink()
    with pytest.raises(StateFormatError, match=f"{tmp_path / 'j'}.*version {d1} .*missing"):
        read_state_chain(sink, sink.recover())
