"""Cluster mode: the daemon's Spark runs on a standalone master with one worker (two JVMs on loopback);
a job backfills through the cluster's executors exactly once."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from source_backfill.testing import RunningDaemon
from tests.fixtures.spark_cluster import spark_standalone

pytestmark = pytest.mark.integration


def _daemon_on(cluster: Any, tmp_path: Path, bootstrap: str, topic: str, *,
               table: Path | None = None, **conf: str) -> RunningDaemon:
    """A daemon process started on ``cluster``'s master, one source on ``topic``; ``conf`` over the base.

    ``table``: a delta source ``tbl`` too, whose snapshot copies go by files on Spark.
    """
    base = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "1g", "spark.cores.max": "2"}
    (tmp_path / "daemon").mkdir()
    sources: list[dict[str, Any]] = [{"name": "src", "topics": [topic]}]
    if table is not None:
        sources.append({"name": "tbl", "kind": "delta", "table_path": str(table), "primary_key": ["id"],
                        "spark_copy_rows": 0})
    daemon = RunningDaemon(tmp_path / "daemon", bootstrap, sources, [],
                           {"spark": {"master": cluster.master, "conf": {**base, **conf}}})
    daemon.start()
    return daemon


@pytest.mark.slow  # ~20 s; make test-slow (CI) runs it beside the two-worker test, make test stays < 20 min
def test_a_job_backfills_exactly_once_through_a_standalone_cluster(tmp_path, kafka_bootstrap, kafka_admin):
    from confluent_kafka import Producer

    from source_backfill.verify import check_exactly_once

    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    kafka_admin.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(2000):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0

    with spark_standalone(tmp_path / "cluster") as cluster:
        daemon = _daemon_on(cluster, tmp_path, kafka_bootstrap, topic)
        try:
            daemon.wait_ready(240)
            apps = cluster.status()["activeapps"]
            assert [a["name"] for a in apps] == ["source-backfill"], apps  # the daemon is the cluster's app
            assert apps[0]["cores"] >= 1  # with executors on the worker
            daemon.create_job(name="c", source="src")
            job = daemon.wait_finished("c", timeout_s=240)
            assert job["rows_history"] >= 2000
            report = check_exactly_once(str(daemon.tables / "c"), kafka_bootstrap, [topic])
            assert report.ok, report.summary()
            assert f'master="{cluster.master}"' in daemon.log.read_text()
        finally:
            daemon.stop()


def _rest(ui: str, path: str) -> Any:
    """One GET of the driver's REST API at ``ui``."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{ui}/api/v1/{path}", timeout=10) as r:  # noqa: S310 - loopback
        return json.load(r)


def _registered_executors(ui: str) -> set[str]:
    """The executors the driver's scheduler has now (not the master's view: it lags the driver's)."""
    app = _rest(ui, "applications")[0]["id"]
    return {e["id"] for e in _rest(ui, f"applications/{app}/executors")} - {"driver"}


def _history_task_executors(ui: str, group: str = "history-") -> set[str]:
    """The executors the daemon's history reads ahead (or other jobs of ``group``) ran tasks on, from its
    driver's REST API."""
    def get(path: str) -> Any:
        return _rest(ui, path)

    app = get("applications")[0]["id"]
    executors: set[str] = set()
    for job in get(f"applications/{app}/jobs"):
        if not str(job.get("jobGroup") or "").startswith(group):
            continue
        for stage in job["stageIds"]:
            for attempt in get(f"applications/{app}/stages/{stage}"):
                tasks = get(f"applications/{app}/stages/{stage}/{attempt['attemptId']}/taskList?length=1000")
                executors |= {t["executorId"] for t in tasks}
    return executors


