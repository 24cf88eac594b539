"""Table maintenance: checkpoints every N commits, compaction and vacuum keep a busy table small."""

from __future__ import annotations

import pytest

from tests.integration.delta.conftest import attempt_files, referenced_files, table_ids

pytestmark = pytest.mark.integration


def test_a_checkpoint_is_written_every_n_commits(sink_factory, tmp_path):
    s = sink_factory(checkpoint_interval=3)
    for e in range(1, 8):
        s.commit_epoch(e, None, {"e": e})
    log = tmp_path / "t" / "_delta_log"
    # the table says delta.checkpointInterval=3: delta-rs' post-commit hook writes them (its 3rd, 6th)
    assert sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint.parquet")) == [2, 5]
    assert s.recover().state == {"e": 7}


def test_compaction_and_vacuum_reclaim_small_files_and_keep_data_and_state(sink_factory, rows, tmp_path):
    path = tmp_path / "t"
    s = sink_factory()
    for e in range(1, 5):
        s.commit_epoch(e, rows([e]), {"e": e})
    before = attempt_files(path)
    assert len(before) == 4
    metrics = s.compact()
    assert metrics["numFilesRemoved"] == 4 and metrics["numFilesAdded"] == 1
    assert s.recover().state == {"e": 4}  # the OPTIMIZE commit carries no state: recovery skips it
    deleted = s.vacuum(retention_hours=0)
    assert len(deleted) >= 4
    assert attempt_files(path) == set()  # attempt folders are not hidden: vacuum reclaims them
    assert len(referenced_files(path)) == 1
    assert table_ids(path) == [1, 2, 3, 4]
    assert s.commit_epoch(5, rows([5]), {"e": 5}).committed
    assert table_ids(path) == [1, 2, 3, 4, 5]
