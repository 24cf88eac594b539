"""Confluent-framed Protobuf records decoded by their writer schema's id, on the Python side of Spark.

The framing is Avro's (:mod:`.decode`: a magic byte 0, the writer schema's id) followed by the message
indexes (:func:`~source_backfill.core.proto_schema.split_indexes`) and the message's bytes. Each writer's
``.proto`` text (or, as some serializers register it, a base64 ``FileDescriptorProto``: :func:`read_proto`)
becomes a message class of the ``protobuf`` package (its C parser, upb), built once per id in each Python
worker; each record is parsed by its own writer's class and projected onto the job's reader by name
(:func:`~source_backfill.core.schema_evolution.resolve`: promotions, defaults).

Why Python and not Spark: ``spark-protobuf`` is not served by the Maven mirror this project fetches from
(4.2.0 and older asked for, 2026-11-29), so the records go through one Arrow-batched Python UDF.

A record is undecodable (a null ``decoded``, :func:`~.decode.undecodable`) when its magic byte is not 0,
its id is not known, its indexes name a message other than the file's first, its bytes do not parse
(truncated, a bad varint, a string that is not UTF-8), or a ``bytes`` field read as a ``string`` column
is not UTF-8.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from connectors.schema_registry.decode import DECODED, SCHEMA_ID, schema_id
from connectors.schema_registry.decode_json import spark_struct
from source_backfill.core.proto_schema import TYPES, ProtoField, ProtoMessage, first_message, split_indexes
from source_backfill.core.schema_evolution import Record, resolve
from source_backfill.errors import SchemaChangeError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: ``FieldDescriptorProto`` type numbers of the scalar types (descriptor.proto's ``Type`` enum).
_TYPE_NUMBERS = {"double": 1, "float": 2, "int64": 3, "uint64": 4, "int32": 5, "fixed64": 6, "fixed32": 7,
                 "bool": 8, "string": 9, "bytes": 12, "uint32": 13, "sfixed32": 15, "sfixed64": 16,
                 "sint32": 17, "sint64": 18}
_TYPE_NAMES = {v: k for k, v in _TYPE_NUMBERS.items()}
_LABEL_REPEATED = 3


def read_proto(text: str) -> ProtoMessage:
    """A writer's schema as the registry gives it: ``.proto`` text, or a base64 ``FileDescriptorProto``."""
    stripped = text.strip()
    if stripped and not any(c.isspace() for c in stripped) and "{" not in stripped:
        try:
            raw = base64.b64decode(stripped, validate=True)
        except (binascii.Error, ValueError):
            raw = None
        if raw:
            return _from_descriptor(raw)
    return first_message(text)


def _from_descriptor(raw: bytes) -> ProtoMessage:
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        file = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except DecodeError as exc:
        msg = f"the schema is neither .proto text nor a FileDescriptorProto: {exc}"
        raise SchemaChangeError(msg) from None
    if file.syntax != "proto3" or not file.message_type:
        msg = (f"the FileDescriptorProto {file.name!r} is {file.syntax or 'proto2'} with "
               f"{len(file.message_type)} messages: only a proto3 file's first message is decoded")
        raise SchemaChangeError(msg)
    message = file.message_type[0]
    fields = []
    for f in message.field:
        kind = _TYPE_NAMES.get(f.type)
        real_oneof = f.HasField("oneof_index") and not f.proto3_optional
        if kind is None or f.label == _LABEL_REPEATED or real_oneof or kind in ("uint64", "fixed64"):
            msg = (f"message {message.name}, field {f.name!r}: not a scalar column (repeated, a oneof, a "
                   "message, an enum, a uint64 or a fixed64)")
            raise SchemaChangeError(msg)
        fields.append(ProtoField(f.name, f.number, kind, f.proto3_optional))
    return ProtoMessage(file.package, message.name, tuple(fields))


def descriptor(message: ProtoMessage) -> bytes:
    """A serialized proto3 ``FileDescriptorProto`` holding ``message`` alone (what a worker builds from)."""
    from google.protobuf import descriptor_pb2

    file = descriptor_pb2.FileDescriptorProto(name=f"{message.full_name}.proto", package=message.package,
                                              syntax="proto3")
    out = file.message_type.add(name=message.name)
    for f in message.fields:
        # json_name given: protobuf refuses two fields whose default JSON names meet (``a`` and ``a_``),
        # which the decoder never uses
        field = out.field.add(name=f.name, number=f.number, type=_TYPE_NUMBERS[f.type], label=1,
                              json_name=f.name)
        if f.optional:  # proto3 optional: explicit presence through a synthetic oneof
            field.proto3_optional = True
            field.oneof_index = len(out.oneof_decl)
            out.oneof_decl.add(name=f"_{f.name}")
    return bytes(file.SerializeToString())


