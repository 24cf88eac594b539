"""Merge mode: a changelog applied by key, exactly once per epoch, visible in the change feed."""

from __future__ import annotations

import threading

import pytest
from deltalake import DeltaTable

from connectors.delta import DeltaTableSource

pytestmark = pytest.mark.integration

CHANGELOG = "id long, name string, _change_type string"


def content(path):
    table = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(zip(table.column("id").to_pylist(), table.column("name").to_pylist(), strict=True))


def test_merge_mode_applies_upserts_and_deletes_once(spark, sink_factory, tmp_path):
    s = sink_factory(name="m", schema=CHANGELOG, mode="merge", key_columns=["id"])
    assert "_change_type" not in s.arrow_schema.names
    s.commit_epoch(1, spark.createDataFrame([(1, "a", "insert"), (2, "b", "insert")], CHANGELOG), {})
    changes = [(1, "a", "update_preimage"), (1, "A", "update_postimage"), (2, "b", "delete"),
               (3, "c", "insert"), (4, "d", "insert"), (4, "d", "delete"), (9, "x", "delete")]
    result = s.commit_epoch(2, spark.createDataFrame(changes, CHANGELOG), {"e": 2})
    assert result.committed
    for _ in range(2):  # replays: skipped
        assert not s.commit_epoch(2, spark.createDataFrame([(7, "z", "insert")], CHANGELOG), {}).committed
    assert content(tmp_path / "m") == [(1, "A"), (3, "c")]
    assert s.recover().state == {"e": 2}
    assert s.commit_epoch(3, None, {"e": 3}).committed  # empty epoch: state only
    assert s.recover().state == {"e": 3}
    feed = DeltaTableSource(str(tmp_path / "m")).changes_arrow(2, 2).to_pylist()
    got = sorted((r["id"], r["name"], r["_change_type"]) for r in feed)
    assert got == [(1, "A", "update_postimage"), (1, "a", "update_preimage"), (2, "b", "delete"),
                   (3, "c", "insert")]


def test_concurrent_duplicate_merges_resolve_to_one(spark, sink_factory, tmp_path):
    make = lambda: sink_factory(name="m", schema=CHANGELOG, mode="merge", key_columns=["id"])  # noqa: E731
    make().commit_epoch(1, None, {})
    sinks = [make() for _ in range(2)]
    frames = [spark.createDataFrame([(i, "v", "insert")], CHANGELOG) for i in (10, 20)]
    barrier = threading.Barrier(2)
    results = []

    def commit(s, df):
        barrier.wait()
        results.append(s.commit_epoch(2, df, {}))

    threads = [threading.Thread(target=commit, args=pair) for pair in zip(sinks, frames, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.committed for r in results) == [False, True]
    assert content(tmp_path / "m") in ([(10, "v")], [(20, "v")])
