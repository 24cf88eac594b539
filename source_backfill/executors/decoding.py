"""A job's records decoded by their writer schema before its transform (``jobs[].format``, issue 48).

:class:`JobDecoding` is what a job with ``format.value = "avro"`` (``"json"``, ``"protobuf"``) holds beside
its sink: a client of its source's Schema Registry and the job's **reader** schema. The reader is the one
the job's table last committed (the table property :data:`READER_PROPERTY`, set in the same commit as the
columns it gives), else the subject's version the job names, else its latest when the table is first made.

Each batch of Kafka rows (live, history, or both) goes through :meth:`JobDecoding.decode`: the writer ids
it holds, their schemas (each fetched once), the job's policy over them
(:func:`connectors.schema_registry.stage.decode_batch`), one decoding pass. When ``evolve`` grew the reader,
the job's output is computed again and the sink grows the table's columns (additions only) and its reader
property with the commit that writes these rows. A job with ``format.key`` other than ``raw`` decodes each
key the same way first (its own reader, :data:`KEY_READER_PROPERTY`), and ``key`` becomes ``key_<field>``
columns; a record is undecodable when its key or its value is. The rows that do not decode fail the job
(``on_decode_error = "fail"``: :class:`~source_backfill.errors.DecodeFailedError`) or go to the dead-letter
table (:class:`DeadLetters`) before the job's own commit.

Dead letters, exactly once: the dead-letter table is merged by ``(topic, partition, offset)``, and its
commit lands before the job's commit of the same rows. A crash between the two leaves dead letters whose
offsets the job's table does not cover yet; the job reads those offsets again (its state is its table's),
finds the same records undecodable and merges them again: the same keys, no second row. So once the job's
table covers an offset, the offset is in exactly one of the two tables. (An id unknown to the registry
when first read and registered before the re-read would decode the second time: that record would be in
both tables. Registries do not take ids back or give them late in practice; the checker would show it.)
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.schema_registry.decode import DECODED, SCHEMA_ID, columns, decode, undecodable
from connectors.schema_registry.decode_json import decode_json
from connectors.schema_registry.stage import DecodedBatch, Encoding, decode_batch, read_schema
from source_backfill import metrics
from source_backfill.config import DEAD_LETTER_SUFFIX, AvroFormat
from source_backfill.core.schema_evolution import Record, parse
from source_backfill.errors import (
    ConfigError,
    DecodeFailedError,
    ReaderOutgrownError,
    SchemaChangeError,
    SchemaNotFoundError,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from connectors.delta.sink import DeltaEpochSink
    from connectors.schema_registry.client import RegistryClient
    from source_backfill.config import JobSpec, SchemaRegistryConfig, SourceConfig

logger = logging.getLogger(__name__)

#: A job's reader schemas: its value's, and its key's (None: the key stays Kafka's bytes).
Readers = tuple[Record, Record | None]
#: Writer schema ids.
Ids = tuple[int, ...]
#: What a write fails with when a ``seen_only`` decoding meets a writer id not seen before.
UNSEEN_WRITER = "[source-backfill unseen writer id]"
#: What the error of a failing decoding pass starts with (:func:`decode_failure` finds it in Spark's).
DECODE_FAILURE = "[source-backfill decode]"
DECODE_FAILURE_END = "[end]"
#: The table property holding the job's reader schema (as Avro's JSON, whatever the job's encoding: a
#: record of columns), committed with the columns it gives.
READER_PROPERTY = "sourceBackfill.format.reader"
#: The table property holding the key's reader schema (a job with ``format.key`` other than ``raw``).
KEY_READER_PROPERTY = "sourceBackfill.format.keyReader"
#: What a decoded key's columns are named: ``key_<field>``.
KEY_PREFIX = "key_"
#: Working columns of a batch whose keys are decoded (dropped before the transform sees the rows).
_KEY_DECODED = "_key_decoded"
_KEY_SCHEMA_ID = "_key_schema_id"
#: The Kafka columns a decoded batch keeps (``value`` is replaced by the reader's fields).
KAFKA_COLUMNS = ("key", "topic", "partition", "offset", "timestamp", "timestampType")
#: The dead-letter table's key: one row per Kafka record, whatever the number of times it was read.
DEAD_LETTER_KEY = ("topic", "partition", "offset")


def registry_client(config: SchemaRegistryConfig) -> RegistryClient:
    """A client of the registry ``config`` names (its password read from its file now)."""
    from connectors.schema_registry.client import RegistryClient

    password = None
    if config.password_file is not None:
        try:
            password = Path(config.password_file).read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"schema_registry.password_file: cannot read {config.password_file}: {type(exc).__name__}"
            raise ConfigError(msg) from None
    return RegistryClient(config.url, username=config.username, password=password,
                          ca_file=config.ca_file, deadline_s=config.deadline_s)


def table_properties(path: str) -> dict[str, str]:
    """The properties of the Delta table at ``path`` (empty when there is none yet)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(path):
        return {}
    return dict(DeltaTable(path).metadata().configuration)


