"""Kafka as a PySpark Python Data Source (batch over offset ranges + streaming), format ``kafka_py``.

The rows have the schema of Spark's own Kafka source and the options mirror it, so the JVM connector can be
swapped in where its jars exist (docs/architecture.md, "Stack notes").

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

The offset ranges themselves are cut, grouped and read by :mod:`connectors.kafka.ranges`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from connectors.kafka.ranges import (
    CHUNK_ROWS,
    DEFAULT_POLL_TIMEOUT_MS,
    KafkaRange,
    KafkaRangeGroup,
    group_ranges,
    kafka_schema,
    read_range,
    split_ranges,
)
from source_backfill.core.splits import parse_split_id, split_id
from source_backfill.errors import DataLossError, KafkaConnectorError

if TYPE_CHECKING:
    from connectors.kafka.admin import KafkaAdmin

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


def _subscription(admin: KafkaAdmin, options: Mapping[str, str]) -> list[tuple[str, int]]:
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
            topic, part = parse_split_id(sid)
            wanted[sid] = int(parsed.get(topic, {}).get(str(part), fallback))
    need_earliest = [s for s, o in wanted.items() if o == -2]
    need_latest = [s for s, o in wanted.items() if o == -1]
    earliest = admin.earliest_offsets(need_earliest) if need_earliest else {}
    latest = admin.end_offsets(need_latest) if need_latest else {}
    out = {}
    for sid, off in wanted.items():
        out[sid] = earliest[sid] if off == -2 else latest[sid] if off == -1 else off
    return out


def _max_tasks(options: Mapping[str, str]) -> int:
    """``maxTasks``: Spark tasks per read at most (default: twice the driver's cores)."""
    value = options.get("maxTasks")
    return int(value) if value is not None else 2 * (os.cpu_count() or 1)


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
            topic, part = parse_split_id(sid)
            out.append(KafkaRange(topic, part, starts[sid], ends[sid]))
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


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
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

    def initialOffset(self) -> dict[str, Any]:
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

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
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

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
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
            topic, part = parse_split_id(sid)
            ranges.append(KafkaRange(topic, part, s, e))
        parts = group_ranges(split_ranges(ranges), _max_tasks(self._opts.options))
        return parts or [KafkaRange("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Arrow record batches of one split range, or of a group's ranges one after another."""
        return self._opts.read(partition)

    def commit(self, end: dict[str, Any]) -> None:
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
