"""Kafka as a PySpark Python Data Source (batch over offset ranges + streaming), format ``kafka_py``.

The rows have the schema of Spark's own Kafka source and the options mirror it, so the JVM connector can be
swapped in where its jars exist (DESIGN.md section 3).

Batch options: ``kafka.bootstrap.servers`` (+ any ``kafka.*`` passed to confluent-kafka) and EITHER
``ranges`` = JSON list of ``{"topic", "partition", "start", "end"}`` (end exclusive; what the runtime uses)
OR ``subscribe``/``subscribePattern`` + ``startingOffsets``/``endingOffsets`` (``earliest``, ``latest`` or
JSON ``{"topic": {"0": 23}}`` with -2 = earliest, -1 = latest); ``failOnDataLoss`` (default true);
``includeHeaders`` (default false); ``kafkaConsumer.pollTimeoutMs`` (stall deadline, default 60 s);
``chunkRows`` (rows per Arrow batch, default 10000).

Streaming options: ``subscribe`` (comma list) or ``subscribePattern``, ``startingOffsets``
(earliest | latest | JSON), ``startingTimestamp`` (epoch ms; wins over ``startingOffsets``, like Spark),
``maxOffsetsPerTrigger``, ``failOnDataLoss``, ``includeHeaders``, ``kafka.*``. Batch reads accept
``startingTimestamp`` / ``endingTimestamp`` too.

The streaming offset is ``{"splits": {"topic:partition": next_offset}, "tick": n}``, plus
``"born": {"topic:partition": first_offset}`` in the batch that first reads a new split (new partition or new
topic of a pattern; it starts at its earliest offset). ``tick`` grows on every ``latestOffset`` call so Spark
runs a micro-batch on every trigger even when no record arrived. Every range of a batch is derived from its
start and end offsets alone (``born`` included), so a replayed batch reads exactly the same range.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import is_not
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
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

from source_backfill.core.splits import split_id
from source_backfill.errors import DataLossError, KafkaConnectorError, UnknownTopicError

try:  # pyspark >= 4.2: admission control + availableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older pyspark
    ReadAllAvailable = ReadLimit = ReadMaxRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

logger = logging.getLogger(__name__)

KAFKA_FORMAT = "kafka_py"

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


def reader_options(source: Any, bootstrap_servers: str, max_tasks: int) -> dict[str, str]:
    """The options of the ``kafka_py`` source for a Kafka source config (``kafka.*``, deadlines, tasks).

    The twin of :func:`connectors.kafka.spark_kafka.reader_options`; the consumer's own defaults
    (``read_committed`` included) come from :data:`connectors.kafka.admin.CONSUMER_DEFAULTS`.
    """
    options = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "failOnDataLoss": str(source.fail_on_data_loss).lower(),
        "maxTasks": str(max_tasks),
        "kafkaConsumer.pollTimeoutMs": str(round(source.poll_timeout_s * 1000)),
    }
    options.update({f"kafka.{key}": value for key, value in source.kafka.items()})
    return options


def register(spark: Any) -> None:
    """Register the ``kafka_py`` data source on ``spark``."""
    spark.dataSource.register(KafkaDataSource)


# -- option parsing ------------------------------------------------------------------------------------
def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    return str(raw).strip().lower() in ("true", "1", "yes")


def _kafka_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options with the prefix stripped (``kafka.bootstrap.servers`` included)."""
    return {k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")}


def _bootstrap(options: Mapping[str, str]) -> str:
    servers = options.get("kafka.bootstrap.servers")
    if not servers:
        msg = 'option "kafka.bootstrap.servers" is required for format kafka_py'
        raise KafkaConnectorError(msg)
    return str(servers)


def _poll_timeout_s(options: Mapping[str, str]) -> float:
    return int(options.get("kafkaConsumer.pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS)) / 1000.0


def _subscription(admin: Any, options: Mapping[str, str]) -> list[tuple[str, int]]:
    """Splits of ``subscribe`` (comma list; UnknownTopicError if missing) or ``subscribePattern``."""
    if options.get("subscribe"):
        topics = [t.strip() for t in str(options["subscribe"]).split(",") if t.strip()]
        return admin.list_splits(topics)
    if options.get("subscribePattern"):
        pattern = re.compile(str(options["subscribePattern"]))
        topics = sorted(t for t in admin.topic_partitions() if pattern.fullmatch(t))
        return admin.list_splits(topics)
    msg = 'one of the options "ranges", "subscribe" or "subscribePattern" is required for kafka_py'
    raise KafkaConnectorError(msg)


def _timestamp(options: Mapping[str, str], key: str) -> int | None:
    raw = options.get(key)
    if raw is None or str(raw).strip() == "":
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        msg = f'option "{key}" must be a timestamp in epoch milliseconds, got {raw!r}'
        raise KafkaConnectorError(msg) from None


def _resolve_offsets(
    admin: Any,
    sids: list[str],
    spec: str | None,
    default: str,
    timestamp_ms: int | None = None,
) -> dict[str, int]:
    """Offsets per split for ``earliest``/``latest``/JSON (-2 earliest, -1 latest); absent -> ``default``.

    A ``timestamp_ms`` wins over ``spec`` (as Spark's ``startingTimestamp`` does): the first offset with a
    record timestamp >= it, or the end offset when there is none.
    """
    if timestamp_ms is not None:
        return admin.offsets_for_timestamp(sids, timestamp_ms) if sids else {}
    spec = (spec or default).strip()
    wanted: dict[str, int] = {}
    if spec == "earliest":
        wanted = dict.fromkeys(sids, -2)
    elif spec == "latest":
        wanted = dict.fromkeys(sids, -1)
    else:
        try:
            parsed = json.loads(spec)
        except json.JSONDecodeError as exc:
            msg = f"offsets option is neither earliest, latest nor JSON: {spec!r}"
            raise KafkaConnectorError(msg) from exc
        fallback = -2 if default == "earliest" else -1
        for sid in sids:
            topic, part = sid.rsplit(":", 1)
            wanted[sid] = int(parsed.get(topic, {}).get(part, fallback))
    need_earliest = [s for s, o in wanted.items() if o == -2]
    need_latest = [s for s, o in wanted.items() if o == -1]
    earliest = admin.earliest_offsets(need_earliest) if need_earliest else {}
    latest = admin.end_offsets(need_latest) if need_latest else {}
    out = {}
    for sid, off in wanted.items():
        out[sid] = earliest[sid] if off == -2 else latest[sid] if off == -1 else off
    return out


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


def _max_tasks(options: Mapping[str, str]) -> int:
    """``maxTasks``: Spark tasks per read at most (default: twice the driver's cores)."""
    value = options.get("maxTasks")
    return int(value) if value is not None else 2 * (os.cpu_count() or 1)


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
                    return consumer.get_watermark_offsets(tp, timeout=attempt_s)
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
        keys: list = []
        values: list = []
        offsets: list = []
        stamps: list = []
        headers: list = []
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
                    offs = list(map(m_offset, good))
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
                    f"{poll_timeout_s:.0f}s (broker {bootstrap} unreachable, or the end is past the "
                    f"high watermark / last stable offset)"
                )
                raise KafkaConnectorError(msg)
    finally:
        if own:
            consumer.close()


#: Rows per Parquet row group of :func:`write_ranges_parquet` (Spark writes ~128 MB groups; this is
#: ~20 MB of Kafka records of ~150 B, and bounds what one task holds in memory).
ROW_GROUP_ROWS = 131_072


def write_ranges_parquet(
    ranges: Sequence[KafkaRange],
    bootstrap: str,
    kafka_options: Mapping[str, Any],
    folder: str,
    *,
    fail_on_data_loss: bool = True,
    poll_timeout_s: float = DEFAULT_POLL_TIMEOUT_MS / 1000.0,
    niceness: int = 0,
) -> dict[str, int]:
    """Copy the records of ``ranges`` into Parquet files in ``folder`` (one per range); rows per split.

    The files have the source's Arrow schema (what Spark would write for its rows, headers left out).
    Meant to run in a Spark task: reading and writing stay in Arrow and pyarrow's Parquet writer, a
    third of the CPU of the same copy through Spark's Arrow -> row -> Parquet path. ``niceness`` > 0
    runs the whole copy at that lower CPU priority (:func:`niced`). A range whose records are all gone
    (transaction markers, compaction) writes no file.
    """

    def copy() -> Iterator[dict[str, int]]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows: dict[str, int] = {}
        for rng in ranges:
            path = f"{folder}/part-{rng.topic}-{rng.partition}-{rng.start}-{uuid.uuid4().hex[:8]}.parquet"
            writer = None
            pending: list[Any] = []
            pending_rows = 0
            try:
                for batch in read_range(rng, bootstrap, kafka_options, fail_on_data_loss=fail_on_data_loss,
                                        poll_timeout_s=poll_timeout_s):
                    pending.append(batch)
                    pending_rows += batch.num_rows
                    rows[rng.split_id] = rows.get(rng.split_id, 0) + batch.num_rows
                    if pending_rows >= ROW_GROUP_ROWS:
                        writer = writer or pq.ParquetWriter(path, batch.schema, compression="snappy")
                        writer.write_table(pa.Table.from_batches(pending))
                        pending, pending_rows = [], 0
                if pending:
                    writer = writer or pq.ParquetWriter(path, pending[0].schema, compression="snappy")
                    writer.write_table(pa.Table.from_batches(pending))
            finally:
                if writer is not None:
                    writer.close()
        yield rows

    produced = list(niced(copy, niceness)) if niceness > 0 else list(copy())
    return produced[0]


def warm_copy(_: object = None) -> int:
    """Import what :func:`write_ranges_parquet` needs, in a Spark task's Python worker (a warm-up)."""
    import confluent_kafka  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from connectors.kafka import admin  # noqa: F401

    return os.getpid()


# -- batch ---------------------------------------------------------------------------------------------
class _ReaderOptions:
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options  # Spark's CaseInsensitiveDict: keep it (keys are lower-cased inside)
        self.bootstrap = _bootstrap(self.options)
        self.kafka = _kafka_options(self.options)
        self.include_headers = _bool(self.options, "includeHeaders", False)
        self.fail_on_data_loss = _bool(self.options, "failOnDataLoss", True)
        self.poll_timeout_s = _poll_timeout_s(self.options)
        self.chunk_rows = int(self.options.get("chunkRows", CHUNK_ROWS))

    def admin(self) -> Any:
        from connectors.kafka.admin import KafkaAdmin

        return KafkaAdmin(self.bootstrap, self.kafka)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, KafkaRangeGroup):
            return (batch for rng in partition.ranges for batch in self.read(rng))
        assert isinstance(partition, KafkaRange)  # noqa: S101
        return read_range(
            partition,
            self.bootstrap,
            self.kafka,
            include_headers=self.include_headers,
            fail_on_data_loss=self.fail_on_data_loss,
            poll_timeout_s=self.poll_timeout_s,
            chunk_rows=self.chunk_rows,
        )


_END = object()


def niced(produce: Callable[[], Iterator[Any]], niceness: int, depth: int = 2) -> Iterator[Any]:
    """Yield the items of ``produce()``, run in a thread of its own at CPU ``niceness`` at least.

    On Linux niceness is per thread, and threads inherit it when created: the consumer's librdkafka
    threads, made inside ``produce``, run niced too, while the (reused) worker process keeps its own.
    Where a thread's priority cannot be set, it reads at normal priority. ``depth`` items are read
    ahead at most; closing this generator stops the thread at its next item.
    """
    items: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            tid = threading.get_native_id()  # never raises the priority of an already niced worker
            os.setpriority(os.PRIO_PROCESS, tid, max(niceness, os.getpriority(os.PRIO_PROCESS, tid)))
        except (AttributeError, OSError) as exc:
            logger.debug('reader niceness not set niceness=%d error="%s"', niceness, exc)
        try:
            for item in produce():
                if not put(item):
                    return
        except BaseException as exc:  # noqa: BLE001 - raised in the reading thread below
            put((_END, exc))
            return
        put((_END, None))

    thread = threading.Thread(target=run, name="kafka-reader-niced", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if isinstance(item, tuple) and len(item) == 2 and item[0] is _END:
                if item[1] is not None:
                    raise item[1]
                return
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def parse_ranges(raw: str) -> list[KafkaRange]:
    """Parse the ``ranges`` option (JSON list of {"topic", "partition", "start", "end"})."""
    try:
        items = json.loads(raw)
        return [
            KafkaRange(str(r["topic"]), int(r["partition"]), int(r["start"]), int(r["end"])) for r in items
        ]
    except (ValueError, KeyError, TypeError) as exc:
        msg = f'option "ranges" must be a JSON list of {{"topic","partition","start","end"}}: {exc}'
        raise KafkaConnectorError(msg) from exc


class KafkaBatchReader(DataSourceReader):
    """Batch reader: one InputPartition per offset range (large ranges split)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._opts = _ReaderOptions(options)

    def _ranges(self) -> list[KafkaRange]:
        options = self._opts.options
        if options.get("ranges"):
            return parse_ranges(str(options["ranges"]))
        admin = self._opts.admin()
        sids = [split_id(t, p) for t, p in _subscription(admin, options)]
        starts = _resolve_offsets(
            admin, sids, options.get("startingOffsets"), "earliest", _timestamp(options, "startingTimestamp")
        )
        ends = _resolve_offsets(
            admin, sids, options.get("endingOffsets"), "latest", _timestamp(options, "endingTimestamp")
        )
        out = []
        for sid in sids:
            topic, part = sid.rsplit(":", 1)
            out.append(KafkaRange(topic, int(part), starts[sid], ends[sid]))
        return out

    def partitions(self) -> Sequence[InputPartition]:
        """One partition per (piece of a) non-empty range; one empty partition when there is nothing."""
        parts = group_ranges(split_ranges(self._ranges()), _max_tasks(self._opts.options))
        logger.info('kafka batch planned partitions="%d"', len(parts))
        return parts or [KafkaRange("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Arrow record batches of one range, or of a group's ranges one after another."""
        return self._opts.read(partition)


# -- streaming -----------------------------------------------------------------------------------------
def fair_advance(available: Mapping[str, int], budget: int) -> dict[str, int]:
    """Spread ``budget`` offsets over splits (water-filling): every split gets an equal share or less."""
    grant = dict.fromkeys(available, 0)
    left = {s: a for s, a in available.items() if a > 0}
    while budget > 0 and left:
        share = max(1, budget // len(left))
        for sid in sorted(left):
            if budget <= 0:
                break
            take = min(share, left[sid], budget)
            grant[sid] += take
            left[sid] -= take
            budget -= take
        left = {s: a for s, a in left.items() if a > 0}
    return grant


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Micro-batch reader; offsets are ``{"splits": {...}, "tick": n}``."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._opts = _ReaderOptions(options)
        raw_max = self._opts.options.get("maxOffsetsPerTrigger")
        self._max_offsets = int(raw_max) if raw_max else None
        self._target: dict[str, int] | None = None
        self._admin_client: Any = None

    @property
    def _admin(self) -> Any:
        if self._admin_client is None:
            self._admin_client = self._opts.admin()
        return self._admin_client

    def _sids(self) -> list[str]:
        return [split_id(t, p) for t, p in _subscription(self._admin, self._opts.options)]

    def initialOffset(self) -> dict:
        """Offsets of ``startingTimestamp`` or ``startingOffsets`` (default latest, like Spark); tick 0."""
        sids = self._sids()
        options = self._opts.options
        starts = _resolve_offsets(
            self._admin,
            sids,
            options.get("startingOffsets"),
            "latest",
            _timestamp(options, "startingTimestamp"),
        )
        return {"splits": starts, "tick": 0}

    def getDefaultReadLimit(self) -> Any:
        """``ReadMaxRows(maxOffsetsPerTrigger)`` when set, else read all available."""
        if self._max_offsets and ReadMaxRows is not None:
            return ReadMaxRows(self._max_offsets)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        """Remember the current ends; latestOffset never goes past them (and stops ticking there)."""
        sids = self._sids()
        self._target = self._admin.end_offsets(sids)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """Next end offsets: exact ends, capped by the read limit, with ``tick`` + 1 (always a new batch)."""
        start = start or {}
        begin_splits: dict[str, int] = {k: int(v) for k, v in dict(start.get("splits", {})).items()}
        tick = int(start.get("tick", 0)) + 1
        sids = self._sids()
        if self._target is not None:
            sids = [s for s in sids if s in self._target]
        ends = self._admin.end_offsets(sids)
        if self._target is not None:
            ends = {s: min(e, self._target[s]) for s, e in ends.items()}
        new = [s for s in sids if s not in begin_splits]
        earliest = self._admin.earliest_offsets(new) if new else {}
        begins = {s: begin_splits.get(s, earliest.get(s, 0)) for s in sids}
        for sid in sids:
            if ends[sid] < begins[sid]:
                msg = (
                    f"Kafka split {sid} end offset {ends[sid]} is below the committed position "
                    f"{begins[sid]} (topic recreated or truncated)"
                )
                if self._opts.fail_on_data_loss:
                    raise DataLossError(msg)
                logger.warning('kafka offsets went backwards split="%s" detail="%s"', sid, msg)
                begins[sid] = ends[sid]
        available = {s: ends[s] - begins[s] for s in sids}
        budget: int | None = None
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            budget = int(limit.max_rows)
        elif limit is None and self._max_offsets:
            budget = self._max_offsets
        if budget is not None:
            grant = fair_advance(available, budget)
        else:
            grant = available
        splits = dict(begin_splits)
        born: dict[str, int] = {}
        for sid in sids:
            if sid in begin_splits or grant[sid] > 0:
                splits[sid] = begins[sid] + grant[sid]
                if sid not in begin_splits:
                    born[sid] = begins[sid]  # recorded so a replay starts the new split at the same offset
        if self._target is not None and splits == begin_splits and start:
            return start  # availableNow reached its target: no new batch, the query can finish
        if born:
            logger.info('kafka new splits splits="%s"', ",".join(f"{s}@{o}" for s, o in sorted(born.items())))
        logger.debug('kafka latest offset tick="%d" splits="%d"', tick, len(splits))
        offset: dict[str, Any] = {"splits": splits, "tick": tick}
        if born:
            offset["born"] = born
        return offset

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """One partition per split range ``[start, end)``; a new split starts where ``end["born"]`` says.

        Only offsets written before an older version recorded ``born`` fall back to the current earliest.
        """
        begin = {k: int(v) for k, v in dict(start.get("splits", {})).items()}
        begin.update({k: int(v) for k, v in dict(end.get("born", {})).items() if k not in begin})
        stop = {k: int(v) for k, v in dict(end.get("splits", {})).items()}
        new = [s for s in stop if s not in begin]
        earliest = self._admin.earliest_offsets(new) if new else {}
        ranges = []
        for sid, e in stop.items():
            s = begin.get(sid, earliest.get(sid, 0))
            topic, part = sid.rsplit(":", 1)
            ranges.append(KafkaRange(topic, int(part), s, e))
        parts = group_ranges(split_ranges(ranges), _max_tasks(self._opts.options))
        return parts or [KafkaRange("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Arrow record batches of one split range, or of a group's ranges one after another."""
        return self._opts.read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint."""


class KafkaDataSource(DataSource):
    """The ``kafka_py`` data source (batch + streaming)."""

    @classmethod
    def name(cls) -> str:
        """The format name ``kafka_py``."""
        return KAFKA_FORMAT

    def schema(self) -> StructType:
        """Spark's Kafka source schema."""
        return kafka_schema(_bool(self.options, "includeHeaders", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader."""
        return KafkaBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The micro-batch stream reader."""
        return KafkaStreamReader(self.options)