class JobDecoding:
    """One job's decoding: its registry client, reader schema and policies (see the module)."""

    def __init__(self, spec: JobSpec, client: RegistryClient, reader: Record,
                 key_reader: Record | None = None,
                 subjects: tuple[str | None, str | None] = (None, None)) -> None:
        self.spec = spec
        self.client = client
        self.reader = reader
        #: the key's reader schema; None: the key stays Kafka's bytes (``format.key = "raw"``)
        self.key_reader = key_reader
        fmt = spec.format
        if not isinstance(fmt, AvroFormat):
            msg = f'job "{spec.name}" decodes nothing (format.value = "{fmt.value}")'
            raise ConfigError(msg)
        self.policy = fmt.evolution
        self.encoding: Encoding = fmt.value
        self.key_encoding: Encoding | None = None if fmt.key == "raw" else fmt.key
        self.dead_letter = fmt.on_decode_error == "dead_letter"
        #: The value's and the key's subjects: their versions are the writers first taken (``seen_only``).
        self.subjects = {"value": subjects[0], "key": subjects[1]}
        #: Writer ids decoded onto a reader without growing it, by (column, reader): ``seen_only``'s.
        self._seen_ids: dict[tuple[str, str], Ids] = {}
        self._asked: set[tuple[str, str]] = set()

    @classmethod
    def open(cls, spec: JobSpec, source: SourceConfig) -> JobDecoding | None:
        """The job's decoding (None for ``raw``): its reader from its table, else from the registry."""
        fmt = spec.format
        if not isinstance(fmt, AvroFormat):
            return None
        if source.schema_registry is None:  # the config's check_job_fits_source says so first
            msg = f'job "{spec.name}": format.value = "{fmt.value}" needs sources[].schema_registry'
            raise ConfigError(msg)
        client = registry_client(source.schema_registry)
        what = "its reader schema"
        try:
            saved = table_properties(spec.sink_path).get(READER_PROPERTY)
            if saved is not None:
                reader = parse(saved)
            else:
                subject = fmt.subject or f"{source.topics[0]}-value"
                version = (client.latest(subject) if fmt.reader_version is None
                           else client.version(subject, fmt.reader_version))
                reader = read_schema(version.schema, fmt.value)
                logger.info('job reader schema job="%s" subject="%s" version=%d id=%d', spec.name, subject,
                            version.version, version.id)
            _check_names(spec.name, reader)
            key_reader = None
            if fmt.key != "raw":
                what = "its key's reader schema"
                key_reader = _key_reader(spec, source, client, fmt)
                _check_key_names(spec.name, reader, key_reader)
        except (SchemaNotFoundError, SchemaChangeError) as exc:
            client.close()
            msg = f'job "{spec.name}": {what}: {exc}'
            raise DecodeFailedError(msg) from None
        except Exception:
            client.close()
            raise
        key_subject = None if fmt.key == "raw" else fmt.key_subject or f"{source.topics[0]}-key"
        value_subject = fmt.subject or f"{source.topics[0]}-value"
        return cls(spec, client, reader, key_reader, (value_subject, key_subject))

    def properties(self, reader: Record | None = None) -> dict[str, str]:
        """The table properties that record ``reader`` (the job's current one by default) and the key's."""
        out = {READER_PROPERTY: _text(reader or self.reader)}
        if self.key_reader is not None:
            out[KEY_READER_PROPERTY] = _text(self.key_reader)
        return out

    def empty_input(self, spark: SparkSession, reader: Record | None = None) -> DataFrame:
        """No rows, in the columns a decoded batch has under ``reader``: what the transform reads."""
        from connectors.kafka.ranges import kafka_schema

        empty, reader = spark.createDataFrame([], kafka_schema()), reader or self.reader
        if self.key_reader is not None:
            keys = decode_json(empty, {}, self.key_reader, column="key")
            empty = keys.withColumnsRenamed({DECODED: _KEY_DECODED, SCHEMA_ID: _KEY_SCHEMA_ID})
        rows = decode(empty, {}, reader) if self.encoding == "avro" else decode_json(empty, {}, reader)
        return self._key_columns(columns(rows, reader), self.key_reader)

    def readers(self) -> Readers:
        """The job's reader schemas now: the value's and the key's (what a read ahead decodes onto)."""
        return self.reader, self.key_reader

    def decode(self, df: DataFrame, sink: DeltaEpochSink, output: Any,
               dead_letters: DeadLetters | None, *, ahead: Readers | None = None,
               seen_only: bool = False, epoch: int | None = None) -> DataFrame:
        """``df``'s Kafka rows decoded (see the module); the table grown first when the reader grew.

        ``output``: the job's output schema for a reader (``output(reader) -> StructType``), to grow the
        table by. Raises :class:`DecodeFailedError` for a writer schema the policy refuses and, with
        ``on_decode_error = "fail"``, for records that do not decode.

        ``ahead``: the readers a history read ahead decodes onto (:meth:`readers` when it was started).
        It grows nothing (a table's growth lands with an epoch's commit, on the epoch's thread): records
        those readers do not cover raise :class:`ReaderOutgrownError`, and the job reads them in an epoch.

        ``epoch``: the dead letters' (:meth:`DeadLetters.write`).

        ``seen_only``: take the batch to hold only writer ids seen before under these readers (none
        growing them), instead of collecting its ids first (a Spark action less); a record of another id
        fails the write naming :data:`UNSEEN_WRITER` (:func:`unseen_writer`), and the caller decodes the
        rows again without it. Nothing is taken when no id was seen yet.
        """
        from pyspark.sql import functions as F  # noqa: N812

        from connectors.schema_registry.decode import rows_where
        from connectors.schema_registry.stage import outside

        reader, key_reader = self.readers() if ahead is None else ahead
        seen = self._seen(reader, key_reader) if seen_only else None
        keys = self._decode_keys(df, key_reader, None if seen is None else seen[1]) \
            if key_reader is not None else None
        batch = self._decode_values(df if keys is None else keys.decoded.withColumnsRenamed(
            {DECODED: _KEY_DECODED, SCHEMA_ID: _KEY_SCHEMA_ID}), reader, None if seen is None else seen[0])
        grew = batch.reader != reader or (keys is not None and keys.reader != key_reader)
        if not grew and seen is None:
            self._saw(reader, key_reader, batch, keys)
        if ahead is None:
            self._grow(batch, keys, sink, output)
        elif grew:
            ids = batch.ids + (keys.ids if keys is not None else ())
            msg = (f'job "{self.spec.name}": writer schema ids {",".join(map(str, ids))} grow its reader '
                   "schema: read in an epoch")
            raise ReaderOutgrownError(msg)
        key_reader = None if keys is None else keys.reader  # the grown one, when the batch grew it
        out = batch.decoded
        bad = undecodable(out)
        why = _why_column(F.col(SCHEMA_ID), batch.unknown)
        if keys is not None:  # a record is undecodable when its key is
            key_bad = F.col("key").isNotNull() & F.col(_KEY_DECODED).isNull()
            key_why = F.concat(F.lit("its key: "), _why_column(F.col(_KEY_SCHEMA_ID), keys.unknown))
            bad, why = bad | key_bad, F.when(key_bad, key_why).otherwise(why)
        if seen is not None:  # evaluated wherever ``bad`` is (rows_where's conditions): never pruned
            unseen = outside(F.col(SCHEMA_ID), seen[0])
            if keys is not None:
                unseen = unseen | outside(F.col(_KEY_SCHEMA_ID), seen[1])
            bad = F.when(unseen, F.raise_error(F.lit(f"{UNSEEN_WRITER} {DECODE_FAILURE_END}"))).otherwise(bad)
        if dead_letters is not None:
            n = dead_letters.write(rows_where(out, bad), why, epoch)
            if n:
                metrics.DEAD_LETTERS.labels(self.spec.name).inc(n)
            return self._key_columns(columns(rows_where(out, ~bad), batch.reader), key_reader)
        return self._failing(out, bad, why, batch.reader, key_reader)

    def _seen(self, reader: Record, key_reader: Record | None) -> tuple[Ids, Ids] | None:
        """The writer ids seen under these readers (value's, key's), None if either has none yet.

        Before any batch was decoded onto a reader, its subject's versions the policy takes onto it as
        it is (asked once): the writers a topic's records are usually of.
        """
        values = self._seen_under("value", reader)
        keys = () if key_reader is None else self._seen_under("key", key_reader)
        return (values, keys) if values and (key_reader is None or keys) else None

    def _seen_under(self, column: str, reader: Record) -> Ids:
        from connectors.schema_registry.stage import taken_as_is

        where = (column, _text(reader))
        subject = self.subjects[column]
        if where not in self._seen_ids and where not in self._asked and subject is not None:
            self._asked.add(where)
            encoding = self.encoding if column == "value" else self.key_encoding
            try:
                ids = [v.id for v in self.client.versions(subject)]
                found = taken_as_is(self.client, ids, reader, self.policy, encoding or "avro")
            except Exception as exc:  # noqa: BLE001 - then the batch's ids are collected, as always
                logger.info('subject versions not read job="%s" subject="%s" error="%s"', self.spec.name,
                            subject, exc)
                found = ()
            if found:
                self._seen_ids.setdefault(where, found)
        return self._seen_ids.get(where, ())

    def _saw(self, reader: Record, key_reader: Record | None, batch: DecodedBatch,
             keys: DecodedBatch | None) -> None:
        """A batch's writer ids (the registry knew them) decoded onto the readers without growing them."""
        for column, on, decoded in (("value", reader, batch), ("key", key_reader, keys)):
            if on is not None and decoded is not None:
                where = (column, _text(on))
                known = set(decoded.ids) - set(decoded.unknown) | set(self._seen_ids.get(where, ()))
                if known:  # a batch without a record (an epoch's, say) saw nothing
                    self._seen_ids[where] = tuple(sorted(known))

    def _decode_values(self, df: DataFrame, reader: Record, ids: Ids | None) -> DecodedBatch:
        try:
            batch = decode_batch(df, self.client, reader, self.policy, encoding=self.encoding, ids=ids)
        except SchemaChangeError as exc:
            msg = f'job "{self.spec.name}": {exc} (format.evolution = "{self.policy}")'
            raise DecodeFailedError(msg) from None
        if batch.unknown:
            logger.warning('schema ids unknown to the registry job="%s" ids=%s', self.spec.name,
                           ",".join(map(str, batch.unknown)))
        return batch

    def _decode_keys(self, df: DataFrame, key_reader: Record, ids: Ids | None) -> DecodedBatch:
        """``df``'s keys decoded onto ``key_reader`` (every row kept, :data:`DECODED` the key's)."""
        assert self.key_encoding is not None  # noqa: S101 - the caller's: a key reader for a decoded key
        try:
            return decode_batch(df, self.client, key_reader, self.policy, column="key",
                                encoding=self.key_encoding, ids=ids)
        except SchemaChangeError as exc:
            msg = f'job "{self.spec.name}": its key: {exc} (format.evolution = "{self.policy}")'
            raise DecodeFailedError(msg) from None

    def _grow(self, batch: DecodedBatch, keys: DecodedBatch | None, sink: DeltaEpochSink,
              output: Any) -> None:
        """Grow the table (columns and reader properties) when the batch grew the reader or the key's."""
        key_reader = keys.reader if keys is not None else self.key_reader
        if batch.reader == self.reader and key_reader == self.key_reader:
            return
        before, self.key_reader = self.key_reader, key_reader  # output() reads the key's columns from it
        try:
            added = sink.grow(output(batch.reader), self.properties(batch.reader))
        except BaseException:
            self.key_reader = before  # not grown: the next batch tries again
            raise
        ids = batch.ids + (keys.ids if keys is not None else ())
        logger.info('job reader schema evolved job="%s" ids=%s added_columns=%s', self.spec.name,
                    ",".join(map(str, ids)), ",".join(added) or "-")
        self.reader = batch.reader

    def _key_columns(self, df: DataFrame, key_reader: Record | None) -> DataFrame:
        """``df`` with ``key`` replaced, in place, by the key's decoded columns (``key_<field>``)."""
        from pyspark.sql import functions as F  # noqa: N812

        if key_reader is None:
            return df
        out: list[Any] = []
        for c in df.columns:
            if c == "key":
                out += [F.col(f"{_KEY_DECODED}.{f.name}").alias(f"{KEY_PREFIX}{f.name}")
                        for f in key_reader.fields]
            elif c not in (_KEY_DECODED, _KEY_SCHEMA_ID):
                out.append(F.col(c))
        return df.select(*out)

    def _failing(self, out: DataFrame, bad: Any, why: Any, reader: Record,
                 key_reader: Record | None) -> DataFrame:
        """The decoded rows, in a plan that fails at the first undecodable one (in the write's own pass).

        Spark's ``raise_error`` in the condition of :func:`~connectors.schema_registry.decode.rows_where`:
        a filter the optimizer keeps whatever columns the transform reads (a projection would drop a check
        no output column reads) and does not push into the decoding (which would decode each record
        twice). The job turns the error into :class:`DecodeFailedError`
        (:func:`decode_failure`).
        """
        from pyspark.sql import functions as F  # noqa: N812

        from connectors.schema_registry.decode import rows_where

        split = F.concat_ws(":", F.col("topic"), F.col("partition").cast("string"))
        where = F.concat_ws(" ", F.lit(f"{DECODE_FAILURE} the record at"), split, F.lit("offset"),
                            F.col("offset").cast("string"), F.lit("cannot be decoded ("), why,
                            F.lit(f") {DECODE_FAILURE_END}"))
        guard = F.when(bad, F.raise_error(where)).otherwise(F.lit(True))
        return self._key_columns(columns(rows_where(out, guard), reader), key_reader)

    def close(self) -> None:
        """Close the registry client."""
        self.client.close()


