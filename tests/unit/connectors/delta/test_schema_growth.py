"""A job's table grows its columns in the same commit as the first rows that hold them.

delta-rs' own append keeps a table's columns as they are (a file with more columns is committed, its
extra column never read), so the sink writes a growth's commit into the log itself, with the table's new
``metaData`` (``SinkTable.grow``, ``log_append.grown_metadata``). Read back with a fresh delta-rs table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import connectors.delta.table as sink_table
from connectors.delta.sink import DeltaEpochSink
from source_backfill.errors import DeltaSinkError

V1 = pa.schema([("id", pa.int64()), ("name", pa.string())])
V2 = pa.schema([("id", pa.int64()), ("name", pa.string()), ("email", pa.string())])
READER = "sourceBackfill.test.reader"


def rows(ids: list[int], schema: pa.Schema = V1) -> pa.Table:
    cols = {"id": ids, "name": [f"n{i}" for i in ids]}
    if "email" in schema.names:
        cols["email"] = [f"e{i}" for i in ids]
    return pa.table(cols, schema=schema)


def log_lines(path: Path, version: int) -> list[dict]:
    text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "t"


def test_the_columns_grow_with_the_first_rows_that_hold_them(path):
    sink = DeltaEpochSink(str(path), "job", V1, extra_properties={READER: "v1"})
    sink.commit_epoch(1, rows([1, 2]), {"e": 1})
    assert DeltaTable(str(path)).metadata().configuration[READER] == "v1"
    assert sink.grow(V2, {READER: "v2"}) == ["email"]
    assert sink.grow(V2, {READER: "v2"}) == []  # already waiting: nothing more
    result = sink.commit_epoch(2, rows([3], V2), {"e": 2})
    assert result.committed
    assert [next(iter(line)) for line in log_lines(path, result.version)] == [
        "commitInfo", "metaData", "add", "txn"]
    table = DeltaTable(str(path))
    assert table.schema().to_arrow().names == ["id", "name", "email"]
    assert table.metadata().configuration[READER] == "v2"
    assert table.metadata().configuration["delta.enableChangeDataFeed"] == "true"  # kept
    got = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert got == [{"id": 1, "name": "n1", "email": None}, {"id": 2, "name": "n2", "email": None},
                   {"id": 3, "name": "n3", "email": "e3"}]
    assert sink.target.pending is None and sink.target.table_schema.names == V2.names
    # the next appends are plain ones again, straight into the log
    assert sink.commit_epoch(3, rows([4], V2), {"e": 3}).version == result.version + 1
    assert sink.target.last_direct == result.version + 1
    # a sink made again from the grown table (a restart) goes on appending there
    again = DeltaEpochSink(str(path), "job", V2)
    assert again.recover().epoch == 3
    assert again.commit_epoch(4, rows([5], V2), {"e": 4}).committed
    assert again.target.last_direct is not None
    assert sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).column("id").to_pylist()) == [
        1, 2, 3, 4, 5]


def test_a_growth_of_properties_alone_is_committed_too(path):
    sink = DeltaEpochSink(str(path), "job", V1, extra_properties={READER: "v1"})
    sink.commit_epoch(1, rows([1]), {"e": 1})
    assert sink.grow(V1, {READER: "v1"}) == [] and sink.target.pending is None
    assert sink.grow(V1, {READER: "v2"}) == []
    result = sink.commit_epoch(2, rows([2]), {"e": 2})
    assert "metaData" in {next(iter(line)) for line in log_lines(path, result.version)}
    assert DeltaTable(str(path)).metadata().configuration[READER] == "v2"


@pytest.mark.parametrize(("output", "said"), [
    (pa.schema([("id", pa.int32()), ("name", pa.string())]), "change type"),
    (pa.schema([("id", pa.int64())]), "would go"),
    (pa.schema([("id", pa.int64()), ("name", pa.string()), pa.field("x", pa.int64(), nullable=False)]),
     "not nullable"),
])
def test_a_change_that_is_not_an_addition_is_refused_naming_the_column(path, output, said):
    sink = DeltaEpochSink(str(path), "job", V1)
    sink.commit_epoch(1, rows([1]), {"e": 1})
    with pytest.raises(DeltaSinkError, match=said):
        sink.grow(output, {})
    assert sink.target.pending is None and sink.arrow_schema.equals(V1)


def test_a_version_taken_before_the_growth_is_written_is_retried_and_lands_once(path, monkeypatch):
    sink = DeltaEpochSink(str(path), "job", V1)
    sink.commit_epoch(1, rows([1]), {"e": 1})
    real = sink_table.write_append

    def write(*a, **kw):
        monkeypatch.setattr(sink_table, "write_append", real)
        DeltaTable(str(path)).alter.set_table_properties({"delta.logRetentionDuration": "interval 2 days"})
        return real(*a, **kw)

    monkeypatch.setattr(sink_table, "write_append", write)
    sink.grow(V2, {})
    result = sink.commit_epoch(2, rows([2], V2), {"e": 2})
    assert result.committed
    table = DeltaTable(str(path))
    assert table.schema().to_arrow().names == V2.names and table.transaction_version("job") == 2
    # the other writer's property stays: the growth's metaData was built on the reloaded table
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 2 days"
    assert sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()) == [1, 2]


def test_a_table_whose_appends_take_delta_rs_cannot_grow_and_says_why(path):
    sink = DeltaEpochSink(str(path), "job", V1)
    sink.commit_epoch(1, rows([1]), {"e": 1})
    DeltaTable(str(path)).alter.add_constraint({"positive": "id > 0"})
    sink.grow(V2, {})
    with pytest.raises(DeltaSinkError, match="cannot grow"):
        sink.commit_epoch(2, rows([2], V2), {"e": 2})
    assert DeltaTable(str(path)).schema().to_arrow().names == V1.names
