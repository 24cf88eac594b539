"""Appends written straight into a table's log: read back whole, and every way the log moves under them.

The sink writes an append's commit file itself while the log's head is the one it last saw
(``connectors/delta/log_append.py``); these tests count delta-rs' own commits to tell which path an
append took, and read every table back with a fresh delta-rs table (no Spark).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import connectors.delta.table as sink_table
from connectors.delta.log_append import ALLOWED_PROPERTIES
from connectors.delta.maintenance import STAGING
from connectors.delta.sink import DeltaEpochSink

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


def ids(path: Path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def versions(path: Path) -> list[int]:
    return sorted(int(f.name.split(".")[0]) for f in (path / "_delta_log").glob("*.json"))


def attempt_files(path: Path) -> set[Path]:
    return set((path / STAGING).rglob("*.parquet"))


def referenced(path: Path) -> set[Path]:
    return {Path(u.removeprefix("file://")) for u in DeltaTable(str(path)).file_uris()}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "t"


@pytest.fixture
def sink(path: Path):
    def make(**kw):
        return DeltaEpochSink(str(path), "job", SCHEMA, **kw)

    return make


@pytest.fixture
def delta_rs_commits(monkeypatch):
    """How many commits delta-rs wrote (``create_write_transaction``) since the test began."""
    real = DeltaTable.create_write_transaction
    calls = {"n": 0}

    def counted(self, *a, **kw):
        calls["n"] += 1
        return real(self, *a, **kw)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", counted)
    return calls


def test_appends_are_written_into_the_log_and_read_back_whole(sink, path, delta_rs_commits):
    s = sink()
    for epoch in range(1, 6):
        result = s.commit_epoch(epoch, rows([epoch, 10 + epoch]), {"e": epoch}, {"plan": epoch})
        assert (result.committed, result.version, result.rows) == (True, epoch, 2)
    assert delta_rs_commits["n"] == 0 and s.target.last_direct == 5
    table = DeltaTable(str(path))
    assert (table.version(), table.transaction_version("job")) == (5, 5)
    assert ids(path) == [1, 2, 3, 4, 5, 11, 12, 13, 14, 15]
    got = sink().recover()
    assert (got.epoch, got.state, got.plan) == (5, {"e": 5}, {"plan": 5})
    # the change feed: an append's adds are its inserts
    changes = table.load_cdf(starting_version=1).read_all()
    assert sorted(changes.column("id").to_pylist()) == ids(path)
    assert set(changes.column("_change_type").to_pylist()) == {"insert"}
    lines = [json.loads(line) for line in (path / "_delta_log" / f"{5:020d}.json").read_text().splitlines()]
    assert [next(iter(line)) for line in lines] == ["commitInfo", "add", "txn"]
    assert lines[2]["txn"]["appId"] == "job" and lines[2]["txn"]["version"] == 5
    assert attempt_files(path) == referenced(path)
    assert not list((path / "_delta_log").glob("*.tmp"))


def test_a_replayed_epoch_is_skipped_from_the_head(sink, path):
    s = sink()
    s.commit_epoch(1, rows([1]), {"e": 1})
    s.commit_epoch(2, rows([2]), {"e": 2})
    assert not s.commit_epoch(2, rows([99]), {"e": 99}).committed
    assert not s.commit_epoch(1, rows([98]), {"e": 98}).committed
    assert versions(path) == [0, 1, 2] and ids(path) == [1, 2]


def test_another_writers_commit_is_seen_before_the_next_append_which_follows_it(
    sink, path, delta_rs_commits
):
    s = sink()
    s.commit_epoch(1, rows([1]), {"e": 1})
    DeltaTable(str(path)).alter.set_table_properties({"delta.logRetentionDuration": "interval 2 days"})
    assert s.commit_epoch(2, rows([2]), {"e": 2}).version == 3  # after the other writer's version 2
    assert s.commit_epoch(3, rows([3]), {"e": 3}).version == 4
    assert delta_rs_commits["n"] == 0 and s.target.last_direct == 4  # the table reloaded, then its head
    assert versions(path) == [0, 1, 2, 3, 4] and ids(path) == [1, 2, 3]
    assert DeltaTable(str(path)).metadata().configuration["delta.logRetentionDuration"] == "interval 2 days"


def _before_the_write(monkeypatch, change):
    """Run ``change()`` once, between the head's check and the append's write."""
    real = sink_table.write_append

    def write(*a, **kw):
        monkeypatch.setattr(sink_table, "write_append", real)
        change()
        return real(*a, **kw)

    monkeypatch.setattr(sink_table, "write_append", write)


def test_a_version_taken_between_the_check_and_the_write_is_a_conflict_and_the_epoch_lands_once(
    sink, path, monkeypatch, delta_rs_commits
):
    conflicts: list[int] = []
    s = sink(on_conflict=lambda: conflicts.append(1))
    s.commit_epoch(1, rows([1]), {"e": 1})
    _before_the_write(monkeypatch, lambda: DeltaTable(str(path)).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 3 days"}))
    result = s.commit_epoch(2, rows([2]), {"e": 2})
    assert (result.committed, result.version) == (True, 3)
    assert conflicts == [1] and delta_rs_commits["n"] == 1
    assert versions(path) == [0, 1, 2, 3] and ids(path) == [1, 2]
    assert sink().recover().state == {"e": 2}
    assert attempt_files(path) == referenced(path)


def test_another_instance_committing_the_epoch_first_wins_and_ours_is_dropped(sink, path, monkeypatch):
    s = sink()
    s.commit_epoch(1, rows([1]), {"e": 1})
    other = sink()
    _before_the_write(monkeypatch, lambda: other.commit_epoch(2, rows([20]), {"by": "other"}))
    result = s.commit_epoch(2, rows([2]), {"by": "us"})
    assert not result.committed
    assert ids(path) == [1, 20] and sink().recover().state == {"by": "other"}
    assert attempt_files(path) == referenced(path)  # our attempt's files are gone
    assert s.commit_epoch(3, rows([3]), {"e": 3}).committed  # and the sink goes on from the log
    assert versions(path) == [0, 1, 2, 3] and ids(path) == [1, 3, 20]


def test_a_table_recreated_at_the_path_is_reloaded_never_written_past_its_versions(sink, path):
    s = sink()
    for epoch in (1, 2, 3):
        s.commit_epoch(epoch, rows([epoch]), {"e": epoch})
    shutil.rmtree(path)
    again = sink()
    for epoch in (1, 2, 3):  # the same versions 0..3 again, other files
        again.commit_epoch(epoch, rows([100 + epoch]), {"e": epoch})
    assert not s.commit_epoch(3, rows([99]), {"e": 99}).committed  # the head is not the one seen: reloaded
    assert s.commit_epoch(4, rows([4]), {"e": 4}).version == 4
    assert versions(path) == [0, 1, 2, 3, 4] and ids(path) == [4, 101, 102, 103]


def test_checkpoints_and_expired_commit_files_as_delta_rs_hook_would(sink, path, delta_rs_commits):
    s = sink(checkpoint_interval=5, log_retention_hours=0)
    for epoch in range(1, 13):
        s.commit_epoch(epoch, rows([epoch]), {"e": epoch})
    assert delta_rs_commits["n"] == 0
    log = path / "_delta_log"
    # after the 5th and 10th versions, as delta-rs' hook (the one after the 5th expired with the files before)
    assert (log / f"{9:020d}.checkpoint.parquet").exists()
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 9
    assert min(versions(path)) == 9  # the commit files the checkpoint covers, past the retention: removed
    table = DeltaTable(str(path))
    assert (table.version(), table.transaction_version("job")) == (12, 12)
    assert ids(path) == list(range(1, 13)) and sink().recover().state == {"e": 12}


def test_a_table_with_a_check_constraint_takes_delta_rs_for_its_appends(sink, path, delta_rs_commits):
    s = sink()
    s.commit_epoch(1, rows([1]), {"e": 1})
    DeltaTable(str(path)).alter.add_constraint({"id_positive": "id > 0"})
    for epoch in (2, 3):
        assert s.commit_epoch(epoch, rows([epoch]), {"e": epoch}).committed
    assert delta_rs_commits["n"] == 2 and s.target.last_direct == 1
    assert ids(path) == [1, 2, 3]


@pytest.mark.parametrize("change", [{"delta.isolationLevel": "Serializable"}, {"delta.appendOnly": "true"}])
def test_the_allow_list_of_table_properties(sink, path, change, delta_rs_commits):
    s = sink()
    s.commit_epoch(1, rows([1]), {"e": 1})
    DeltaTable(str(path)).alter.set_table_properties(change)
    s.commit_epoch(2, rows([2]), {"e": 2})
    allowed = all(k in ALLOWED_PROPERTIES for k in change)
    assert (delta_rs_commits["n"] == 0) == allowed
    assert ids(path) == [1, 2]


def test_file_paths_are_uris_in_the_log_and_partition_values_as_they_are(path, delta_rs_commits):
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    s = DeltaEpochSink(str(path), "job", schema, partition_by=["name"])
    odd = ["a b", "x:y/z%", "ü+é&=?#[]@!$'()*,;~", None]
    s.commit_epoch(1, pa.table({"id": [1, 2, 3, 4], "name": odd}, schema=schema), {"e": 1})
    s.commit_epoch(2, pa.table({"id": [5], "name": ["a b"]}, schema=schema), {"e": 2})
    assert delta_rs_commits["n"] == 0
    table = DeltaTable(str(path))
    got = table.to_pyarrow_table()
    assert sorted(zip(got.column("id").to_pylist(), got.column("name").to_pylist(), strict=True)) == \
        [(1, "a b"), (2, "x:y/z%"), (3, "ü+é&=?#[]@!$'()*,;~"), (4, None), (5, "a b")]
    assert all(Path(u.removeprefix("file://")).is_file() for u in table.file_uris())


def test_columns_that_may_not_be_null_are_appended_into_the_log_too(path, delta_rs_commits):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])
    s = DeltaEpochSink(str(path), "job", schema)
    for epoch in (1, 2):
        s.commit_epoch(epoch, pa.table({"id": [epoch], "name": ["x"]}, schema=schema), {"e": epoch})
    assert delta_rs_commits["n"] == 0 and ids(path) == [1, 2]
    assert not DeltaTable(str(path)).schema().fields[0].nullable
