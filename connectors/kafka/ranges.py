"""Reading the records of Kafka offset ranges with confluent-kafka, as Arrow record batches.

A range is the offsets ``[start, end)`` of one topic partition (:class:`KafkaRange`). Ranges larger than
:data:`MAX_OFFSETS_PER_PARTITION` are cut into pieces (:func:`split_ranges`) and many ranges are packed
into at most so many Spark tasks (:func:`group_ranges`). :func:`read_range` yields the records of one
range in the schema of Spark's own Kafka source (:func:`kafka_schema`, :func:`kafka_arrow_schema`); it
is stateless, so a replayed range reads exactly the same records.

Used by the ``kafka_py`` data source (:mod:`connectors.kafka.source`), the pyarrow copy of ranges into
Parquet (:mod:`connectors.kafka.parquet_copy`) and the runtime's reads of a small live batch on the driver.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import is_not
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from source_backfill.errors import DataLossError, KafkaConnectorError, UnknownTopicError

if TYPE_CHECKING:
    from pyspark.sql import Column

logger = logging.getLogger(__name__)

#: Offsets per InputPartition before a range is split so that every core gets work.
MAX_OFFSETS_PER_PARTITION = 250_000
#: Messages per ``consume()`` call. Small calls keep the fresh Message objects in CPU cache while their
#: columns are pulled out: 500 uses ~35% less CPU per record than 10,000 (bench/bench_kafka_read.py).
CONSUME_BATCH = 500
#: Rows per yielded Arrow record batch.
CHUNK_ROWS = 10_000
DEFAULT_POLL_TIMEOUT_MS = 60_000


def kafka_schema(include_headers: bool = False) -> StructType:
    """Exactly the schema of Spark's Kafka source (with ``headers`` when ``includeHeaders``)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def record_bytes() -> Column:
    """A Kafka record's bytes as this service counts what it fetched: ``len(key) + len(value)`` (null: 0).

    The payload, not the wire: the broker's batch headers and compression are not in it. The Arrow copy
    counts the same (:func:`connectors.kafka.parquet_copy.write_ranges_parquet`).
    """
    from pyspark.sql import functions as F  # noqa: N812

    return F.coalesce(F.octet_length("key"), F.lit(0)) + F.coalesce(F.octet_length("value"), F.lit(0))


# -- partitions ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Offsets ``[start, end)`` of one topic partition; ``check_loss`` on the first piece of a range."""

    topic: str
    partition: int
    start: int
    end: int
    check_loss: bool = True

    @property
    def split_id(self) -> str:
        """The split id ``topic:partition``."""
        return f"{self.topic}:{self.partition}"


def split_ranges(ranges: Sequence[KafkaRange], max_size: int = MAX_OFFSETS_PER_PARTITION) -> list[KafkaRange]:
    """Cut ranges larger than ``max_size`` offsets into equal pieces; empty ranges are dropped."""
    out: list[KafkaRange] = []
    for rng in ranges:
        size = rng.end - rng.start
        if size <= 0:
            continue
        pieces = max(1, math.ceil(size / max_size))
        step = math.ceil(size / pieces)
        for i, lo in enumerate(range(rng.start, rng.end, step)):
            out.append(KafkaRange(rng.topic, rng.partition, lo, min(lo + step, rng.end), i == 0))
    return out


@dataclass(frozen=True)
class KafkaRangeGroup(InputPartition):
    """Several ranges read one after another by one Spark task (see :func:`group_ranges`)."""

    ranges: tuple[KafkaRange, ...]


def group_ranges(ranges: Sequence[KafkaRange], max_tasks: int) -> list[KafkaRange | KafkaRangeGroup]:
    """At most ``max_tasks`` partitions: ranges packed by size, largest first, into the lightest group.

    A topic of 100 partitions would otherwise cost 100 Spark tasks per micro-batch — a Python worker hop
    and a consumer each — however few records arrived (the load benchmark's epochs ran 20–30 s on 2
    cores). Ranges of one split keep their order inside a group; a lone range stays a plain range.
    """
    if max_tasks < 1:
        msg = f"maxTasks must be >= 1, got {max_tasks}"
        raise KafkaConnectorError(msg)
    if len(ranges) <= max_tasks:
        return list(ranges)
    groups: list[list[KafkaRange]] = [[] for _ in range(max_tasks)]
    sizes = [0] * max_tasks
    for rng in sorted(ranges, key=lambda r: (r.start - r.end, r.split_id, r.start)):
        i = sizes.index(min(sizes))
        groups[i].append(rng)
        sizes[i] += rng.end - rng.start
    out: list[KafkaRange | KafkaRangeGroup] = []
    for group in groups:
        group.sort(key=lambda r: (r.split_id, r.start))
        out.append(group[0] if len(group) == 1 else KafkaRangeGroup(tuple(group)))
    return out


