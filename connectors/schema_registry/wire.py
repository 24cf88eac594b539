"""The Confluent wire format's header: magic byte 0, then the schema id as a 4-byte big-endian integer.

Every Avro, Protobuf or JSON Schema record a Confluent serializer writes starts with those 5 bytes; the
body after them is read with the writer schema the registry holds under that id.
"""

from __future__ import annotations

import struct

from source_backfill.errors import WireFormatError

MAGIC = 0
HEADER_SIZE = 5
_HEADER = struct.Struct(">bI")


def split_header(value: bytes | bytearray | memoryview | None) -> tuple[int, memoryview]:
    """``(schema id, body)`` of a record's value (or key); :class:`WireFormatError` if it has no header.

    The body is a view of ``value``, not a copy. A null value, one shorter than the header, or one whose
    first byte is not the magic byte 0 is refused, naming what it found.
    """
    if value is None:
        msg = "a null value has no schema id (it is a tombstone, not a record in the wire format)"
        raise WireFormatError(msg)
    view = memoryview(value)
    if len(view) < HEADER_SIZE:
        msg = f"{len(view)} bytes are too short for the wire format's 5-byte header (magic byte + schema id)"
        raise WireFormatError(msg)
    magic, schema_id = _HEADER.unpack_from(view)
    if magic != MAGIC:
        msg = f"magic byte {magic & 0xFF:#04x} where the wire format has 0x00: not a schema-registry record"
        raise WireFormatError(msg)
    return schema_id, view[HEADER_SIZE:]


def with_header(schema_id: int, body: bytes) -> bytes:
    """``body`` behind the 5-byte header naming ``schema_id`` (what a Confluent serializer writes)."""
    if not 0 <= schema_id <= 0xFFFFFFFF:
        msg = f"schema id {schema_id} does not fit the header's 4 unsigned bytes"
        raise WireFormatError(msg)
    return _HEADER.pack(MAGIC, schema_id) + body
