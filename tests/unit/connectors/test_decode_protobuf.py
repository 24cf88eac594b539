"""Protobuf records decoded row by row (connectors/schema_registry/decode_protobuf.py), Spark aside.

Messages are built and written by the ``protobuf`` package itself (the reference), read back by the
decoder the Spark UDF runs.
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.schema_registry.decode_protobuf import _Decoder, descriptor, message_class, read_proto
from connectors.schema_registry.wire import with_header
from source_backfill.core.proto_schema import ProtoField, ProtoMessage, render_proto, zigzag_indexes
from source_backfill.errors import SchemaChangeError
from tests.budget import examples
from tests.unit.core.test_proto_schema import messages

VALUES: dict[str, st.SearchStrategy[Any]] = {
    "double": st.floats(allow_nan=False),
    "float": st.sampled_from([0.0, 1.5, -2.25, 2.0**100]),  # exact in 32 bits
    "bool": st.booleans(), "string": st.text(max_size=8), "bytes": st.binary(max_size=8),
    "int32": st.integers(-(2**31), 2**31 - 1), "sint32": st.integers(-(2**31), 2**31 - 1),
    "sfixed32": st.integers(-(2**31), 2**31 - 1), "int64": st.integers(-(2**63), 2**63 - 1),
    "sint64": st.integers(-(2**63), 2**63 - 1), "sfixed64": st.integers(-(2**63), 2**63 - 1),
    "uint32": st.integers(0, 2**32 - 1), "fixed32": st.integers(0, 2**32 - 1),
}
ZERO = {"double": 0.0, "float": 0.0, "bool": False, "string": "", "bytes": b""}


def framed(sid: int, body: bytes, indexes: tuple[int, ...] = (0,)) -> bytes:
    return with_header(sid, zigzag_indexes(indexes) + body)


@settings(max_examples=examples(200))
@given(st.data(), messages())
def test_every_record_reads_back_as_the_protobuf_package_wrote_it(data, message):
    given_values = {f.name: data.draw(VALUES[f.type]) for f in message.fields if data.draw(st.booleans())}
    body = message_class(message)(**given_values).SerializeToString()
    decoder = pickle.loads(pickle.dumps(_Decoder({7: message}, message.record())))  # as a worker has it
    expected = tuple(given_values.get(f.name, None if f.optional else ZERO.get(f.type, 0))
                     for f in message.fields)
    assert decoder(7, framed(7, body)) == expected


def test_each_record_is_read_by_its_own_writer_and_projected_onto_the_reader():
    v1 = ProtoMessage("shop", "Order", (ProtoField("id", 1, "int32"), ProtoField("note", 2, "string")))
    v2 = ProtoMessage("shop", "Order", (ProtoField("id", 1, "int64"), ProtoField("note", 2, "string"),
                                        ProtoField("qty", 3, "int32", optional=True)))
    reader = v2.record()
    decoder = _Decoder({1: v1, 2: v2}, reader)
    one = message_class(v1)(id=5, note="a").SerializeToString()
    two = message_class(v2)(id=2**40, qty=3).SerializeToString()
    assert decoder(1, framed(1, one)) == (5, "a", None)  # promoted; qty absent from v1: its default
    assert decoder(2, framed(2, two)) == (2**40, "", 3)  # note left out: proto3's zero


def test_records_that_do_not_read_are_none_not_errors():
    message = ProtoMessage("", "M", (ProtoField("s", 1, "string"), ProtoField("n", 2, "int64")))
    decoder = _Decoder({1: message}, message.record())
    good = message_class(message)(s="é", n=-3).SerializeToString()
    assert decoder(1, framed(1, good)) == ("é", -3)
    assert decoder(1, framed(1, good[:-1])) is None  # truncated varint
    assert decoder(1, framed(1, b"\x0a\x02\xff\xfe")) is None  # a string that is not UTF-8
    assert decoder(1, framed(1, good, indexes=(1,))) is None  # another message of the file
    assert decoder(1, framed(1, good, indexes=(0, 0))) is None  # a nested message
    assert decoder(1, with_header(1, b"")) is None  # no message indexes at all
    assert decoder(2, framed(2, good)) is None  # an id not given
    assert decoder(None, b"\x01") is None
    assert decoder(1, None) is None
    assert decoder(1, framed(1, b"")) == ("", 0)  # an empty message is every field at its zero


def test_a_bytes_field_read_as_a_string_column_must_be_utf8():
    writer = ProtoMessage("", "M", (ProtoField("b", 1, "bytes"),))
    reader = ProtoMessage("", "M", (ProtoField("b", 1, "string"),)).record()
    decoder = _Decoder({1: writer}, reader)
    cls = message_class(writer)
    assert decoder(1, framed(1, cls(b=b"ok").SerializeToString())) == ("ok",)
    assert decoder(1, framed(1, cls(b=b"\xff").SerializeToString())) is None


def test_a_registry_may_give_text_or_a_base64_file_descriptor():
    message = ProtoMessage("shop", "Order", (ProtoField("id", 1, "int64"),
                                             ProtoField("note", 4, "string", optional=True)))
    assert read_proto(render_proto(message)) == message
    assert read_proto(base64.b64encode(descriptor(message)).decode()) == message
    with pytest.raises(SchemaChangeError):
        read_proto(base64.b64encode(b"\xff\xff\xff").decode())


def test_a_file_descriptor_of_what_a_column_cannot_hold_is_refused():
    from google.protobuf import descriptor_pb2

    file = descriptor_pb2.FileDescriptorProto.FromString(descriptor(ProtoMessage("", "M", (
        ProtoField("a", 1, "int32"),))))
    file.message_type[0].field[0].label = 3  # repeated
    with pytest.raises(SchemaChangeError, match="not a scalar column"):
        read_proto(base64.b64encode(file.SerializeToString()).decode())
    file.syntax = "proto2"
    with pytest.raises(SchemaChangeError, match="proto2"):
        read_proto(base64.b64encode(file.SerializeToString()).decode())
