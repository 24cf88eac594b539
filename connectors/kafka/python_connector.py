"""A source's Kafka reads with the project's Python data source (``connector = "python"``, ``kafka_py``).

The fallback for a cluster without Spark's Kafka jar (:mod:`connectors.kafka.spark_kafka` is the
default). The live stream and history reads are the ``kafka_py`` data source of
:mod:`connectors.kafka.source`, at most :func:`max_read_tasks` Spark tasks a read; a read ahead copies
its ranges with pyarrow in Spark tasks (:mod:`connectors.kafka.parquet_copy`) instead of through Spark's
rows (a third of the CPU). The consumer's own defaults (``read_committed`` included) are
:data:`connectors.kafka.admin.CONSUMER_DEFAULTS`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from connectors.kafka.connector import KafkaConnector, Stager
from source_backfill.core.splits import parse_split_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from connectors.delta.staging import StagedFiles
    from source_backfill.core import HistoryRange


def max_read_tasks(spark: Any, configured: int | None) -> int:
    """Tasks a Kafka read may use: the source's ``max_read_tasks``, else twice the default parallelism."""
    return configured if configured is not None else 2 * max(1, spark.sparkContext.defaultParallelism)


class PythonKafkaConnector(KafkaConnector):
    """A source's Kafka reads with the ``kafka_py`` data source."""

    python_workers: ClassVar[bool] = True
    CLIENT: ClassVar[Literal["java", "librdkafka"]] = "librdkafka"

    def reader_options(self) -> dict[str, str]:
        """The options of the ``kafka_py`` source for the source (``kafka.*``, deadlines, ``maxTasks``).

        ``maxTasks`` is :func:`max_read_tasks` of the connector's session, asked at every read.
        """
        return self._options({"maxTasks": str(max_read_tasks(self.spark, self.source.max_read_tasks))}, {})

    def live_stream(self, checkpoint: Path | None = None) -> DataFrame:
        """The ``kafka_py`` stream (it ticks itself: a new offset every trigger; ``checkpoint`` unused)."""
        from connectors.kafka.source import KAFKA_FORMAT
        from connectors.kafka.spark_kafka import subscribed

        reader = self.spark.readStream.format(KAFKA_FORMAT).options(**self.reader_options())
        frame: DataFrame = subscribed(reader, self.source).load()
        return frame

    def read_ranges(self, ranges: Sequence[HistoryRange], session: SparkSession | None = None) -> DataFrame:
        """A ``kafka_py`` batch read of ``ranges`` (its ``ranges`` option); the reader checks log starts."""
        from connectors.kafka.source import KAFKA_FORMAT

        session = session or self.spark
        spec = []
        for r in ranges:
            topic, partition = parse_split_id(r.split)
            spec.append({"topic": topic, "partition": partition, "start": r.start, "end": r.end})
        options = self.reader_options()
        return session.read.format(KAFKA_FORMAT).options(**options).option("ranges", json.dumps(spec)).load()

    def stage(self, sink: Stager, ranges: Sequence[HistoryRange], after_epoch: int,
              on_folder: Callable[[Path], None] | None, *, tasks: int, niceness: int,
              on_bytes: Callable[[int], None] | None = None) -> tuple[StagedFiles, dict[str, int]]:
        """The connector's range reader and pyarrow's Parquet writer in ``tasks`` Spark tasks.

        The rows need no transform, so they skip Spark's row conversion (a third of the CPU of a
        DataFrame copy). The copy runs at CPU ``niceness`` (:func:`connectors.kafka.parquet_copy.niced`).
        """
        from connectors.kafka.parquet_copy import write_ranges_parquet
        from connectors.kafka.ranges import KafkaRange
        from connectors.kafka.security import librdkafka_options

        pieces = [KafkaRange(*parse_split_id(r.split), r.start, r.end) for r in ranges]
        slices = [part for i in range(tasks) if (part := pieces[i::tasks])]
        bootstrap, kafka = self.bootstrap_servers, librdkafka_options(self.source)
        fail_on_data_loss, poll_timeout_s = self.source.fail_on_data_loss, self.source.poll_timeout_s
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
            for rows, fetched in copied:
                for split, n in rows.items():
                    counts[split] = counts.get(split, 0) + n
                if on_bytes is not None:
                    on_bytes(fetched)

        staged = sink.stage_files(write, after_epoch, on_folder)
        return staged, {s: n for s, n in counts.items() if n}