class DeadLetters:
    """A job's dead-letter table: the raw records it could not decode, merged by their offset.

    Its commits carry the job's epoch as their transaction version (the next free one after a replayed
    epoch's: a crash between this table's commit and the job's makes the job read the same offsets again,
    and their second merge finds the same keys).
    """

    def __init__(self, spec: JobSpec) -> None:
        from connectors.delta.sink import DeltaEpochSink

        self.path = spec.dead_letter_path or f"{spec.sink_path.rstrip('/')}{DEAD_LETTER_SUFFIX}"
        self.sink = DeltaEpochSink(self.path, spec.name, dead_letter_schema(), mode="merge",
                                   key_columns=DEAD_LETTER_KEY)
        #: The epoch the job is committing (set by the job before it decodes the epoch's rows).
        self.epoch = 0
        self._lock = threading.Lock()

    def write(self, bad: DataFrame, why: Any, epoch: int | None = None) -> int:
        """Merge the undecodable rows ``bad`` (none: nothing written), ``why`` each; how many there were.

        Epochs and the job's history reads ahead write in turn (one commit at a time: each takes the
        next transaction version).
        ``epoch``: the job's epoch the rows are read for (its ``epoch`` column), :attr:`epoch` by default;
        a history read ahead's is the first epoch that may commit it (its adopting one is not known yet).
        """
        with self._lock:
            return self._write(bad, why, self.epoch if epoch is None else epoch)

    def _write(self, bad: DataFrame, why: Any, epoch: int) -> int:
        from pyspark.sql import functions as F  # noqa: N812

        from connectors.delta.merge import CHANGE_TYPE

        rows = bad.select(*(F.col(c) for c in ("topic", "partition", "offset", "timestamp", "key", "value")),
                          F.col(SCHEMA_ID).alias("schema_id"), why.alias("error"),
                          F.lit(epoch).cast("long").alias("epoch"), F.lit("insert").alias(CHANGE_TYPE))
        table = rows.toArrow()
        if table.num_rows == 0:
            return 0
        done = self.sink.committed_epoch()
        version = epoch if done is None or done < epoch else done + 1
        self.sink.commit_epoch(version, table, {"dead_letters": table.num_rows})
        logger.warning('records dead-lettered job="%s" epoch=%d count=%d table="%s"', self.sink.job_id,
                       epoch, table.num_rows, self.path)
        return int(table.num_rows)


