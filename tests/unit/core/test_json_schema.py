"""JSON Schema documents read as records of columns (core/json_schema.py): the rules of Avro apply to them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.core.json_schema import parse_json_schema, to_json_schema
from source_backfill.core.schema_evolution import Field, Record, evolve, resolve
from source_backfill.errors import SchemaChangeError
from tests.budget import examples

KINDS = ("string", "long", "double", "boolean")
VALUES = {"string": st.text(max_size=6), "long": st.integers(-(2**40), 2**40),
          "double": st.floats(allow_nan=False, allow_infinity=False), "boolean": st.booleans()}


@st.composite
def records(draw: st.DrawFn) -> Record:
    names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), max_size=6, unique=True))
    out = []
    for name in names:
        kind, nullable = draw(st.sampled_from(KINDS)), draw(st.booleans())
        if nullable:  # an optional property absent is null: a nullable field always has a default
            out.append(Field(name, kind, True, draw(st.one_of(st.none(), VALUES[kind]))))
        elif draw(st.booleans()):
            out.append(Field(name, kind, False, draw(VALUES[kind])))
        else:
            out.append(Field(name, kind))
    return Record(draw(st.from_regex(r"[A-Z][a-z]{0,6}", fullmatch=True)), tuple(out))


@settings(max_examples=examples(300))
@given(records())
def test_a_record_written_as_json_schema_reads_back_as_itself(record):
    doc = to_json_schema(record)
    assert parse_json_schema(doc) == record
    assert parse_json_schema(json.dumps(doc)) == record  # as the registry's text


def test_each_spelling_of_optional_and_each_scalar_type():
    doc = {"type": "object", "title": "Order", "required": ["id", "total", "note"], "properties": {
        "id": {"type": "integer", "minimum": 0},
        "total": {"type": "number", "description": "ignored: it constrains values only"},
        "note": {"oneOf": [{"type": "null"}, {"type": "string"}]},
        "paid": {"type": "boolean"},
        "code": {"anyOf": [{"type": "string", "format": "uuid"}, {"type": "null"}], "default": None},
        "qty": {"type": ["integer", "null"], "default": 1},
    }}
    assert parse_json_schema(doc) == Record("Order", (
        Field("id", "long"), Field("total", "double"), Field("note", "string", True, None),
        Field("paid", "boolean", True, None), Field("code", "string", True, None),
        Field("qty", "long", True, 1)))


@pytest.mark.parametrize(("doc", "says"), [
    ({"type": "array"}, "only object schemas"),
    ({"type": "object", "properties": {"a": {"type": "object"}}}, 'property "a": type object'),
    ({"type": "object", "properties": {"a": {"type": "array"}}}, 'property "a": type array'),
    ({"type": "object", "properties": {"a": {"$ref": "#/definitions/x"}}}, 'property "a": $ref'),
    ({"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}, "type string or integer"),
    ({"type": "object", "properties": {"a": {"type": "null"}}}, "type null only"),
    ({"type": "object", "properties": {"a": True}}, 'property "a": a schema of true says no type'),
    ({"type": "object", "required": "a", "properties": {}}, "required is not a list"),
    ("{not json", "not JSON"),
])
def test_what_a_column_cannot_hold_is_refused_naming_the_property(doc: Any, says: str):
    with pytest.raises(SchemaChangeError, match=None) as info:
        parse_json_schema(doc)
    assert says in str(info.value)


def test_the_avro_rules_apply_a_number_widened_and_an_optional_property_added():
    v1 = parse_json_schema({"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}})
    v2 = parse_json_schema({"type": "object", "required": ["id"], "properties": {
        "id": {"type": "number"}, "note": {"type": "string"}}})
    grown = evolve(v1, v2).reader
    assert grown.get("id") == Field("id", "double")
    assert grown.get("note") == Field("note", "string", True, None)
    resolve(v2, v1)  # pin on v2: v1's records read (integer promoted, note absent: null)
    with pytest.raises(SchemaChangeError):
        resolve(v1, v2)  # pin on v1: a number is not read as an integer
