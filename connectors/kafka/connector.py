"""The Kafka connector of a source: every Kafka read of the runtime and the executors, chosen once.

A Kafka source reads with Spark's own Kafka source (``connector = "spark"``,
:class:`connectors.kafka.spark_kafka.SparkKafkaConnector`) or with the project's Python data source
(``connector = "python"``, :class:`connectors.kafka.python_connector.PythonKafkaConnector`). Both give
the same rows (the schema of Spark's source) and the same ranges.
:func:`connectors.kafka.factory.connector_for` is the one place the source's ``connector`` is looked at;
the live source, its jobs and their history readers get the connector object. This module is the
interface only: the implementations import it, never the other way round.

What a connector reads: the live stream (the streaming DataFrame of the source's query), ranges of
history (a DataFrame), staged copies of ranges (Parquet files of a job's table, for a read ahead), and
small live batches on the driver (the records of a batch's offsets, read with one kept consumer,
whichever connector reads the rest: they are the rows of Spark's source, the contract suite checks it).
A connector binds the resolved bootstrap servers (not the config's ``embedded`` or ``${VAR}``) and its
reader options at construction.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from connectors.delta.staging import StagedFiles
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.config import SourceConfig
    from source_backfill.core import HistoryRange


class Stager(Protocol):
    """Where a staged copy goes: a job's sink, which stages Parquet files for a later epoch's commit."""

    def stage_dataframe(self, df: DataFrame, after_epoch: int,
                        on_folder: Callable[[Path], None] | None = None) -> StagedFiles:
        """Spark writes ``df`` as the staged files."""

    def stage_files(self, write: Callable[[Path], Any], after_epoch: int,
                    on_folder: Callable[[Path], None] | None = None) -> StagedFiles:
        """``write(folder)`` writes the staged files."""


class KafkaConnector(ABC):
    """How one Kafka source reads Kafka (see the module docstring); made by ``factory.connector_for``."""

    #: Whether the connector runs Python in Spark's workers (the Python data source, its pyarrow copy):
    #: a session for it registers the data source and warms a worker.
    python_workers: ClassVar[bool] = False
    #: The Kafka client of the connector's Spark reader: Spark's Java client, or librdkafka in Python
    #: workers; the ``security`` section is spelled for it (``connectors/kafka/security.py``).
    CLIENT: ClassVar[Literal["java", "librdkafka"]] = "java"

    def __init__(self, source: SourceConfig, bootstrap_servers: str, spark: SparkSession,
                 admin: KafkaAdmin) -> None:
        self.source = source
        #: The resolved ``host:port,...`` (the config may say ``embedded`` or ``${VAR}``).
        self.bootstrap_servers = bootstrap_servers
        self.spark = spark
        self.admin = admin
        #: The driver's consumer of small live batches (made at the first one, closed by :meth:`close`).
        self._consumer: Any = None

    # -- what differs between the connectors -----------------------------------------------------------
    @abstractmethod
    def reader_options(self) -> dict[str, str]:
        """The options of the connector's Spark reader for this source (``kafka.*``, deadlines, ...)."""

    @abstractmethod
    def live_stream(self, checkpoint: Path | None = None) -> DataFrame:
        """The source's live rows as a streaming DataFrame; every trigger is a micro-batch (an epoch).

        The Kafka source is the first source of the query's offset log
        (:func:`connectors.kafka.stream.batch_offsets`). ``checkpoint``: the query's, whose offset log
        says which sources it was written with (a query's sources can not change under it).
        """

    @abstractmethod
    def read_ranges(self, ranges: Sequence[HistoryRange], session: SparkSession | None = None) -> DataFrame:
        """The records of ``ranges`` (``[start, end)`` per split) as a DataFrame of ``session``.

        ``session`` defaults to the connector's. With ``fail_on_data_loss`` a range under its split's
        log start fails with :class:`~source_backfill.errors.DataLossError`.
        """

    @abstractmethod
    def stage(self, sink: Stager, ranges: Sequence[HistoryRange], after_epoch: int,
              on_folder: Callable[[Path], None] | None, *, tasks: int, niceness: int,
              on_bytes: Callable[[int], None] | None = None) -> tuple[StagedFiles, dict[str, int]]:
        """Copy the records of ``ranges`` into staged files of ``sink``: the files, records per split.

        ``tasks``: Spark tasks of the copy; ``niceness``: the CPU niceness of a copy that runs in
        Python workers. Splits that copied no record are left out of the counts. ``on_bytes(n)``: the
        records' bytes the copy fetched (:func:`connectors.kafka.ranges.record_bytes`), told once it is done.
        """

    # -- what is the same ------------------------------------------------------------------------------
    def read_small(self, start: Mapping[str, int], end: Mapping[str, int]) -> pa.Table:
        """The records of a small live batch, ``[start, end)`` per split of its offset log, on the driver.

        One consumer kept by the connector reads them with the Python connector's range reader (its
        rows, offsets, transaction markers and aborted records are the ones of Spark's source: the
        contract suite, ``tests/integration/kafka/test_contract.py``). No Spark job runs.
        """
        import pyarrow as pa

        from connectors.kafka.ranges import KafkaRange, kafka_arrow_schema, range_consumer, read_range
        from connectors.kafka.security import librdkafka_options
        from source_backfill.core import parse_split_id

        kafka = librdkafka_options(self.source)
        if self._consumer is None:
            # the batch's records are in the log already: no long fetches (range_consumer says why)
            self._consumer = range_consumer(self.bootstrap_servers, kafka, fetch_wait_ms=1)
        batches: list[pa.RecordBatch] = []
        for split, stop in sorted(end.items()):
            topic, partition = parse_split_id(split)
            rng = KafkaRange(topic, partition, start.get(split, stop), stop, check_loss=False)
            batches.extend(read_range(rng, self.bootstrap_servers, kafka,
                                      fail_on_data_loss=self.source.fail_on_data_loss,
                                      poll_timeout_s=self.source.poll_timeout_s, consumer=self._consumer))
        return pa.Table.from_batches(batches, schema=kafka_arrow_schema())

    def close(self) -> None:
        """Close the consumer of small batches (a later :meth:`read_small` makes a new one)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _options(self, own: Mapping[str, str], consumer: Mapping[str, str]) -> dict[str, str]:
        """The options both readers take, plus the connector's ``own``, then ``kafka.*`` options.

        ``consumer``: the connector's consumer settings; the source's ``kafka`` options override them, and
        its ``security`` section in the spelling of the client that reads (:attr:`CLIENT`).
        """
        from connectors.kafka.security import java_options, librdkafka_options

        kafka = java_options(self.source) if self.CLIENT == "java" else librdkafka_options(self.source)
        options = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "failOnDataLoss": str(self.source.fail_on_data_loss).lower(),
            "kafkaConsumer.pollTimeoutMs": str(poll_timeout_ms(self.source)),
            **own,
        }
        for key, value in {**consumer, **kafka}.items():
            options[f"kafka.{key}"] = value
        return options


def poll_timeout_ms(source: SourceConfig) -> int:
    """The source's ``poll_timeout_s`` in milliseconds (``kafkaConsumer.pollTimeoutMs`` of the readers)."""
    return round(source.poll_timeout_s * 1000)