def message_class(message: ProtoMessage) -> Any:
    """A ``protobuf`` message class parsing ``message``'s bytes (in a pool of its own)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    try:
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(descriptor(message)))
    except TypeError as exc:  # what the pool refuses (the parser lets few such files through)
        msg = f"message {message.full_name}: the protobuf package refuses it: {exc}"
        raise SchemaChangeError(msg) from None
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(message.full_name))


class _Decoder:
    """The UDF's function: ``(schema id, value) -> the reader's row or None``; pickled to the workers.

    Holds plain data (messages, resolutions); each writer's message class and its row plan (per reader
    column: the writer field it reads and how it is promoted, or the default it takes) are built on first
    use in each worker.
    """

    def __init__(self, writers: Mapping[int, ProtoMessage], reader: Record) -> None:
        self.writers = dict(writers)
        self.reader = reader
        self.resolutions = {sid: resolve(reader, m.record()) for sid, m in self.writers.items()}
        self._readers: dict[int, Callable[[bytes], tuple[Any, ...]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"writers": self.writers, "reader": self.reader, "resolutions": self.resolutions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._readers = {}

    def __call__(self, sid: int | None, value: bytes | None) -> tuple[Any, ...] | None:
        if sid is None or value is None or sid not in self.writers:
            return None
        try:
            if len(value) > 5 and value[5] == 0:  # [0], the first message: what nearly every record says
                at = 1
            else:
                indexes, at = split_indexes(memoryview(value)[5:])
                if indexes != (0,):
                    return None
            return self._reader(sid)(value[5 + at:])
        except Exception:  # noqa: BLE001 - any record that does not read is undecodable, not a crash
            return None

    def _reader(self, sid: int) -> Callable[[bytes], tuple[Any, ...]]:
        known = self._readers.get(sid)
        if known is not None:
            return known
        message = self.writers[sid]
        cls = message_class(message)
        resolution = self.resolutions[sid]
        writer = {f.name: f for f in message.fields}
        steps: list[tuple[str | None, bool, Callable[[Any], Any] | None, Any]] = []
        for f in self.reader.fields:
            name = resolution.read.get(f.name)
            if name is None:
                steps.append((None, False, None, _column_value(resolution.filled[f.name], f.type)))
            else:
                w = writer[name]
                steps.append((name, w.optional, _PROMOTE.get((TYPES[w.type], f.type)), None))

        def read(body: bytes) -> tuple[Any, ...]:
            parsed = cls.FromString(body)
            row = []
            for name, optional, promote, default in steps:
                if name is None:
                    row.append(default)
                elif optional and not parsed.HasField(name):
                    row.append(None)
                else:
                    got = getattr(parsed, name)
                    row.append(got if promote is None else promote(got))
            return tuple(row)

        self._readers[sid] = read
        return read


#: How a writer's value is read as a reader column of a wider type (the Avro promotions), by (writer's
#: column type, reader's); a pair not here is read as it is.
_PROMOTE: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("int", "float"): float, ("int", "double"): float, ("long", "float"): float, ("long", "double"): float,
    ("string", "bytes"): lambda v: v.encode(), ("bytes", "string"): lambda v: v.decode(),
}


def _column_value(value: Any, kind: str) -> Any:
    """A default as its column holds it: Avro writes a ``bytes`` default as a string of code points."""
    if kind == "bytes" and isinstance(value, str):
        return value.encode("latin-1")
    return value


def decode_protobuf(df: DataFrame, writers: Mapping[int, str], reader: Record,
                    column: str = "value") -> DataFrame:
    """``df`` with :data:`SCHEMA_ID` and :data:`DECODED` (a struct of ``reader``'s fields) added.

    ``writers``: the ``.proto`` text of each writer id the registry knows. Every writer must resolve onto
    ``reader`` (the policy's check, :mod:`.stage`, comes first); SchemaChangeError otherwise.
    """
    from pyspark.sql import functions as F  # noqa: N812

    ids = schema_id(F.col(column), writers)
    known = {sid: read_proto(text) for sid, text in writers.items()}
    for message in known.values():  # a class the workers could not build fails here, not every record
        message_class(message)
    decode = F.udf(_Decoder(known, reader), spark_struct(reader), useArrow=True)
    decoded = F.when(ids.isin(sorted(known)), decode(ids, F.col(column))) if known else F.lit(None).cast(
        spark_struct(reader))
    return df.withColumn(SCHEMA_ID, ids).withColumn(DECODED, decoded)
