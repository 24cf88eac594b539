"""``.proto`` files read as records of columns (core/proto_schema.py): proto3's scalar fields only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.core.proto_schema import (
    TYPES,
    ProtoField,
    ProtoMessage,
    first_message,
    parse_proto,
    render_proto,
    split_indexes,
    zigzag_indexes,
)
from source_backfill.core.schema_evolution import Field, evolve, resolve
from source_backfill.errors import SchemaChangeError
from tests.budget import examples

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(
    lambda n: n not in {"optional", "repeated", "required", "map", "oneof", "message", "enum", "option",
                        "reserved", "extensions", "extend"})


@st.composite
def messages(draw: st.DrawFn) -> ProtoMessage:
    names = draw(st.lists(NAMES, max_size=8, unique=True))
    numbers = draw(st.lists(st.integers(1, 18999), min_size=len(names), max_size=len(names), unique=True))
    fields = tuple(ProtoField(n, k, draw(st.sampled_from(sorted(TYPES))), draw(st.booleans()))
                   for n, k in zip(names, numbers, strict=True))
    package = draw(st.sampled_from(["", "shop", "com.example.v1"]))
    return ProtoMessage(package, draw(st.from_regex(r"[A-Z][A-Za-z0-9]{0,6}", fullmatch=True)), fields)


@settings(max_examples=examples(300))
@given(messages())
def test_a_message_rendered_as_proto3_reads_back_as_itself(message):
    assert first_message(render_proto(message)) == message
    record = parse_proto(render_proto(message))
    assert record.name == message.full_name
    assert [f.name for f in record.fields] == [f.name for f in message.fields]


def test_types_presence_and_defaults_follow_proto3():
    record = parse_proto('''
        // a comment, and /* one */ more
        syntax = "proto3";
        package shop.v1;
        import "google/protobuf/timestamp.proto";
        option java_package = "com.shop";
        message Order {
          int64 id = 1;
          optional string note = 2 [deprecated = true, json_name = "n"];
          reserved 3, 15 to 20;
          reserved "gone";
          uint32 qty = 4;
          sint32 delta = 5;
          float ratio = 6;
          bool paid = 7;
          bytes blob = 8;
          message Unused { repeated int32 x = 1; }
          enum Kind { A = 0; B = 1; }
          option (custom.opt) = { a: 1 };
        }
        message Second { string x = 1; }
        service S { rpc Get (Order) returns (Order); }
    ''')
    assert record.name == "shop.v1.Order"
    assert record.fields == (
        Field("id", "long", False, 0), Field("note", "string", True, None), Field("qty", "long", False, 0),
        Field("delta", "int", False, 0), Field("ratio", "float", False, 0.0),
        Field("paid", "boolean", False, False), Field("blob", "bytes", False, ""))


@pytest.mark.parametrize(("text", "needle"), [
    ('syntax = "proto2"; message M { required int32 a = 1; }', "only proto3"),
    ("message M { int32 a = 1; }", "names no syntax"),
    ('edition = "2023"; message M { int32 a = 1; }', "only proto3"),
    ('syntax = "proto3"; message M { repeated int32 a = 1; }', "repeated"),
    ('syntax = "proto3"; message M { map<string, int32> a = 1; }', "a map"),
    ('syntax = "proto3"; message M { oneof k { int32 a = 1; } }', "a oneof"),
    ('syntax = "proto3"; message M { Other a = 1; } message Other { int32 b = 1; }', "field 'a'"),
    ('syntax = "proto3"; message M { uint64 a = 1; }', "signed 64-bit"),
    ('syntax = "proto3"; message M { fixed64 a = 1; }', "signed 64-bit"),
    ('syntax = "proto3"; message M { int32 a = 0; }', "not a field number"),
    ('syntax = "proto3"; message M { int32 a = 19500; }', "not a field number"),
    ('syntax = "proto3"; message M { int32 a = 536870912; }', "not a field number"),
    ('syntax = "proto3"; message M { int32 a = 1; string a = 2; }', "twice"),
    ('syntax = "proto3"; message M { int32 a = 1; string b = 1; }', "twice"),
    ('syntax = "proto3"; message M { int32 a = 1 }', "';' ends the field"),
    ('syntax = "proto3"; message M { int32 a = 1;', "ends inside"),
    ('syntax = "proto3"; enum E { A = 0; }', "declares no message"),
    ('syntax = "proto3"; message M { int32 a = 1; } $', "not a token"),
    ('syntax = "proto3"; garbage;', "where a declaration starts"),
    ("", "declares no message"),
])
def test_what_a_column_cannot_hold_is_refused_naming_it(text, needle):
    with pytest.raises(SchemaChangeError, match=needle):
        parse_proto(text)


@settings(max_examples=examples(200))
@given(st.lists(st.integers(0, 2**31), min_size=1, max_size=4), st.binary(max_size=8))
def test_message_indexes_read_back_and_the_message_starts_after_them(indexes, message):
    encoded = zigzag_indexes(tuple(indexes))
    assert split_indexes(encoded + message) == (tuple(indexes), len(encoded))


def test_the_first_message_is_one_zero_byte_and_a_cut_index_list_is_refused():
    assert zigzag_indexes((0,)) == b"\x00"
    assert split_indexes(b"\x00\x08\x01") == ((0,), 1)
    for cut in (b"", b"\x04", b"\x04\x02", b"\x80", b"\x7f"):
        with pytest.raises(ValueError, match="message ind"):
            split_indexes(cut)


def test_proto3_evolution_by_the_avro_rules():
    v1 = parse_proto('syntax = "proto3"; message M { int32 a = 1; }')
    v2 = parse_proto('syntax = "proto3"; message M { int64 a = 1; optional string b = 2; int32 c = 3; }')
    grown = evolve(v1, v2)
    assert grown.added == ("b", "c") and grown.widened == {"a": ("int", "long")}
    # pin: a reader field the writer lacks takes its zero; a widened writer does not read as the narrower
    assert resolve(v2, v1).filled == {"b": None, "c": 0}
    with pytest.raises(SchemaChangeError, match="not a promotion"):
        resolve(v1, v2)
