"""Reading a job's history: planned offset ranges as rows, with the source's Kafka connector.

Two ways to take a range, one per use:

* :meth:`HistoryReader.rows` — a DataFrame of the ranges, for an epoch that reads its history itself
  (it is written with the live rows and the transform in the epoch's commit);
* :meth:`HistoryReader.stage` — the ranges copied into staged Parquet files of the job's table, for a
  read ahead that a later epoch adopts.

``connector = "spark"`` reads with Spark's Kafka source (:mod:`connectors.kafka.spark_kafka`);
``connector = "python"`` with the project's data source (:mod:`connectors.kafka.source`), whose read
ahead copies with pyarrow in a Spark task instead of through Spark's rows. Errors are the caller's: a
read that fails raises, and the job decides (back off, or fail on data loss).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from source_backfill.core import HistoryRange, parse_split_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from connectors.delta.sink import DeltaEpochSink, StagedFiles
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.config import SourceConfig

#: Spark tasks of one read ahead. One task copies 1M records in ~1.6 s alone and leaves the other task
#: slots to the live stream. With two on ``local[2]``, the live stream's tasks queued behind history for
#: seconds: live p99 went to 2.2-3.3x (bench/bench_backfill.py, three runs), where one task keeps 1.05-1.26x.
READ_AHEAD_TASKS = 1
#: CPU niceness of a Python connector's read-ahead copy (``connectors.kafka.source.write_ranges_parquet``):
#: on a busy machine the live stream's work gets the CPU first; on an idle one the copy runs at full speed.
#: bench_backfill, three runs each: niceness 10 kept live p99 at 1.05-1.15x, niceness 0 at 1.05-1.56x.
READ_AHEAD_NICENESS = 10


class HistoryReader:
    """Reads history ranges of one source for one job's sink."""

    def __init__(self, spark: SparkSession, source: SourceConfig, admin: KafkaAdmin, *,
                 bootstrap_servers: str) -> None:
        self.spark = spark
        self.source = source
        self.admin = admin
        self.bootstrap_servers = bootstrap_servers

    def rows(self, ranges: Sequence[HistoryRange], session: SparkSession | None = None) -> DataFrame:
        """The records of ``ranges`` as a DataFrame of ``session`` (default: the reader's)."""
        session = session or self.spark
        if self.source.connector == "spark":
            from connectors.kafka.spark_kafka import read_ranges, reader_options

            self._check_log_start(ranges)
            return read_ranges(session, ranges, reader_options(self.source, self.bootstrap_servers))
        from connectors.kafka.source import KAFKA_FORMAT, reader_options
        from source_backfill.runtime.spark import max_read_tasks

        spec = []
        for r in ranges:
            topic, partition = parse_split_id(r.split)
            spec.append({"topic": topic, "partition": partition, "start": r.start, "end": r.end})
        options = reader_options(self.source, self.bootstrap_servers,
                                 max_read_tasks(self.spark, self.source.max_read_tasks))
        return session.read.format(KAFKA_FORMAT).options(**options).option("ranges", json.dumps(spec)).load()

    def stage(self, sink: DeltaEpochSink, ranges: Sequence[HistoryRange],
              after_epoch: int) -> tuple[StagedFiles, dict[str, int]]:
        """Copy ``ranges`` into staged files of ``sink``'s table; the files and the rows per split.

        Runs as ``READ_AHEAD_TASKS`` Spark tasks (the caller picks the job group and the FAIR pool).
        """
        if self.source.connector == "spark":
            return self._stage_spark(sink, ranges, after_epoch)
        return self._stage_python(sink, ranges, after_epoch)

    def _stage_spark(self, sink: DeltaEpochSink, ranges: Sequence[HistoryRange],
                     after_epoch: int) -> tuple[StagedFiles, dict[str, int]]:
        rows = self.rows(ranges).coalesce(READ_AHEAD_TASKS)
        staged = sink.stage_dataframe(rows, after_epoch)
        return staged, _rows_per_split(staged.folder)

    def _stage_python(self, sink: DeltaEpochSink, ranges: Sequence[HistoryRange],
                      after_epoch: int) -> tuple[StagedFiles, dict[str, int]]:
        """The Python connector's reader and pyarrow's Parquet writer in Spark tasks.

        The rows need no transform, so they skip Spark's row conversion (a third of the CPU of a
        DataFrame copy).
        """
        from connectors.kafka.source import KafkaRange, write_ranges_parquet

        pieces = [KafkaRange(*parse_split_id(r.split), r.start, r.end) for r in ranges]
        slices = [part for i in range(READ_AHEAD_TASKS) if (part := pieces[i::READ_AHEAD_TASKS])]
        bootstrap, kafka = self.bootstrap_servers, dict(self.source.kafka)
        fail_on_data_loss, niceness = self.source.fail_on_data_loss, READ_AHEAD_NICENESS
        poll_timeout_s = self.source.poll_timeout_s
        counts: dict[str, int] = {}

        def write(folder: Path) -> None:
            target = str(folder)
            copied = (
                self.spark.sparkContext.parallelize(slices, len(slices))
                .map(lambda part: write_ranges_parquet(part, bootstrap, kafka, target,
                                                      fail_on_data_loss=fail_on_data_loss, niceness=niceness,
                                                      poll_timeout_s=poll_timeout_s))
                .collect()
            )
            for rows in copied:
                for split, n in rows.items():
                    counts[split] = counts.get(split, 0) + n

        staged = sink.stage_files(write, after_epoch)
        return staged, {s: n for s, n in counts.items() if n}

    def _check_log_start(self, ranges: Sequence[HistoryRange]) -> None:
        """``fail_on_data_loss``: a range under its split's log start fails before the read, clearly."""
        if not self.source.fail_on_data_loss or not ranges:
            return
        from connectors.kafka.spark_kafka import check_log_start

        check_log_start(ranges, self.admin.earliest_offsets(sorted({r.split for r in ranges})))


def _rows_per_split(folder: Path) -> dict[str, int]:
    """Rows per split of the Parquet files in ``folder`` (two columns read back: cheap)."""
    import pyarrow.parquet as pq

    from source_backfill.core import split_id

    files = sorted(folder.rglob("*.parquet"))
    if not files:
        return {}
    counts: dict[str, int] = {}
    for file in files:
        grouped = pq.read_table(file, columns=["topic", "partition"]).group_by(["topic", "partition"])
        for row in grouped.aggregate([([], "count_all")]).to_pylist():
            sid = split_id(row["topic"], row["partition"])
            counts[sid] = counts.get(sid, 0) + int(row["count_all"])
    return counts
