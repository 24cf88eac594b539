"""One batch of Kafka rows decoded for a job: its writer schemas fetched, its policy applied, its rows split.

:func:`decode_batch` is the step a job's epoch will run on its Kafka rows before its transform (issue 48):
the distinct writer ids of the batch (one small Spark action), each writer schema from the registry (each
id fetched once per client), the job's policy over them in id order (``pin``: :func:`resolve` each onto
the reader; ``evolve``: the reader grown by each, :func:`evolve`; ``fail``: :func:`check_same`), then one
decoding pass (:func:`decode`) with the resulting reader. It returns the decoded rows as the reader's
columns, the rows that could not be decoded (for a dead-letter table or a failure) and the reader the
batch ends with (the caller grows its table's schema in the commit that first holds those rows).

A writer schema the policy refuses raises :class:`~source_backfill.errors.SchemaChangeError` naming the
subject's id, the field and both types: that job fails alone. An id the registry does not know is not an
error of the batch: its records cannot be decoded and go with the undecodable ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from connectors.schema_registry.decode import DECODED, columns, decode, rows_where, schema_id, undecodable
from connectors.schema_registry.decode_json import decode_json
from connectors.schema_registry.decode_protobuf import decode_protobuf, read_proto
from source_backfill.core.json_schema import parse_json_schema
from source_backfill.core.schema_evolution import Record, check_same, evolve, parse, resolve
from source_backfill.errors import SchemaChangeError, SchemaNotFoundError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from connectors.schema_registry.client import RegistryClient

Policy = Literal["pin", "evolve", "fail"]
#: How a record's body is written: Avro (by its writer schema), JSON text (JSON Schema) or Protobuf.
Encoding = Literal["avro", "json", "protobuf"]


@dataclass(frozen=True)
class DecodedBatch:
    """A batch after decoding: its rows decoded, the reader after it, the writer ids it held."""

    reader: Record
    #: every row of the batch with its writer id and decoded struct (:func:`decode`'s result), for a caller
    #: that splits the rows its own way (one pass failing at the first undecodable row, say)
    decoded: DataFrame
    #: writer ids the batch held, and those the registry did not know (their records are undecodable)
    ids: tuple[int, ...]
    unknown: tuple[int, ...]
    column: str = "value"

    @property
    def rows(self) -> DataFrame:
        """The rows that decoded, as the reader's columns (made when asked: each DataFrame is analysed)."""
        return columns(rows_where(self.decoded, ~undecodable(self.decoded, self.column)), self.reader)

    @property
    def undecodable(self) -> DataFrame:
        """The rows that did not decode, as they came (with their writer id)."""
        return self.decoded.where(undecodable(self.decoded, self.column)).drop(DECODED)


def read_schema(text: str, encoding: Encoding) -> Record:
    """A registry's schema text as a record (Avro's JSON, a JSON Schema, a ``.proto``'s first message).

    SchemaChangeError for a schema out of scope.
    """
    if encoding == "protobuf":
        return read_proto(text).record()
    return parse(text) if encoding == "avro" else parse_json_schema(text)


def decode_batch(df: DataFrame, client: RegistryClient, reader: Record, policy: Policy,
                 column: str = "value", encoding: Encoding = "avro",
                 ids: tuple[int, ...] | None = None) -> DecodedBatch:
    """Decode ``df``'s ``column`` (Confluent-framed ``encoding``) onto ``reader`` by ``policy`` (the module).

    ``avro``: each body read by its writer schema (:func:`decode`); ``json``: each body, JSON text, read by
    name onto the reader (:func:`decode_json`), the writers' JSON Schemas read as records
    (:func:`parse_json_schema`) for the policy and their defaults; ``protobuf``: each body parsed by its
    writer's message and projected onto the reader by name (:func:`decode_protobuf`).

    ``ids``: the writer ids the batch is taken to hold, instead of collecting them (no Spark action);
    a record of another id then does not decode, and the caller must tell it from an undecodable one
    (:func:`outside`).
    """
    from pyspark.sql import functions as F

    if ids is None:
        ids = tuple(sorted(int(r[0]) for r in df.select(schema_id(F.col(column))).distinct().collect()
                           if r[0] is not None))
    writers, unknown, final, records = _by_policy(client, ids, reader, policy, encoding)
    if encoding == "avro":
        out = decode(df, writers, final, column)
    elif encoding == "protobuf":
        out = decode_protobuf(df, writers, final, column)
    else:
        out = decode_json(df, records, final, column)
    return DecodedBatch(final, out, ids, tuple(unknown), column)


def outside(sid: Column, ids: tuple[int, ...]) -> Column:
    """Whether a record's writer id ``sid`` (a column) is one and not among ``ids``."""
    return sid.isNotNull() & ~sid.isin(*ids)


def taken_as_is(client: RegistryClient, ids: Iterable[int], reader: Record, policy: Policy,
                encoding: Encoding = "avro") -> tuple[int, ...]:
    """Of ``ids``, those the registry knows whose writers ``policy`` takes onto ``reader`` as it is.

    No growth, no refusal: the writer ids a batch may be taken to hold (:func:`decode_batch`'s ``ids``).
    """
    out = []
    for sid in sorted(set(ids)):
        try:
            writers, _, final, _ = _by_policy(client, (sid,), reader, policy, encoding)
        except SchemaChangeError:
            continue
        if writers and final == reader:
            out.append(sid)
    return tuple(out)


def _by_policy(client: RegistryClient, ids: Iterable[int], reader: Record, policy: Policy,
               encoding: Encoding) -> tuple[dict[int, str], list[int], Record, dict[int, Record]]:
    """The writers of ``ids`` (JSON by id), the ids the registry does not know, and more.

    Also the reader after the policy over the writers (in id order) and the writers as records.
    SchemaChangeError: a writer the policy refuses.
    """
    writers: dict[int, str] = {}
    unknown: list[int] = []
    for sid in ids:
        try:
            writers[sid] = client.schema(sid)
        except SchemaNotFoundError:
            unknown.append(sid)
    final = reader
    records: dict[int, Record] = {}
    for sid, writer_json in writers.items():
        try:
            writer = records[sid] = read_schema(writer_json, encoding)
            if policy == "pin":
                resolve(reader, writer)
            elif policy == "evolve":
                final = evolve(final, writer).reader
            else:
                check_same(reader, writer)
        except SchemaChangeError as exc:
            msg = f"writer schema id {sid}: {exc}"
            raise SchemaChangeError(msg) from exc
    return writers, unknown, final, records