# -- reading one range ---------------------------------------------------------------------------------
def kafka_arrow_schema(include_headers: bool = False) -> Any:
    """The Arrow schema of Kafka records as Spark reads them (its Kafka source and ours)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(kafka_schema(include_headers), timezone="UTC")


def _headers(hdrs: Any) -> list[dict[str, Any]] | None:
    return [{"key": k, "value": v} for k, v in hdrs] if hdrs else None


def range_consumer(bootstrap: str, kafka_options: Mapping[str, Any], fetch_wait_ms: int | None = None) -> Any:
    """A consumer as :func:`read_range` makes one: for a caller that reads range after range with it.

    ``fetch_wait_ms`` (default: the options', else 50) is how long the broker may hold a fetch for more
    data. A reader of ranges already in the log wants 1: librdkafka sends one fetch at a time per
    broker, so the next range's first fetch waits for the previous range's idle one (4 ranges of 50
    records: 4 x 53 ms at 50, 4 x 3 ms at 1).
    """
    from confluent_kafka import Consumer

    from connectors.kafka.admin import consumer_config

    conf = consumer_config(bootstrap, kafka_options)
    if fetch_wait_ms is not None:
        conf["fetch.wait.max.ms"] = fetch_wait_ms
    conf.setdefault("fetch.wait.max.ms", 50)
    conf.setdefault("max.partition.fetch.bytes", 8 << 20)
    return Consumer(conf)


def read_range(
    rng: KafkaRange,
    bootstrap: str,
    kafka_options: Mapping[str, Any],
    include_headers: bool = False,
    fail_on_data_loss: bool = True,
    chunk_rows: int = CHUNK_ROWS,
    poll_timeout_s: float = DEFAULT_POLL_TIMEOUT_MS / 1000.0,
    consumer: Any = None,
) -> Iterator[Any]:
    """Yield ``pyarrow.RecordBatch`` es with the records of ``rng`` (stateless; replays are identical).

    The range ends when the consumer's position reaches ``end`` or a partition EOF at/after ``end`` is
    seen, so a tail of transaction markers or compacted-away offsets finishes without a record at
    ``end - 1``. ``poll_timeout_s`` without progress raises :class:`KafkaConnectorError`. ``consumer``:
    one of :func:`range_consumer` to read with (assigned to the range, left open); else one is made
    for the range and closed after it.
    """
    if rng.end <= rng.start:
        return
    import pyarrow as pa
    import pyarrow.compute as pc
    from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

    from connectors.kafka.admin import (
        call_with_retry,
        consume_available,
        retry_if_splits_exist,
    )

    schema = kafka_arrow_schema(include_headers)
    own = consumer is None
    if own:
        consumer = range_consumer(bootstrap, kafka_options)
    start = rng.start
    try:
        tp = TopicPartition(rng.topic, rng.partition)
        if rng.check_loss:
            # retried like the admin's calls: a connection reset makes librdkafka re-bootstrap, and
            # queries meanwhile fail (_DESTROY_BROKER, _TRANSPORT, _UNKNOWN_PARTITION) where a retry works
            attempt_s = max(1.0, min(5.0, poll_timeout_s))

            def watermarks() -> tuple[int, int]:
                try:
                    marks: tuple[int, int] = consumer.get_watermark_offsets(tp, timeout=attempt_s)
                    return marks
                except KafkaException as exc:
                    retry_if_splits_exist(exc, consumer, [tp], attempt_s)
                    raise

            what = f"watermarks of {rng.split_id}"
            low, _high = call_with_retry(watermarks, what, poll_timeout_s, bootstrap)
            if start < low:
                if fail_on_data_loss:
                    msg = (
                        f"data loss on Kafka split {rng.split_id}: offsets {start}..{min(low, rng.end) - 1} "
                        f"are gone (log start is {low}; retention or compaction removed them); set "
                        f"failOnDataLoss=false to skip forward"
                    )
                    raise DataLossError(msg)
                logger.warning(
                    'kafka data loss skipped split="%s" requested="%d" log_start="%d"',
                    rng.split_id,
                    start,
                    low,
                )
                start = low
                if start >= rng.end:
                    return
        consumer.assign([TopicPartition(rng.topic, rng.partition, start)])
        topic_arr_cache: dict[int, Any] = {}
        part_scalar = pa.scalar(rng.partition, pa.int32())
        stamp_type = pa.struct([("type", pa.int32()), ("ms", pa.int64())])
        # unbound methods mapped in C: ~2x cheaper per record than comprehensions calling m.value()
        m_error, m_offset, m_key, m_value, m_timestamp, m_headers = (
            Message.error,
            Message.offset,
            Message.key,
            Message.value,
            Message.timestamp,
            Message.headers,
        )
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        offsets: list[int] = []
        stamps: list[tuple[int, int]] = []
        headers: list[list[dict[str, Any]] | None] = []
        pos = start
        done = False
        last_progress = time.monotonic()

        def flush() -> Any:
            n = len(offsets)
            if n not in topic_arr_cache:
                topic_arr_cache.clear()
                topic_arr_cache[n] = pa.repeat(pa.scalar(rng.topic, pa.string()), n)
            pairs = pa.array(stamps, stamp_type)  # (type, ms) tuples split in C
            ts = pc.multiply(pairs.field(1), 1000).cast(schema.field("timestamp").type)
            cols = [
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                topic_arr_cache[n],
                pa.repeat(part_scalar, n),
                pa.array(offsets, pa.int64()),
                ts,
                pc.subtract(pairs.field(0), 1),  # librdkafka 0/1/2 -> Kafka -1/0/1
            ]
            if include_headers:
                cols.append(pa.array(headers, schema.field("headers").type))
            batch = pa.RecordBatch.from_arrays(cols, schema=schema)
            for buf in (keys, values, offsets, stamps, headers):
                buf.clear()
            return batch

        def on_error(m: Any) -> bool:
            """Handle an error event; True when it ends the range."""
            err = m.error()
            code = err.code()
            if code == KafkaError._PARTITION_EOF:
                return bool(m.offset() >= rng.end)
            if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION):
                msg = f"Kafka split {rng.split_id} does not exist: {err}"
                raise UnknownTopicError(msg)
            if code == KafkaError.OFFSET_OUT_OF_RANGE and fail_on_data_loss:
                msg = f"data loss on Kafka split {rng.split_id} at offset {pos}: {err}"
                raise DataLossError(msg)
            if err.fatal():
                msg = f"fatal Kafka error reading {rng.split_id}: {err}"
                raise KafkaConnectorError(msg)
            logger.warning('kafka read error split="%s" error="%s"', rng.split_id, err)
            return False

        while not done:
            want = max(1, min(CONSUME_BATCH, chunk_rows - len(offsets), rng.end - pos))
            msgs = consume_available(consumer, want, 1.0)
            if msgs:
                last_progress = time.monotonic()
                errs = list(map(m_error, msgs))
                good = msgs
                if any(map(is_not, errs, repeat(None))):  # identity: KafkaError == None raises
                    good = [m for m, e in zip(msgs, errs, strict=True) if e is None]
                    for m, e in zip(msgs, errs, strict=True):
                        if e is not None and on_error(m):
                            done = True
                if good:
                    offs = cast("list[int]", list(map(m_offset, good)))  # records have offsets
                    if offs[-1] >= rng.end:
                        cut = bisect.bisect_left(offs, rng.end)
                        good, offs, done = good[:cut], offs[:cut], True
                if good:
                    offsets += offs
                    keys += map(m_key, good)
                    values += map(m_value, good)
                    stamps += map(m_timestamp, good)
                    if include_headers:
                        headers += [_headers(h) for h in map(m_headers, good)]
                    pos = offs[-1] + 1
            if not done:
                current = consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset
                if current >= 0:
                    pos = max(pos, current)
                if pos >= rng.end:
                    done = True
            if len(offsets) >= chunk_rows or (done and offsets):
                yield flush()
            if not done and time.monotonic() - last_progress > poll_timeout_s:
                msg = (
                    f"Kafka split {rng.split_id} stalled at offset {pos} before end {rng.end} for "
                    f"{poll_timeout_s:.0f}s (broker {bootstrap} unreachable; or a broker quota on this "
                    f"client whose 10 s window is smaller than a record batch; or the end is past the high "
                    f"watermark / last stable offset)"
                )
                raise KafkaConnectorError(msg)
    finally:
        if own:
            consumer.close()