@pytest.mark.slow
def test_a_backfills_history_tasks_run_on_both_executors_of_a_two_worker_cluster(
    tmp_path, kafka_bootstrap, kafka_admin
):
    """Two workers of one core each: the daemon's lone job copies its one partition in offset pieces, as
    many tasks as the cluster's cores, and Spark's own status shows them on both executors; exactly once.
    Then a snapshot job of a delta source copies its 8-file table by files: its Spark tasks too ran on
    both executors, and its table equals the source row for row."""
    from confluent_kafka import Producer

    from source_backfill.testing.process import free_port
    from source_backfill.verify import check_exactly_once

    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    kafka_admin.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(200_000):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
        if i % 50_000 == 49_999:
            assert producer.flush(60) == 0
    assert producer.flush(60) == 0

    from source_backfill.testing.delta import ChangingTable, as_rows

    table = ChangingTable.create(str(tmp_path / "table"), 80_000, seed=4, files=8)
    with spark_standalone(tmp_path / "cluster", cores=1, memory="1g", workers=2) as cluster:
        ui_port = free_port()
        daemon = _daemon_on(cluster, tmp_path, kafka_bootstrap, topic, table=tmp_path / "table", **{
            "spark.executor.memory": "768m", "spark.ui.enabled": "true", "spark.ui.port": str(ui_port)})
        try:
            daemon.wait_ready(240)
            apps = cluster.status()["activeapps"]
            assert apps[0]["cores"] == 2, apps  # one executor on each worker
            # ready means both executors registered with the driver (the session waits for
            # spark.cores.max), so the width read both slots: a CI run once had one, and one task
            assert len(_registered_executors(f"http://127.0.0.1:{ui_port}")) == 2
            daemon.create_job(name="wide", source="src")
            job = daemon.wait_finished("wide", timeout_s=300)
            assert job["rows_history"] >= 200_000
            executors = _history_task_executors(f"http://127.0.0.1:{ui_port}")
            assert len(executors - {"driver"}) == 2, executors
            report = check_exactly_once(str(daemon.tables / "wide"), kafka_bootstrap, [topic])
            assert report.ok, report.summary()
            daemon.create_job(name="copy", source="tbl", strategy="snapshot")
            daemon.wait_finished("copy", timeout_s=300)
            copied = _history_task_executors(f"http://127.0.0.1:{ui_port}", group="table-copy-copy")
            assert len(copied - {"driver"}) == 2, copied
            from deltalake import DeltaTable

            assert as_rows(DeltaTable(str(daemon.tables / "copy")).to_pyarrow_table()) == table.expected()
        finally:
            daemon.stop()


@pytest.mark.slow
def test_a_transform_exhausting_an_executors_memory_fails_its_job_alone(
    tmp_path, kafka_bootstrap, kafka_admin
):
    """On a cluster the memory a transform can exhaust is an executor's: that executor dies (the worker
    starts another), the job fails with Spark's error, and the daemon, its JVM and the other job go on."""
    import time

    from confluent_kafka import Producer

    from source_backfill.verify import check_exactly_once

    topic = f"cluster-oom-{uuid.uuid4().hex[:8]}"
    kafka_admin.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(200):
        producer.produce(topic, value=f"value-{i:04d}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    # ~10 chars x 200M = a 2 GB string per row: far past a 512 MB executor's heap, built only from allowed
    # functions (the check cannot know how much memory a query will take; the executor's heap bounds it)
    hog = ("SELECT topic, partition, offset, length(repeat(CAST(value AS STRING), 200000000)) AS n "
           "FROM {source}")
    with spark_standalone(tmp_path / "cluster", memory="2g") as cluster:
        daemon = _daemon_on(cluster, tmp_path, kafka_bootstrap, topic, **{
            "spark.executor.memory": "512m", "spark.task.maxFailures": "2"})
        try:
            daemon.wait_ready(240)
            daemon.create_job(name="hog", source="src", transform=hog)
            daemon.create_job(name="plain", source="src")
            daemon.wait_finished("plain", timeout_s=240)
            deadline = time.monotonic() + 300
            while daemon.job("hog")["status"] != "failed":
                assert time.monotonic() < deadline, daemon.tail()
                time.sleep(1)
            error = daemon.job("hog")["error"]
            assert "Job aborted" in error or "OutOfMemoryError" in error or "exited" in error, error
            # the driver JVM and the daemon are alive and the other job keeps its promise
            assert daemon.get("/live").status_code == 200
            assert daemon.job("plain")["status"] == "finished"
            for i in range(200, 260):
                producer.produce(topic, value=f"value-{i:04d}".encode(), partition=i % 2)
            assert producer.flush(30) == 0
            deadline = time.monotonic() + 120
            while daemon.job("plain")["rows_live"] < 60:
                assert time.monotonic() < deadline, daemon.tail()
                time.sleep(1)
            report = check_exactly_once(str(daemon.tables / "plain"), kafka_bootstrap, [topic])
            assert report.ok, report.summary()
        finally:
            daemon.stop()
