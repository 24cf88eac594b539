"""Spark's own Kafka source (spark-sql-kafka, ``format("kafka")``) as the service reads Kafka with it.

The default connector of a Kafka source (``connector = "spark"``); the Python data source of
:mod:`connectors.kafka.source` is the fallback for a cluster without the jar. Both give the same rows
(the schema of Spark's source) and the same ranges, which the contract tests check on the same topics.

* **The live stream**: Spark's streaming Kafka source, with the options users pass to it, unioned with a
  tick: Spark runs no micro-batch while its sources have no new data, and a job created on a quiet topic
  must still backfill and finish in epochs. The tick is Spark's ``rate-micro-batch`` source at one row
  per micro-batch, whose rows are all filtered out: its offset moves every trigger, so every trigger is a
  micro-batch (Spark's ``rate`` source moves its offset once a second whatever its rows per second: a
  0.5 s trigger ran an epoch a second on a quiet topic),
  and the Kafka source's offsets in the query's offset log are exact as ever (the tick is the log's
  second source).
* **History**: batch reads of planned offset ranges (``assign`` + ``startingOffsets`` / ``endingOffsets``
  per partition, end exclusive). ``fail_on_data_loss``: the log start is checked before the read, so a
  range under it fails with the same :class:`~source_backfill.errors.DataLossError` the Python connector
  raises (naming split, offsets and log start), not with a JVM stack. A source's history reads of one
  poll size share a group id (:meth:`SparkKafkaConnector.history_group`), so Spark's consumer pool lends
  each read the consumers the reads before it opened instead of a new consumer per partition and read.
* **Staged copies** (a read ahead): Spark writes the rows of a history read as the job's staged files.

:class:`SparkKafkaConnector` is the source's :class:`~connectors.kafka.connector.KafkaConnector`.

Transactions: both connectors read with ``isolation.level = read_committed`` unless the source's
``kafka`` options say otherwise, so aborted records and transaction markers are never rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.kafka.connector import KafkaConnector, Stager, poll_timeout_ms
from connectors.kafka.ranges import record_bytes
from connectors.kafka.staged import StagedProgress
from connectors.observe import observed
from source_backfill.core.splits import parse_split_id
from source_backfill.errors import DataLossError, SourceBackfillError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from connectors.delta.staging import StagedFiles
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.config import SourceConfig
    from source_backfill.core import HistoryRange

logger = logging.getLogger(__name__)

SPARK_KAFKA_FORMAT = "kafka"
#: How long a staged copy waits for its observed bytes after the copy (they only feed what is shown).
STAGE_OBSERVE_TIMEOUT_S = 10.0
#: Attempts of Spark's driver-side offset fetch (``fetchOffset.numRetries``, Spark's default).
OFFSET_ATTEMPTS = 3
#: Consumer settings both connectors default to (the source's ``kafka`` options override them).
DEFAULT_CONSUMER = {"isolation.level": "read_committed"}
#: Settings of Spark's Kafka consumers only (librdkafka has no such property; ``kafka`` overrides them).
#: Records one ``poll`` hands Spark's reader: at the Java client's 500, 1M records into Parquet took
#: 2.6-2.95 s; at 10,000 2.1-2.2 s (four passes each, alternated in one process; 50,000 gained nothing
#: more). Fetch sizes are left as they are: they are held per partition, and a consumer per partition.
#: A history read lowers it to its largest range (:func:`poll_records`): Spark keeps a reader's last
#: poll after the read, so a poll larger than the range holds records nobody reads.
SPARK_CONSUMER = {"max.poll.records": "10000"}
#: The Java client's own ``max.poll.records`` (what a ``kafka`` option set to nothing means).
CLIENT_POLL_RECORDS = 500
#: The group id of a source's history reads (:meth:`SparkKafkaConnector.history_group`), by source name.
HISTORY_GROUP = "source-backfill-{source}-history"
#: The poll of a small history read under the source's history group (:func:`poll_class`).
SMALL_POLL = 1000
#: A plain copy whose ranges hold at most this many offsets each on average converts its records to rows
#: interpreted (:meth:`SparkKafkaConnector.copy_session`): generating the converter's code costs a few ms
#: per range, interpreting it ~0.6 us more per record (1M records on 4 partitions: 3.6 s against 3.0 s,
#: alternated in one process), so the two meet near 5,000 records a range.
INTERPRETED_RANGE_OFFSETS = 5_000


class SparkKafkaConnector(KafkaConnector):
    """A source's Kafka reads with Spark's Kafka source (``connector = "spark"``)."""

    def __init__(self, source: SourceConfig, bootstrap_servers: str, spark: SparkSession,
                 admin: KafkaAdmin) -> None:
        super().__init__(source, bootstrap_servers, spark, admin)
        self._copy_lock = threading.Lock()
        self._copy_session: SparkSession | None = None

    def reader_options(self) -> dict[str, str]:
        """The options of Spark's Kafka source for the source: ``kafka.*``, ``failOnDataLoss``, deadlines.

        ``poll_timeout_s`` is Spark's ``kafkaConsumer.pollTimeoutMs``; the client's
        ``default.api.timeout.ms`` and ``request.timeout.ms`` are a third of it (one of Spark's three
        offset-fetch attempts), unless ``kafka`` sets them.
        """
        # the source's deadline bounds the client's blocking calls too (offsets, positions; 60 s each by
        # default): Spark tries an offset fetch OFFSET_ATTEMPTS times, so each attempt gets a share of it,
        # and a broker that stops answering fails the live query within about the deadline, as with the
        # Python connector
        attempt_ms = str(max(1000, poll_timeout_ms(self.source) // OFFSET_ATTEMPTS))
        deadlines = {"default.api.timeout.ms": attempt_ms, "request.timeout.ms": attempt_ms}
        return self._options({"fetchOffset.numRetries": str(OFFSET_ATTEMPTS)},
                             {**DEFAULT_CONSUMER, **SPARK_CONSUMER, **deadlines})

    def live_stream(self, checkpoint: Path | None = None) -> DataFrame:
        """Spark's Kafka source, plus the tick (source #1 of the log, as ``checkpoint``'s log has it)."""
        from pyspark.sql import functions as F  # noqa: N812

        from connectors.kafka.stream import TICK_FORMAT, tick_format

        spark = self.spark
        reader = spark.readStream.format(SPARK_KAFKA_FORMAT).options(**self.reader_options())
        kafka = subscribed(reader, self.source).load()
        ticks = tick_format(checkpoint)
        reader = spark.readStream.format(ticks).option("numPartitions", "1")  # one task, not one per core
        reader = reader.option("rowsPerBatch" if ticks == TICK_FORMAT else "rowsPerSecond", "1")
        none = reader.load().where(F.lit(False)).select(
            *[F.lit(None).cast(f.dataType).alias(f.name) for f in kafka.schema.fields]
        )
        stream: DataFrame = kafka.unionByName(none)
        return stream

    def read_ranges(self, ranges: Sequence[HistoryRange], session: SparkSession | None = None) -> DataFrame:
        """:func:`read_ranges` with the source's options, the log starts read first.

        With ``fail_on_data_loss`` :func:`check_log_start` runs before the read, so a range under the log
        start fails with the same :class:`DataLossError` as the Python connector's, not with a JVM stack.
        Without it the ranges start at the log start (:func:`above_log_start`; what lies below was counted
        as lost when the read was planned): a read under the source's history group could otherwise be
        served the records below it from the rest of an earlier poll, fetched before a deletion moved the
        log start, and deliver offsets counted as lost.
        """
        if ranges:
            log_start = self.admin.earliest_offsets(sorted({r.split for r in ranges}))
            if self.source.fail_on_data_loss:
                check_log_start(ranges, log_start)
            else:
                ranges = above_log_start(ranges, log_start)
        return read_ranges(session or self.spark, ranges, self.reader_options(), group=self.history_group())

    def copy_session(self) -> SparkSession:
        """The session of the source's small plain history copies: no code generation for row conversions.

        Spark's Kafka reader builds a ``KafkaRecordToRowConverter`` per partition it reads, and each
        generates the Java code of two row projections (then finds the class compiled already): a copy
        of 100 partitions built 200 projections' code, which with the consumers made anew was most of a
        rate-limited copy's cost and kept the JIT compiler busy. ``spark.sql.codegen.factoryMode =
        NO_CODEGEN`` (Spark's own switch, internal: an unknown setting is ignored) has those projections
        interpreted instead; whole-stage code generation is not affected. Only copies of small ranges use
        it (``INTERPRETED_RANGE_OFFSETS``: per record, interpreted is slower); the live stream and
        transformed reads keep the daemon's session.
        """
        with self._copy_lock:
            if self._copy_session is None:
                session = self.spark.newSession()
                session.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")
                self._copy_session = session
            return self._copy_session

    def history_group(self) -> str | None:
        """The group id of the source's history reads; None when its ``kafka`` options name their own.

        Spark gives a batch read a group id of its own unless one is set, and its consumer pool is keyed
        by group id and partition: each history read opened a new consumer per partition (a connection,
        metadata, a fetch from scratch), and closed the last read's. A read ahead of a rate-limited job
        on 100 partitions reads a few offsets of each, so opening consumers was most of its cost: 15 such
        jobs kept the JVM's core busy. Under the source's group id (and the read's poll class,
        :func:`poll_class`) the pool lends a read the idle consumers of the reads before it, and the rest
        of a job's last poll to its next read. The consumers only ``assign`` partitions and commit
        nothing, so the group never forms on the broker and the reads do not interfere.
        """
        if "group.id" in self.source.kafka:
            return None
        return HISTORY_GROUP.format(source=self.source.name)

    def stage(self, sink: Stager, ranges: Sequence[HistoryRange], after_epoch: int,
              on_folder: Callable[[Path], None] | None, *, tasks: int, niceness: int,
              on_bytes: Callable[[int], None] | None = None) -> tuple[StagedFiles, dict[str, int]]:
        """Spark copies the rows of :meth:`read_ranges` in ``tasks`` tasks; the files tell the counts.

        ``niceness`` is not used: the copy runs in Spark's JVM. The bytes are observed as it copies. A copy
        of small ranges (``INTERPRETED_RANGE_OFFSETS`` offsets each on average, at most) reads in
        :meth:`copy_session`.
        """
        small = bool(ranges) and sum(r.size for r in ranges) <= INTERPRETED_RANGE_OFFSETS * len(ranges)
        rows = self.read_ranges(ranges, session=self.copy_session() if small else None)
        observation = None
        if on_bytes is not None:
            from pyspark.sql import Observation
            from pyspark.sql import functions as F  # noqa: N812

            observation = Observation(f"stage-bytes-{uuid.uuid4().hex}")
            rows = rows.observe(observation, F.sum(record_bytes()).alias("bytes"))
        staged = sink.stage_dataframe(rows.coalesce(tasks), after_epoch, on_folder)
        if observation is not None and on_bytes is not None:
            try:
                on_bytes(int(observed(observation, STAGE_OBSERVE_TIMEOUT_S).get("bytes") or 0))
            except SourceBackfillError:  # the copy is done; only the figure shown is missing
                logger.debug("staged bytes not observed", exc_info=True)
        progress = StagedProgress()
        progress.folder = staged.folder
        return staged, {split: n for split, (n, _) in progress.read().items()}


def subscribed(reader: Any, source: SourceConfig) -> Any:
    """A stream reader (either connector) given what it reads, where it starts and its admission limit.

    Topics or a pattern, ``startingOffsets``, ``maxOffsetsPerTrigger``: the options both connectors share.
    """
    if source.topic_pattern:
        reader = reader.option("subscribePattern", source.topic_pattern)
    else:
        reader = reader.option("subscribe", ",".join(source.topics))
    reader = reader.option("startingOffsets", source.starting_offsets)
    if source.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(source.max_offsets_per_trigger))
    return reader


def check_log_start(ranges: Sequence[HistoryRange], log_start: Mapping[str, int]) -> None:
    """Raise :class:`DataLossError` for the first range that starts below its split's log start."""
    for r in ranges:
        low = log_start.get(r.split, 0)
        if r.start < low:
            msg = (
                f"data loss on Kafka split {r.split}: offsets {r.start}..{min(low, r.end) - 1} are gone "
                f"(log start is {low}; retention or compaction removed them); set failOnDataLoss=false "
                f"to skip forward"
            )
            raise DataLossError(msg)


def above_log_start(ranges: Sequence[HistoryRange], log_start: Mapping[str, int]) -> list[HistoryRange]:
    """``ranges`` cut to start at their split's log start; those wholly below it left out."""
    from source_backfill.core import HistoryRange

    cut = [HistoryRange(r.split, max(r.start, log_start.get(r.split, 0)), r.end) for r in ranges]
    return [r for r in cut if r.end > r.start]


def read_ranges(
    session: SparkSession, ranges: Sequence[HistoryRange], options: Mapping[str, str], *,
    group: str | None = None,
) -> DataFrame:
    """The records of ``ranges`` (``[start, end)`` per split) with Spark's batch Kafka source.

    One read per pass, a pass holding at most one range per split (Spark's source takes one range per
    partition); passes are unioned. ``group``: the prefix of the reads' group id (``kafka.group.id``)
    when ``options`` name none: a pass polls its :func:`poll_class` under :func:`pool_group`; else a pass
    has a group id of its own (Spark's) and polls :func:`poll_records`.
    """
    if not ranges:  # (every range below the log start, say): no read, Kafka's columns
        from connectors.kafka.ranges import kafka_schema

        return session.createDataFrame([], kafka_schema(str(options.get("includeHeaders")).lower() == "true"))
    passes: list[dict[str, HistoryRange]] = []
    for r in ranges:
        free = next((p for p in passes if r.split not in p), None)
        if free is None:
            free = {}
            passes.append(free)
        free[r.split] = r
    frames = [_read_pass(session, list(p.values()), options, group) for p in passes]
    out = frames[0]
    for more in frames[1:]:
        out = out.unionByName(more)
    return out


def poll_records(ranges: Sequence[HistoryRange], options: Mapping[str, str]) -> str | None:
    """``kafka.max.poll.records`` for one read pass: the configured value, at most its largest range.

    Spark's reader polls a partition's records into a list, reads its range from it and keeps the list
    (the rest of the poll) in its fetched-data pool after the read, under the read's group id: under a
    group id of its own no later read takes it. A rate-limited read of 22 offsets a partition polled up
    to 10,000 records (what one fetch of the partition held) and kept them all; a poll no larger than
    the range keeps only what the read used. ``None`` (leave the option as it is) when the source names
    its own ``group.id``: Spark's consumer pool then lends a consumer to any read of the group, made with
    the options of the read that opened it, so they must not vary by read.
    """
    if "kafka.group.id" in options or not ranges:
        return None
    configured = int(options.get("kafka.max.poll.records") or CLIENT_POLL_RECORDS)
    return str(max(1, min(configured, max(r.size for r in ranges))))


def poll_class(ranges: Sequence[HistoryRange], options: Mapping[str, str]) -> int:
    """The poll of a read under the source's history group: ``SMALL_POLL``, or the configured for large reads.

    A read whose largest range is at most :data:`SMALL_POLL` offsets (a rate-limited job's read ahead:
    a few offsets of each partition) polls ``SMALL_POLL`` records, any other the configured
    ``max.poll.records``. The reads of one class share a group id (:func:`read_ranges`): a consumer lent
    to a read polls what the read that opened it asked for, so the reads sharing it must ask the same.
    The rest of a poll is kept for ``spark.kafka.consumer.fetchedData.cache.timeout`` and taken by the
    next read that continues where this one ended (a job's next read ahead), so a rate-limited job
    fetches from the broker once every ~``SMALL_POLL`` offsets of a partition instead of at every read;
    what is kept is at most a poll per partition and job that reads it.
    """
    configured = int(options.get("kafka.max.poll.records") or CLIENT_POLL_RECORDS)
    largest = max((r.size for r in ranges), default=1)
    return min(SMALL_POLL, configured) if largest <= SMALL_POLL else configured


def pool_group(group: str, options: Mapping[str, str], poll: int) -> str:
    """The group id of a history read: ``<group>-<digest of the consumer's options>-<poll>``.

    Spark's consumer pool keys a consumer (and the rest of its last poll) by group id and partition,
    and refuses a read whose options differ from those that made the pooled consumer ("Kafka parameters
    for same cache key should be equal"): the reads of a group must ask for the same consumer. The poll
    is in the name (:func:`poll_class`); the digest covers the rest of the ``kafka.*`` options (brokers,
    security, deadlines), so a source whose brokers or credentials change in a running JVM (dropped and
    added again; a test's broker after another's on the same topic) gets consumers of its own. Without
    it every history read of the source failed until the old consumers timed out of the pool (5 min).
    """
    kafka = sorted((k, v) for k, v in options.items()
                   if k.startswith("kafka.") and k not in ("kafka.group.id", "kafka.max.poll.records"))
    digest = hashlib.sha256(json.dumps(kafka).encode()).hexdigest()[:10]
    return f"{group}-{digest}-{poll}"


def _read_pass(
    session: SparkSession, ranges: Sequence[HistoryRange], options: Mapping[str, str], group: str | None,
) -> DataFrame:
    assign: dict[str, list[int]] = {}
    starts: dict[str, dict[str, int]] = {}
    ends: dict[str, dict[str, int]] = {}
    for r in ranges:
        topic, partition = parse_split_id(r.split)
        assign.setdefault(topic, []).append(partition)
        starts.setdefault(topic, {})[str(partition)] = r.start
        ends.setdefault(topic, {})[str(partition)] = r.end
    if group is not None and "kafka.group.id" not in options:
        size = poll_class(ranges, options)
        options = {**options, "kafka.group.id": pool_group(group, options, size),
                   "kafka.max.poll.records": str(size)}
    else:
        polled = poll_records(ranges, options)
        if polled is not None:
            options = {**options, "kafka.max.poll.records": polled}
    frame: DataFrame = (
        session.read.format(SPARK_KAFKA_FORMAT).options(**options)
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starts))
        .option("endingOffsets", json.dumps(ends))
        .load()
    )
    return frame


def split_offsets(parsed: Mapping[str, Any]) -> dict[str, int]:
    """A Spark Kafka offset (``{"topic": {"0": 23}}``) as ``{"topic:0": 23}``."""
    from source_backfill.core.splits import split_id

    return {
        split_id(topic, int(p)): int(o) for topic, parts in parsed.items() for p, o in dict(parts).items()
    }
