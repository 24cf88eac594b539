"""The schema rules (``core/schema_evolution.py``) against Avro itself: fastavro writes a record with the
writer schema and reads it with the reader schema (the Avro spec's resolution), record by record.

* ``pin``: :func:`resolve` accepts a (reader, writer) pair only if fastavro reads every record of the
  writer as the reader, and its projection is fastavro's row; a pair it refuses, fastavro fails on (for a
  nullable writer field read as a non-null one: on a record holding null there).
* ``evolve``: the evolved schema reads the new writer's records and the old reader's (every row already
  in the table stays valid), as fastavro does; it refuses only a field whose types promote neither way.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import fastavro
import pytest
from fastavro.read import SchemaResolutionError
from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.core.schema_evolution import (
    Field,
    Record,
    check_same,
    evolve,
    parse,
    promotes,
    resolve,
)
from source_backfill.errors import SchemaChangeError
from tests.budget import examples

NAMES = ("a", "b", "c", "d", "e")
TYPES = ("boolean", "int", "long", "float", "double", "bytes", "string")


def _value(kind: str) -> st.SearchStrategy[Any]:
    """Values of an Avro type that survive its encoding exactly (float: what float32 holds)."""
    return {
        "boolean": st.booleans(),
        "int": st.integers(-(2**31), 2**31 - 1),
        "long": st.integers(-(2**63), 2**63 - 1),
        "float": st.integers(-(2**20), 2**20).map(lambda n: n / 4),
        "double": st.floats(allow_nan=False, allow_infinity=False, width=64),
        "bytes": st.binary(max_size=8),
        "string": st.text(max_size=8),
    }[kind]


def _json_default(kind: str, value: Any) -> Any:
    """A default as Avro's JSON holds it (bytes: a string of code points 0-255)."""
    return value.decode("latin-1") if kind == "bytes" else value


@st.composite
def fields(draw: st.DrawFn, name: str) -> Field:
    kind = draw(st.sampled_from(TYPES))
    nullable = draw(st.booleans())
    choice = draw(st.sampled_from(["none", "null", "value"] if nullable else ["none", "value"]))
    if choice == "none":
        return Field(name, kind, nullable)
    if choice == "null":
        return Field(name, kind, nullable, None)
    return Field(name, kind, nullable, _json_default(kind, draw(_value(kind))))


@st.composite
def records(draw: st.DrawFn) -> Record:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=len(NAMES)))
    return Record("r", tuple(draw(fields(n)) for n in names))


@st.composite
def datum(draw: st.DrawFn, schema: Record) -> dict[str, Any]:
    return {f.name: None if f.nullable and draw(st.booleans()) else draw(_value(f.type))
            for f in schema.fields}


def _through_avro(record: dict[str, Any], writer: Record, reader: Record) -> dict[str, Any]:
    """``record`` written with ``writer`` and read with ``reader`` by fastavro (SchemaResolutionError, or
    another fastavro error, when it cannot)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(writer.avro()), record)
    buf.seek(0)
    return dict(fastavro.schemaless_reader(buf, fastavro.parse_schema(writer.avro()),
                                           fastavro.parse_schema(reader.avro())))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Rows equal, floats compared as float32 where Avro stores them so."""
    def norm(v: Any) -> Any:
        return struct.unpack("f", struct.pack("f", v))[0] if isinstance(v, float) and abs(v) < 3e38 else v
    return a.keys() == b.keys() and all(a[k] == b[k] or norm(a[k]) == norm(b[k]) for k in a)


@given(st.data(), records(), records())
@settings(max_examples=examples(400))
def test_pin_accepts_exactly_what_avro_reads_and_projects_as_avro_does(data, reader, writer):
    try:
        resolution = resolve(reader, writer)
    except SchemaChangeError as exc:
        # Avro resolves a union per datum: a refused field fails on a null there if the reader's may not
        # be null, on a value if the types do not promote (a null would pass, both unions having null)
        record = data.draw(datum(writer))
        name = str(exc).split("'")[1]
        w = writer.get(name)
        if w is not None:
            record[name] = None if "may be null" in str(exc) else data.draw(_value(w.type))
        with pytest.raises((SchemaResolutionError, ValueError, TypeError, KeyError)):
            _through_avro(record, writer, reader)
        return
    for _ in range(3):
        record = data.draw(datum(writer))
        try:
            ours = resolution.project(record)
        except UnicodeDecodeError:  # bytes read as a string that are not UTF-8: the record's own error
            with pytest.raises(UnicodeDecodeError):
                _through_avro(record, writer, reader)
            continue
        assert _same(ours, _through_avro(record, writer, reader))


