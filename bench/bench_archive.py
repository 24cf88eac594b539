"""History from an archive table vs the same offsets from Kafka, same width, one run (``archive.``).

One topic of ``BENCH_ARCHIVE_RECORDS`` (1,000,000; 100,000 with ``--quick``) ~130-byte records on 2
partitions of the embedded broker. Its archive is an identity copy of the log (a plain Spark batch read
written as a Delta table: Kafka's columns, each offset once, so ``trusted``). Then, alternating over
``BENCH_ARCHIVE_ROUNDS`` (2) rounds, a fresh in-process daemon (``local[2]``, the history width fixed at 2
tasks, a 0.5 s trigger, the archive configured) copies the whole history with one job from ``earliest``:
reading Kafka
(``history_source = "kafka"``) or the archive (``auto``: a trusted archive holding every offset is read
for all of them; a job without a transform takes its files whole). Timed from create to Finished (the
same trigger phase: just after an epoch). Keys:

* ``archive.kafka_s``, ``archive.archive_s`` (medians), ``archive.ratio_vs_kafka`` = kafka / archive
  (goal >= 2.0: a columnar table should beat fetching from the broker);
* ``archive.kafka_tier_offsets``: history offsets the archive job planned from Kafka (goal 0: its history
  issues no broker read);
* ``archive.broker_bytes``: record bytes (key + value) the archive copies' history reads fetched from the
  broker (``job_history_broker_bytes_total``; goal 0), beside ``archive.kafka_broker_bytes``, the Kafka
  copies' (each copy's, the median);
* ``archive.kafka_read_s``, ``archive.archive_read_s``, ``archive.read_ratio_vs_kafka``: the seconds of
  the copies' reads ahead alone (without the epoch boundaries a copy waits for).

The first copy of each kind warms up, untimed.

The same again with a transform (``SELECT * FROM {source}``: it changes nothing, but a job with a
transform never takes an archive's file whole, so both tiers read and write every row):
``archive.transformed.kafka_s``, ``archive.transformed.archive_s``, ``archive.transformed.ratio_vs_kafka``,
``archive.transformed.read_ratio_vs_kafka``. ``archive.whole_files``: the archive's data files the copies
without a transform took whole (linked into their tables instead of read: the archive here is 2 files, one
per partition, each inside the history copied). ``archive.broker_bytes`` is the largest over all archive
copies, with and without the transform.

Why a 0.5 s trigger: a copy ends at an epoch, so its time is rounded up to the trigger. Created just after
one, the earliest a copy can be Finished is the next epoch, however fast its history was copied (a copy
taking files whole is done in ~10 ms): at a 1 s trigger the archive copy ends at ~1.07 s and Kafka's, whose
read takes ~1.7 s, at ~2.0 s, so the ratio cannot pass ~1.9 however fast the archive is read. The identity
pair at the default 1 s trigger is reported beside: ``archive.trigger_1s.kafka_s``,
``archive.trigger_1s.archive_s``, ``archive.trigger_1s.ratio_vs_kafka``.

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
#: The transform of the copies that must read every row (it changes nothing: a read, not a link).
TRANSFORM = "SELECT * FROM {source}"


#: The copies measured: (key, history_source, transform). A job without a transform takes a trusted
#: archive's files whole (linked); a transform makes every copy read and write its rows.
KINDS = (("kafka", "kafka", None), ("auto", "auto", None),
         ("kafka_t", "kafka", TRANSFORM), ("auto_t", "auto", TRANSFORM),
         ("kafka_1s", "kafka", None), ("auto_1s", "auto", None))
#: The trigger interval of the copies (the ``_1s`` kinds: 1 s, the default trigger).
TRIGGER_S = 0.5


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
    kinds = {key: (source, transform) for key, source, transform in KINDS}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    reads: dict[str, list[float]] = {k: [] for k in kinds}
    from_broker: dict[str, list[int]] = {k: [] for k in kinds}
    whole: list[int] = []
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
            keys = [k for k, _, _ in KINDS]
            order = [k for r in range(ROUNDS) for k in (keys if r % 2 == 0 else keys[::-1])]
            for i, key in enumerate([*keys, *order]):  # the first of each kind warms up, untimed
                source, transform = kinds[key]
                tag = f"{key}-{i}"
                more: dict[str, Any] = {"archive": archive,
                                        "trigger_interval_s": 1.0 if key.endswith("_1s") else TRIGGER_S}
                daemon = _daemon(work, tag, bootstrap, topic, {"fixed_tasks": 2}, **more)
                try:
                    read_s.start()
                    spec: dict[str, Any] = {"history_source": source}
                    if transform:
                        spec["transform"] = transform
                    seconds = _copy(daemon, f"h{i}", work / f"table-{tag}", **spec)
                    fetched = daemon.sources["bench"].jobs[f"h{i}"].history.broker_bytes()
                finally:
                    daemon.stop()
                copied = DeltaTable(str(work / f"table-{tag}")).to_pyarrow_dataset().count_rows()
                if copied != RECORDS:
                    msg = f"archive bench: the {key} copy holds {copied} rows of {RECORDS}"
                    raise RuntimeError(msg)
                if i < len(keys):
                    continue
                times[key].append(round(seconds, 2))
                from_broker[key].append(fetched)
                reads[key].append(round(read_s.total, 2))
                if source == "auto":
                    kafka_tier += _job_total(metrics.JOB_HISTORY_TIER_OFFSETS, f"h{i}", tier="kafka")
                if key == "auto":
                    whole.append(int(_job_total(metrics.JOB_HISTORY_WHOLE_FILES, f"h{i}")))
                print(f"history copy from {'Kafka' if source == 'kafka' else 'the archive'}"
                      f"{' with a transform' if transform else ''}: {seconds:.1f}s (its reads ahead "
                      f"{read_s.total:.1f}s)", flush=True)
                shutil.rmtree(work / f"table-{tag}", ignore_errors=True)
            half = _half_and_half(work, spark, options, admin, bootstrap, topic, splits, ends)
            spark.stop()
    finally:
        read_s.stop()
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    read_med = {k: statistics.median(v) for k, v in reads.items()}
    result = {
        "archive.records": RECORDS,
        "archive.kafka_s": med["kafka"],
        "archive.archive_s": med["auto"],
        "archive.ratio_vs_kafka": round(med["kafka"] / med["auto"], 3),
        "archive.kafka_runs_s": times["kafka"],
        "archive.archive_runs_s": times["auto"],
        "archive.whole_files": int(statistics.median(whole)),
        "archive.kafka_tier_offsets": int(kafka_tier),
        "archive.broker_bytes": int(max(from_broker["auto"] + from_broker["auto_t"])),
        "archive.kafka_broker_bytes": int(statistics.median(from_broker["kafka"])),
        "archive.kafka_read_s": read_med["kafka"],
        "archive.archive_read_s": read_med["auto"],
        "archive.read_ratio_vs_kafka": round(read_med["kafka"] / max(read_med["auto"], 1e-9), 3),
        "archive.transformed.kafka_s": med["kafka_t"],
        "archive.transformed.archive_s": med["auto_t"],
        "archive.transformed.ratio_vs_kafka": round(med["kafka_t"] / med["auto_t"], 3),
        "archive.transformed.kafka_runs_s": times["kafka_t"],
        "archive.transformed.archive_runs_s": times["auto_t"],
        "archive.transformed.read_ratio_vs_kafka": round(read_med["kafka_t"] / max(read_med["auto_t"], 1e-9),
                                                         3),
        "archive.trigger_s": TRIGGER_S,
        "archive.trigger_1s.kafka_s": med["kafka_1s"],
        "archive.trigger_1s.archive_s": med["auto_1s"],
        "archive.trigger_1s.ratio_vs_kafka": round(med["kafka_1s"] / med["auto_1s"], 3),
        "archive.trigger_1s.kafka_runs_s": times["kafka_1s"],
        "archive.trigger_1s.archive_runs_s": times["auto_1s"],
    }
    result.update(half)
    print(f"  history from the archive {med['auto']:.2f}s vs from Kafka {med['kafka']:.2f}s: ratio "
          f"{result['archive.ratio_vs_kafka']} (goal >= 2.0; {result['archive.whole_files']} files taken "
          f"whole); with a transform {med['auto_t']:.2f}s vs {med['kafka_t']:.2f}s: ratio "
          f"{result['archive.transformed.ratio_vs_kafka']}; at a 1 s trigger {med['auto_1s']:.2f}s vs "
          f"{med['kafka_1s']:.2f}s: ratio {result['archive.trigger_1s.ratio_vs_kafka']}; Kafka offsets "
          "planned by the archive copies: "
          f"{result['archive.kafka_tier_offsets']} (goal 0); bytes from the broker: archive copies "
          f"{result['archive.broker_bytes']:,} (goal 0), Kafka copy {result['archive.kafka_broker_bytes']:,}",
          flush=True)
    return result


def _job_total(counter: Any, job: str, **labels: str) -> float:  # noqa: ANN401 - a prometheus Counter
    """The ``_total`` of ``counter`` for ``job`` (and ``labels``)."""
    return float(sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")
                     and s.labels.get("job") == job and all(s.labels.get(k) == v for k, v in labels.items())))


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
