"""History from an archive table vs the same offsets from Kafka, same width, one run (``archive.``).

One topic of ``BENCH_ARCHIVE_RECORDS`` (1,000,000; 100,000 with ``--quick``) ~130-byte records on 2
partitions of the embedded broker. Its archive is an identity copy of the log (a plain Spark batch read
written as a Delta table: Kafka's columns, each offset once, so ``trusted``). Then, alternating over
``BENCH_ARCHIVE_ROUNDS`` (2) rounds, a fresh in-process daemon (``local[2]``, the history width fixed at 2
tasks, the archive configured) copies the whole history with one job from ``earliest``: reading Kafka
(``history_source = "kafka"``) or the archive (``auto``: a trusted archive holding every offset is read
for all of them). Timed from create to Finished (the same trigger phase: just after an epoch). Keys:

* ``archive.kafka_s``, ``archive.archive_s`` (medians), ``archive.ratio_vs_kafka`` = kafka / archive
  (goal >= 2.0: a columnar table should beat fetching from the broker);
* ``archive.kafka_tier_offsets``: history offsets the archive job planned from Kafka (goal 0: its history
  issues no broker read);
* ``archive.broker_bytes``: record bytes (key + value) the archive copies' history reads fetched from the
  broker (``job_history_broker_bytes_total``; goal 0), beside ``archive.kafka_broker_bytes``, the Kafka
  copies' (each copy's, the median);
* ``archive.kafka_read_s``, ``archive.archive_read_s``, ``archive.read_ratio_vs_kafka``: the seconds of
  the copies' reads ahead alone (without the epoch boundaries a copy waits for).

The first two copies (one from each tier) warm up, untimed.

Then the hand-over under load: a second archive holds only the first half of each partition, which is
deleted from Kafka (``delete_records``), so the history's first half is only in the archive and its
second half only in Kafka; a job (``auto``) copies it while a producer writes 200 records/s, and is
checked offset by offset across the tiers (:func:`source_backfill.verify.verify_job` with the archive's
holdings) once Finished and the producer stopped: ``archive.half.exactly_once`` (1: no offset missing,
duplicated or unexpected), ``archive.half.s`` (create to Finished), ``archive.half.archive_offsets`` and
``archive.half.kafka_offsets`` (the tiers planned), ``archive.half.records`` (checked).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_scale_history import _copy, _daemon
from bench.meters import ReadSeconds
from bench.records import new_history

QUICK = os.environ.get("BENCH_QUICK") == "1"
RECORDS = int(os.environ.get("BENCH_ARCHIVE_RECORDS", "100000" if QUICK else "1000000"))
ROUNDS = int(os.environ.get("BENCH_ARCHIVE_ROUNDS", "2"))
PARTITIONS = 2


def main() -> dict[str, Any]:
    from deltalake import DeltaTable

    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker
    from connectors.kafka.spark_kafka import SparkKafkaConnector, read_ranges
    from source_backfill import metrics
    from source_backfill.config import SourceConfig
    from source_backfill.core import HistoryRange
    from source_backfill.runtime.spark import build_spark

    work = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    times: dict[str, list[float]] = {"kafka": [], "auto": []}
    reads: dict[str, list[float]] = {"kafka": [], "auto": []}
    from_broker: dict[str, list[int]] = {"kafka": [], "auto": []}
    kafka_tier = 0.0
    read_s = ReadSeconds()
    try:
        with EmbeddedBroker() as broker:
            bootstrap = broker.bootstrap
            admin = KafkaAdmin(bootstrap)
            topic = "bench-archive"
            new_history(admin, bootstrap, topic, RECORDS, PARTITIONS)
            splits = [f"{topic}:{p}" for p in range(PARTITIONS)]
            ends = admin.end_offsets(splits)
            spark = build_spark("local[2]", "bench-archive", python_sources=False)
            options = SparkKafkaConnector(SourceConfig(name="bench", topics=[topic]), bootstrap, spark,
                                          admin).reader_options()
            t = time.monotonic()
            ranges = [HistoryRange(s, 0, ends[s]) for s in splits]
            read_ranges(spark, ranges, options).write.format("delta").save(str(work / "archive"))
            held = DeltaTable(str(work / "archive")).to_pyarrow_dataset().count_rows()
            print(f"archive written in {time.monotonic() - t:.1f}s ({held:,} rows)", flush=True)
            archive = {"path": str(work / "archive"), "trusted": True}
            pairs = (("kafka", "auto"), ("auto", "kafka"))
            order = [w for r in range(ROUNDS) for w in pairs[r % 2]]
            for i, source in enumerate(["kafka", "auto", *order]):  # the first two warm up, untimed
                tag = f"{source}-{i}"
                daemon = _daemon(work, tag, bootstrap, topic, {"fixed_tasks": 2}, archive=archive)
                try:
                    read_s.start()
                    seconds = _copy(daemon, f"h{i}", work / f"table-{tag}", history_source=source)
                    fetched = daemon.sources["bench"].jobs[f"h{i}"].history.broker_bytes()
                finally:
                    daemon.stop()
                copied = DeltaTable(str(work / f"table-{tag}")).to_pyarrow_dataset().count_rows()
                if copied != RECORDS:
                    msg = f"archive bench: the {source} copy holds {copied} rows of {RECORDS}"
                    raise RuntimeError(msg)
                if i < 2:
                    continue
                times[source].append(round(seconds, 2))
                from_broker[source].append(fetched)
                reads[source].append(round(read_s.total, 2))
                if source == "auto":
                    kafka_tier += sum(s.value for m in metrics.JOB_HISTORY_TIER_OFFSETS.collect()
                                      for s in m.samples if s.name.endswith("_total")
                                      and s.labels.get("job") == f"h{i}" and s.labels.get("tier") == "kafka")
                print(f"history copy from {'Kafka' if source == 'kafka' else 'the archive'}: {seconds:.1f}s "
                      f"(its reads ahead {read_s.total:.1f}s)", flush=True)
                shutil.rmtree(work / f"table-{tag}", ignore_errors=True)
            half = _half_and_half(work, spark, options, admin, bootstrap, topic, splits, ends)
            spark.stop()
    finally:
        read_s.stop()
        shutil.rmtree(work, ignore_errors=True)
    kafka_s, archive_s = statistics.median(times["kafka"]), statistics.median(times["auto"])
    result = {
        "archive.records": RECORDS,
        "archive.kafka_s": kafka_s,
        "archive.archive_s": archive_s,
        "archive.ratio_vs_kafka": round(kafka_s / archive_s, 3),
        "archive.kafka_runs_s": times["kafka"],
        "archive.archive_runs_s": times["auto"],
        "archive.kafka_tier_offsets": int(kafka_tier),
        "archive.broker_bytes": int(statistics.median(from_broker["auto"])),
        "archive.kafka_broker_bytes": int(statistics.median(from_broker["kafka"])),
        "archive.kafka_read_s": statistics.median(reads["kafka"]),
        "archive.archive_read_s": statistics.median(reads["auto"]),
        "archive.read_ratio_vs_kafka": round(statistics.median(reads["kafka"])
                                             / max(statistics.median(reads["auto"]), 1e-9), 3),
    }
    result.update(half)
    print(f"  history from the archive {archive_s:.1f}s vs from Kafka {kafka_s:.1f}s: ratio "
          f"{result['archive.ratio_vs_kafka']} (goal >= 2.0); Kafka offsets planned by the archive job: "
          f"{result['archive.kafka_tier_offsets']} (goal 0); bytes from the broker: archive copy "
          f"{result['archive.broker_bytes']:,} (goal 0), Kafka copy {result['archive.kafka_broker_bytes']:,}",
          flush=True)
    return result


def _half_and_half(work: Path, spark: Any, options: dict[str, str], admin: Any, bootstrap: str,  # noqa: ANN401
                   topic: str, splits: list[str], ends: dict[str, int]) -> dict[str, Any]:
    """The first half of each partition only in an archive, the second only in Kafka, a live producer."""
    import threading

    from bench.records import live
    from connectors.delta.archive import archive_holdings
    from connectors.kafka.spark_kafka import read_ranges
    from source_backfill import metrics
    from source_backfill.core import HistoryRange
    from source_backfill.verify import verify_job

    halves = {s: ends[s] // 2 for s in splits}
    path = work / "half-archive"
    read_ranges(spark, [HistoryRange(s, 0, halves[s]) for s in splits], options).write.format("delta").save(
        str(path))
    if admin.delete_records(halves) != halves:
        msg = "archive bench: delete_records did not move the log start to the halves"
        raise RuntimeError(msg)
    stop = threading.Event()
    producer = threading.Thread(target=live, args=(bootstrap, topic, PARTITIONS, 200.0, stop), daemon=True)
    daemon = _daemon(work, "half", bootstrap, topic, {"fixed_tasks": 2}, archive={"path": str(path)})
    producer.start()
    try:
        seconds = _copy(daemon, "half", work / "table-half", history_source="auto")
        time.sleep(3)  # live rows after the hand-over
        stop.set()
        producer.join(30)
        source = daemon.sources["bench"]
        settled = source.last_epoch
        while source.last_epoch is not None and settled is not None and source.last_epoch < settled + 3:
            time.sleep(0.2)  # the last live records committed
    finally:
        stop.set()
        daemon.stop()

    def tier(name: str) -> int:
        return int(sum(s.value for m in metrics.JOB_HISTORY_TIER_OFFSETS.collect() for s in m.samples
                       if s.name.endswith("_total") and s.labels.get("job") == "half"
                       and s.labels.get("tier") == name))

    result = verify_job(str(work / "table-half"), "half", admin, bootstrap,
                        archive=archive_holdings(str(path)).held)
    totals = result.totals()
    print(f"  half archive, half Kafka, live producer: {result.summary()} ({seconds:.1f}s; archive "
          f"{tier('archive'):,} offsets, kafka {tier('kafka'):,})", flush=True)
    return {"archive.half.exactly_once": int(result.ok), "archive.half.s": round(seconds, 2),
            "archive.half.archive_offsets": tier("archive"), "archive.half.kafka_offsets": tier("kafka"),
            "archive.half.records": totals["records"]}


if __name__ == "__main__":
    main()