@given(st.data(), records(), records())
@settings(max_examples=examples(400))
def test_evolve_reads_the_new_writer_and_every_row_written_before(data, reader, writer):
    common = [(r, writer.get(r.name)) for r in reader.fields if writer.get(r.name) is not None]
    clash = [r.name for r, w in common if not promotes(r.type, w.type) and not promotes(w.type, r.type)]
    if clash:
        with pytest.raises(SchemaChangeError, match=repr(clash[0])):
            evolve(reader, writer)
        return
    evolution = evolve(reader, writer)
    grown = evolution.reader
    assert [f.name for f in grown.fields[: len(reader.fields)]] == [f.name for f in reader.fields]
    assert set(evolution.added) == {f.name for f in writer.fields} - {f.name for f in reader.fields}
    for old in (reader, writer):  # rows already in the table, and the new writer's records
        resolution = resolve(grown, old)
        record = data.draw(datum(old))
        try:
            ours = resolution.project(record)
        except UnicodeDecodeError:
            with pytest.raises(UnicodeDecodeError):
                _through_avro(record, old, grown)
            continue
        assert _same(ours, _through_avro(record, old, grown))


def test_a_field_added_with_a_default_appears_nullable_and_old_rows_read_as_null():
    v1 = parse({"type": "record", "name": "Order", "namespace": "shop",
                "fields": [{"name": "id", "type": "long"}, {"name": "qty", "type": "int"}]})
    v2 = parse({"type": "record", "name": "Order", "namespace": "shop",
                "fields": [{"name": "id", "type": "long"}, {"name": "qty", "type": "long"},
                           {"name": "note", "type": "string", "default": ""}]})
    e = evolve(v1, v2)
    assert e.added == ("note",) and e.widened == {"qty": ("int", "long")} and not e.dropped
    assert e.reader.get("note") == Field("note", "string", True, None)
    assert resolve(e.reader, v1).project({"id": 1, "qty": 2}) == {"id": 1, "qty": 2, "note": None}
    with pytest.raises(SchemaChangeError, match="'qty': written as long, read as int"):
        resolve(v1, v2)  # pin: a long is not read as an int
    v3 = Record("shop.Order", (*v1.fields, Field("note", "string", False, "")))
    assert resolve(v1, v3).skipped == ("note",)  # pin: a new field is not a column


def test_pin_refuses_a_reader_field_without_default_the_writer_lacks_naming_it():
    reader = Record("r", (Field("id", "long"), Field("qty", "int")))
    with pytest.raises(SchemaChangeError, match="'qty'.*no default"):
        resolve(reader, Record("r", (Field("id", "long"),)))


def test_evolve_refuses_a_type_changed_other_than_by_widening_naming_field_and_types():
    with pytest.raises(SchemaChangeError, match="'qty': int in the table, string in the new writer"):
        evolve(Record("r", (Field("qty", "int"),)), Record("r", (Field("qty", "string"),)))


def test_fail_refuses_any_difference_and_says_which():
    v1 = Record("r", (Field("id", "long"), Field("qty", "int")))
    check_same(v1, Record("r", (Field("qty", "int"), Field("id", "long"))))  # order alone: the same
    with pytest.raises(SchemaChangeError, match=r"only in the writer's: \['note'\]; changed: \['qty'\]"):
        check_same(v1, Record("r", (Field("id", "long"), Field("qty", "long"), Field("note", "string"))))


@pytest.mark.parametrize("schema", [
    {"type": "record", "name": "r", "fields": [{"name": "x", "type": {"type": "array", "items": "int"}}]},
    {"type": "record", "name": "r", "fields": [{"name": "x", "type": ["null", "int", "string"]}]},
    {"type": "record", "name": "r",
     "fields": [{"name": "x", "type": {"type": "int", "logicalType": "date"}}]},
    {"type": "enum", "name": "e", "symbols": ["A"]},
])
def test_what_is_not_decoded_yet_is_refused_naming_the_field(schema):
    with pytest.raises(SchemaChangeError, match="'x'|record schemas"):
        parse(schema)
