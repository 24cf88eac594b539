"""A namespace's table bytes of the day on real Delta tables: counted from the log by version, saved
whole and read back after a kill, held once written (creates refused), a new day starting at 0."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from connectors.delta.log import added_bytes
from source_backfill import metrics
from source_backfill.config import JobSpec, NamespaceConfig
from source_backfill.core.quota import DAY_S
from source_backfill.errors import QuotaExceededError, StateFormatError
from source_backfill.runtime.quotas import FILE_NAME, TableBytes
from source_backfill.runtime.registry import JobRegistry


def _append(path: Path, rows: int) -> int:
    rows_table = pa.table({"v": pa.array([f"row-{i:08d}" for i in range(rows)])})
    write_deltalake(str(path), rows_table, mode="append")
    return DeltaTable(str(path)).version()


def _files_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.parquet"))


class Clock:
    def __init__(self) -> None:
        self.now = 100 * DAY_S + 10.0

    def __call__(self) -> float:
        return self.now


def test_added_bytes_is_the_versions_new_files_sizes(tmp_path):
    table = tmp_path / "t"
    v0 = _append(table, 1000)
    assert added_bytes(str(table), v0)[0] == _files_bytes(table) > 0
    before = {f.name for f in table.glob("*.parquet")}
    v1 = _append(table, 10)
    new = [f for f in table.glob("*.parquet") if f.name not in before]
    size, ts = added_bytes(str(table), v1)
    assert size == sum(f.stat().st_size for f in new)
    assert isinstance(ts, int)
    assert added_bytes(str(table), v1 + 1) is None


def test_counts_survive_a_kill_and_hold_the_namespace_once_written(tmp_path):
    clock = Clock()
    namespaces = {"a": NamespaceConfig(name="a", max_bytes_per_day=1), "b": NamespaceConfig(name="b")}
    table = tmp_path / "t"
    versions = [_append(table, 100) for _ in range(3)]
    one = added_bytes(str(table), 0)[0]
    clock.now = added_bytes(str(table), 0)[1] / 1000  # the versions' day
    (tmp_path / "state").mkdir()
    quota = TableBytes(tmp_path / "state", namespaces, clock=clock)
    assert quota.counts("a") and not quota.counts("b")
    assert quota.held("a") is None
    quota.count("a.j", "a", str(table), versions[0])  # new to the ledger: saved at once
    assert json.loads((tmp_path / "state" / FILE_NAME).read_text())["versions"] == {"a.j": 0}
    quota.count("a.j", "a", str(table), versions[2])  # within the second: not saved yet; killed here
    why = quota.held("a")
    assert why is not None and "max_bytes_per_day" in why
    assert metrics.NAMESPACE_HISTORY_HELD.labels("a")._value.get() == 1
    with pytest.raises(QuotaExceededError, match="max_bytes_per_day"):
        quota.check_create("a")
    quota.count("b.j", "b", str(table), versions[2])  # a namespace without a bound counts nothing
    assert quota.held("b") is None

    again = TableBytes(tmp_path / "state", namespaces, clock=clock)  # after the kill: version 0 counted
    assert again._ledger.used("a", again._ledger.day) == one
    again.count("a.j", "a", str(table), versions[2])  # the first commit after: 1 and 2 counted now
    total = sum(added_bytes(str(table), v)[0] for v in versions)
    assert again._ledger.used("a", again._ledger.day) == total
    again.save(force=True)
    reread = TableBytes(tmp_path / "state", namespaces, clock=clock)
    assert reread._ledger.used("a", again._ledger.day) == total

    clock.now += DAY_S  # the next day: nothing written yet, copies resume, creates accepted
    assert again.held("a") is None
    again.check_create("a")
    assert metrics.NAMESPACE_HISTORY_HELD.labels("a")._value.get() == 0


def test_a_ledger_file_that_cannot_be_read_stops_the_start_saying_how_to_go_on(tmp_path):
    (tmp_path / FILE_NAME).write_text('{"day": 1, "written": {"a": "lots"}, "versions": {}}')
    with pytest.raises(StateFormatError, match="remove it"):
        TableBytes(tmp_path, {"a": NamespaceConfig(name="a", max_bytes_per_day=10)})


def test_the_registry_refuses_a_create_of_a_namespace_that_wrote_its_bytes_and_forgets_dropped_jobs(tmp_path):
    table = tmp_path / "data" / "a" / "t"
    _append(table, 100)
    registry = JobRegistry(tmp_path / "state", ["src"],
                           namespaces=[NamespaceConfig(name="a", max_bytes_per_day=1)])
    spec = JobSpec(name="a.j", namespace="a", source="src", sink_path=str(tmp_path / "data" / "a" / "j"))
    registry.create(spec)
    assert registry.table_bytes is not None
    registry.table_bytes.count("a.j", "a", str(table), 0)
    with pytest.raises(QuotaExceededError, match="wrote .* bytes to its tables today"):
        registry.create(spec.model_copy(update={"name": "a.k", "sink_path": str(tmp_path / "data/a/k")}))
    registry.drop("a.j")
    assert "a.j" not in registry.table_bytes._ledger.versions
    registry.close()


def test_no_ledger_without_a_namespace_that_bounds_its_bytes(tmp_path):
    registry = JobRegistry(tmp_path / "state", ["src"], namespaces=[NamespaceConfig(name="a")])
    assert registry.table_bytes is None
    assert not (tmp_path / "state" / FILE_NAME).exists()
    registry.close()
