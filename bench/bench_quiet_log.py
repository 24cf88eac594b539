"""What a job's table costs when little happens (issue 27): commits of idle jobs, bytes and recovery at 10k.

* ``quiet.idle_commits_per_hour``: table versions added per hour by a Finished job on an idle
  100-partition topic (a daemon, Spark's connector) plus a live table job on a quiet Delta table (its
  source's own loop), both at a 1 s trigger, counted over ``WINDOW_S`` seconds after they settled and
  scaled to an hour (goal 0); ``quiet.idle_epochs`` shows the epochs did run meanwhile. Before: one
  version per trigger per job, 3,600 an hour each.
* ``quiet.commit_bytes_10k_one_moving``: the mean commit file of a job on 10,000 splits where one split
  moves per epoch (one live row written, its position moved), over ``COMMITS`` commits made by the
  executor's own commit path (state, plan summary, add action; the first commit's full snapshot
  included, as one per ``SnapshotPolicy.every`` commits is; goal <= 4 kB; ``..._p50``: a delta).
  A synthetic job: the 10,000 splits are ``t<i>:0`` of a state the codec writes, no broker or Spark
  (10,000 partitions do not fit 2 cores). Before: every commit held all 10,000 splits, ~1.3 MB.
* ``quiet.recovery_s_10k``: from opening that table (a new sink) to holding the job's exact state after
  those commits (goal <= 2 s).

``BENCH_QUICK=1``: a 10 s window and 200 commits.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

QUICK = os.environ.get("BENCH_QUICK") == "1"
WINDOW_S = 10.0 if QUICK else 60.0
COMMITS = 200 if QUICK else 1000
SPLITS = 10_000
PARTITIONS = 100


def _versions(path: Path) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(str(path)).version())


def _settle(paths: list[Path], quiet_s: float = 5.0, limit_s: float = 120.0) -> None:
    """Wait until none of the tables got a version for ``quiet_s`` (the last rows committed)."""
    last, since, end = [_versions(p) for p in paths], time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() - since < quiet_s and time.monotonic() < end:
        time.sleep(0.5)
        now = [_versions(p) for p in paths]
        if now != last:
            last, since = now, time.monotonic()


def _idle(bootstrap: str, work: Path) -> dict[str, Any]:
    """Versions per hour of a Finished Kafka job on an idle topic and a live table job on a quiet table."""
    from confluent_kafka import Producer

    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.config import JobSpec, SourceConfig, load_settings
    from source_backfill.daemon import Daemon
    from source_backfill.runtime.registry import JobRegistry
    from source_backfill.runtime.table_source import TableLiveSource
    from source_backfill.testing.delta import ChangingTable

    topic = f"quiet-{int(time.time())}"
    KafkaAdmin(bootstrap).create_topic(topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    for i in range(PARTITIONS * 10):
        producer.produce(topic, value=f"r{i}".encode(), partition=i % PARTITIONS)
    producer.flush(30)
    kafka_job, table_job = work / "kafka-job", work / "table-job"
    settings = load_settings(
        daemon={"state_root": str(work / "state")}, api={"port": 0}, metrics={"port": None},
        sources=[{"name": "src", "bootstrap_servers": bootstrap, "topics": [topic],
                  "trigger_interval_s": 1.0}],
        jobs=[{"name": "idle", "source": "src", "sink_path": str(kafka_job)}],
    )
    up = ChangingTable.create(str(work / "table-src"), 2000, seed=1)
    registry = JobRegistry(work / "table-state", ["t"])
    registry.create(JobSpec(name="live", source="t", sink_path=str(table_job), strategy="snapshot",
                            mode="merge"))
    table_source = TableLiveSource(SourceConfig(name="t", kind="delta", table_path=str(work / "table-src"),
                                                primary_key=["id"], trigger_interval_s=1.0), registry)
    daemon = Daemon(settings)
    daemon.start()
    table_source.start()
    try:
        source = daemon.sources["src"]
        deadline = time.monotonic() + 240
        while not (source.jobs.get("idle") is not None and source.jobs["idle"].backfill_done
                   and table_source.jobs.get("live") is not None and table_source.jobs["live"].backfill_done
                   and table_source.jobs["live"].lag_versions == 0):
            if time.monotonic() > deadline:
                msg = "jobs not finished/live within 240 s"
                raise RuntimeError(msg)
            time.sleep(0.5)
        up.commit()  # one change on the quiet table: committed once, then nothing
        _settle([kafka_job, table_job])
        before = [_versions(kafka_job), _versions(table_job)]
        epochs = [source.last_epoch or 0, table_source.last_epoch or 0]
        time.sleep(WINDOW_S)
        added = [_versions(kafka_job) - before[0], _versions(table_job) - before[1]]
        ran = [(source.last_epoch or 0) - epochs[0], (table_source.last_epoch or 0) - epochs[1]]
    finally:
        table_source.stop()
        daemon.stop()
    scale = 3600.0 / WINDOW_S
    return {
        "quiet.idle_commits_per_hour": round(sum(added) * scale, 1),
        "quiet.idle_commits_per_hour_kafka": round(added[0] * scale, 1),
        "quiet.idle_commits_per_hour_table": round(added[1] * scale, 1),
        "quiet.idle_epochs": ran,
        "quiet.idle_window_s": WINDOW_S,
    }


def _ten_thousand(work: Path) -> dict[str, Any]:
    """Commit bytes with one of 10,000 splits moving per epoch, and the recovery after them."""
    import pyarrow as pa

    from connectors.delta.sink import DeltaEpochSink
    from connectors.kafka.ranges import kafka_arrow_schema
    from source_backfill.core import SplitState
    from source_backfill.core.columnar import SplitTable
    from source_backfill.core.state_log import SnapshotPolicy
    from source_backfill.executors.job_log import JobLog

    schema = kafka_arrow_schema()
    path = work / "ten-thousand"
    sink = DeltaEpochSink(str(path), "tenk", schema)
    log = JobLog(SnapshotPolicy(max_age_s=sink.log_retention_s() / 2))
    committed = None
    splits = [f"t{i}:0" for i in range(SPLITS)]
    states = SplitTable.from_states({s: SplitState.finished(99, 99, 100) for s in splits})
    end = dict.fromkeys(splits, 100)
    plan = type("Plan", (), {"history": (), "end": end})()
    sizes = []
    for epoch in range(1, COMMITS + 1):
        if epoch > 1:  # one split moves: a live row at its position
            split = splits[(epoch * 7919) % SPLITS]
            end = {**end, split: end[split] + 1}
            plan = type("Plan", (), {"history": (), "end": end})()
        record = {"topic": "t", "partition": 0, "offset": epoch, "key": b"k", "value": b"v",
                  "timestampType": 0}
        row = pa.Table.from_pylist([record], schema=schema)
        result = sink.commit_epoch(epoch, row, log.state_doc(committed, states, end),
                                   plan=log.plan_summary(plan, 0))
        log.landed(result.version, end)
        committed = states
        sizes.append((path / "_delta_log" / f"{result.version:020d}.json").stat().st_size)
    t0 = time.monotonic()
    opened = DeltaEpochSink(str(path), "tenk", schema)
    again = JobLog(SnapshotPolicy(max_age_s=opened.log_retention_s() / 2))
    head = opened.recover()
    if head is None:
        msg = "the table holds no commit of the job"
        raise RuntimeError(msg)
    recovered = again.recover(opened, head)
    recovery_s = time.monotonic() - t0
    same = dict(recovered.to_states()) == dict(states.to_states())
    if not same or again.covered_to != end:
        msg = "the recovered state differs from the state the job held"
        raise RuntimeError(msg)
    return {
        "quiet.commit_bytes_10k_one_moving": round(statistics.fmean(sizes)),
        "quiet.commit_bytes_10k_one_moving_p50": round(statistics.median(sizes)),
        "quiet.commit_bytes_10k_snapshot": max(sizes),
        "quiet.commits_10k": COMMITS,
        "quiet.recovery_s_10k": round(recovery_s, 3),
    }


def main() -> dict[str, Any]:
    from connectors.kafka.embedded import EmbeddedBroker
    from source_backfill.runtime.spark import build_spark

    work = Path(tempfile.mkdtemp(prefix="bench-quiet-log-"))
    result: dict[str, Any] = {}
    try:
        result.update(_ten_thousand(work))
        r = result
        print(f"  10k splits, one moving per epoch: {r['quiet.commit_bytes_10k_one_moving']} B per commit "
              f"on average over {COMMITS} commits (p50 {r['quiet.commit_bytes_10k_one_moving_p50']} B, "
              f"snapshot {r['quiet.commit_bytes_10k_snapshot']} B; goal <= 4096 B); recovery "
              f"{r['quiet.recovery_s_10k']:.3f} s (goal <= 2 s)", flush=True)
        broker = EmbeddedBroker().start()
        try:
            build_spark("local[*]", "bench-quiet-log")
            result.update(_idle(broker.bootstrap, work))
        finally:
            broker.stop()
        print(f"  idle jobs at a 1 s trigger: {r['quiet.idle_commits_per_hour']} versions/hour (Kafka "
              f"{r['quiet.idle_commits_per_hour_kafka']}, table {r['quiet.idle_commits_per_hour_table']}) "
              f"over {WINDOW_S:.0f} s in which {r['quiet.idle_epochs']} epochs ran (goal 0)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
