"""Factories for Delta sink tests: a sink on a fresh table path, rows of the test schema, readers."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from connectors.delta import DeltaEpochSink
from connectors.delta.maintenance import STAGING

SCHEMA = "id long, name string"


@pytest.fixture
def rows(spark):
    """``rows(ids)``: a DataFrame of ``(id, "n<id>")`` rows."""

    def make(ids, schema=SCHEMA):
        return spark.createDataFrame([(i, f"n{i}") for i in ids], schema)

    return make


@pytest.fixture
def sink_factory(spark, tmp_path):
    """``sink_factory(name="t", job="job", **kw)``: a sink on ``tmp_path/name`` with the test schema."""

    def make(name="t", job="job", schema=SCHEMA, **kw):
        return DeltaEpochSink(str(tmp_path / name), job, spark.createDataFrame([], schema).schema, **kw)

    return make


def table_ids(path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def attempt_files(path) -> set[Path]:
    """Every Parquet file under the table's attempt folders."""
    staging = Path(path) / STAGING
    return set(staging.rglob("*.parquet")) if staging.exists() else set()


def referenced_files(path) -> set[Path]:
    return {Path(u.removeprefix("file://")) for u in DeltaTable(str(path)).file_uris()}


def run_epoch(source, timeout_s: float = 300.0) -> None:
    """One epoch of a delta source, run by the test, and every step of it ended.

    A step may outlive its epoch on the job's lane (the epoch waits two triggers); the tests drive epochs
    one by one and look at the jobs' tables after each, so they wait for the lanes too.
    """
    source.run_epoch()
    for name in source.lanes.busy_jobs():
        assert source.lanes.wait_idle(name, timeout_s), f"job {name}'s step still runs after {timeout_s} s"