def unseen_writer(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``seen_only`` decoding meeting a writer id not seen before."""
    return UNSEEN_WRITER in str(exc)


def decode_failure(job: str, exc: BaseException) -> DecodeFailedError | None:
    """The job's DecodeFailedError if ``exc`` is Spark failing on an undecodable record, else None."""
    text = str(exc)
    at = text.find(DECODE_FAILURE)
    if at < 0:
        return None
    detail = text[at + len(DECODE_FAILURE):].split(DECODE_FAILURE_END, 1)[0].strip()
    detail = detail.replace("( ", "(").replace(" )", ")")
    return DecodeFailedError(f'job "{job}": {detail}; format.on_decode_error = "dead_letter" keeps such '
                             "records in a table beside the job's")


def dead_letter_schema() -> StructType:
    """The dead-letter table's columns: where the record was, the record as Kafka gave it, and why."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from connectors.kafka.ranges import kafka_schema

    kafka = {f.name: f for f in kafka_schema().fields}
    return StructType([
        *(kafka[name] for name in ("topic", "partition", "offset", "timestamp", "key", "value")),
        StructField("schema_id", LongType()), StructField("error", StringType()),
        StructField("epoch", LongType()), StructField("_change_type", StringType()),
    ])


def _key_reader(spec: JobSpec, source: SourceConfig, client: RegistryClient, fmt: AvroFormat) -> Record:
    """The key's reader: the one the job's table committed, else its subject's latest version."""
    saved = table_properties(spec.sink_path).get(KEY_READER_PROPERTY)
    if saved is not None:
        return parse(saved)
    subject = fmt.key_subject or f"{source.topics[0]}-key"
    version = client.latest(subject)
    logger.info('job key reader schema job="%s" subject="%s" version=%d id=%d', spec.name, subject,
                version.version, version.id)
    encoding: Encoding = "avro" if fmt.key == "raw" else fmt.key  # not raw: the caller checked
    return read_schema(version.schema, encoding)


def _check_key_names(job: str, reader: Record, key_reader: Record) -> None:
    names = {f"{KEY_PREFIX}{f.name}" for f in key_reader.fields}
    clash = sorted(names & ({f.name for f in reader.fields} | set(KAFKA_COLUMNS)))
    if clash:
        msg = (f'job "{job}": the key\'s columns {clash} are named like the value\'s or Kafka\'s: the '
               "decoded rows cannot hold both")
        raise SchemaChangeError(msg)


def _check_names(job: str, reader: Record) -> None:
    clash = sorted({f.name for f in reader.fields} & set(KAFKA_COLUMNS))
    if clash:
        msg = (f'job "{job}": the reader schema has fields named like Kafka\'s columns {clash}: the decoded '
               "rows cannot hold both")
        raise SchemaChangeError(msg)


def _text(reader: Record) -> str:
    """A reader schema as its table property holds it (Avro's JSON, keys sorted): also its identity."""
    return json.dumps(reader.avro(), sort_keys=True)


def _why(sid: int | None, unknown: tuple[int, ...]) -> str:
    if sid is None:
        return "not in the Confluent wire format: no magic byte 0 and schema id"
    if sid in unknown:
        return f"schema id {sid} is unknown to the registry"
    return f"its body does not decode with writer schema id {sid}"


def _why_column(sid: Any, unknown: tuple[int, ...]) -> Any:
    from pyspark.sql import functions as F  # noqa: N812

    text = F.concat(F.lit("its body does not decode with writer schema id "), sid.cast("string"))
    if unknown:
        text = F.when(sid.isin(*unknown), F.concat(F.lit("schema id "), sid.cast("string"),
                                                   F.lit(" is unknown to the registry"))).otherwise(text)
    return F.when(sid.isNull(), F.lit(_why(None, ()))).otherwise(text)
