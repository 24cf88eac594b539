"""The Confluent wire format's 5-byte header: magic byte 0, then the schema id (4 bytes, big-endian)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.schema_registry.wire import HEADER_SIZE, split_header, with_header
from source_backfill.errors import SchemaRegistryError, WireFormatError


def test_the_id_is_big_endian_after_the_magic_byte():
    schema_id, body = split_header(b"\x00\x00\x00\x01\x02avro-body")
    assert schema_id == 258
    assert bytes(body) == b"avro-body"


def test_an_empty_body_is_still_a_record():
    schema_id, body = split_header(b"\x00\x00\x00\x00\x07")
    assert (schema_id, bytes(body)) == (7, b"")


def test_the_body_is_a_view_not_a_copy():
    value = bytearray(b"\x00\x00\x00\x00\x01abc")
    _, body = split_header(value)
    value[-1:] = b"z"
    assert bytes(body) == b"abz"


@pytest.mark.parametrize(("value", "says"), [
    (None, "tombstone"),
    (b"", "0 bytes are too short"),
    (b"\x00\x00\x00\x01", "4 bytes are too short"),
    (b"\x01\x00\x00\x00\x01body", "magic byte 0x01"),
    (b"\xff\x00\x00\x00\x01body", "magic byte 0xff"),
    (b'{"json": "text"}', "magic byte 0x7b"),
])
def test_values_without_the_header_are_refused_saying_why(value, says):
    with pytest.raises(WireFormatError, match=says) as refused:
        split_header(value)
    assert isinstance(refused.value, SchemaRegistryError)


@given(st.integers(0, 2**32 - 1), st.binary(max_size=64))
def test_with_header_and_split_header_are_inverse(schema_id, body):
    value = with_header(schema_id, body)
    assert len(value) == HEADER_SIZE + len(body)
    assert split_header(value) == (schema_id, memoryview(body))


@pytest.mark.parametrize("schema_id", [-1, 2**32])
def test_an_id_outside_four_unsigned_bytes_is_refused(schema_id):
    with pytest.raises(WireFormatError, match="does not fit"):
        with_header(schema_id, b"")
