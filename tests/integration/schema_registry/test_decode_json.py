"""Confluent-framed JSON records (JSON Schema by id) decoded in Spark (``decode_json.py``): three writer
versions land in one evolved reader's columns as the rules say, and what cannot be decoded (another magic
byte, an unknown id, text that is not a JSON object, a value of another type, a required field absent) is
told apart, never guessed at or dropped."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from connectors.schema_registry.decode import DECODED, SCHEMA_ID, columns, undecodable
from connectors.schema_registry.decode_json import decode_json
from source_backfill.core.json_schema import parse_json_schema
from source_backfill.core.schema_evolution import evolve

pytestmark = pytest.mark.integration

V1 = parse_json_schema({"type": "object", "title": "Order", "required": ["id", "qty", "sku"], "properties": {
    "id": {"type": "integer"}, "qty": {"type": "integer"}, "sku": {"type": "string"}}})
V2 = parse_json_schema({"type": "object", "title": "Order", "required": ["id", "qty", "sku"], "properties": {
    "id": {"type": "integer"}, "qty": {"type": "integer"}, "sku": {"type": "string"},
    "note": {"type": ["string", "null"]}, "paid": {"type": "boolean", "default": False}}})
V3 = parse_json_schema({"type": "object", "title": "Order", "required": ["id", "qty"], "properties": {
    "id": {"type": "integer"}, "qty": {"type": "number"}, "note": {"type": "string"},
    "paid": {"type": "boolean", "default": False}}})


def _framed(sid: int, record: Any) -> bytes:
    return b"\x00" + struct.pack(">I", sid) + json.dumps(record).encode()


def test_three_writer_versions_land_in_one_evolved_reader_and_the_undecodable_are_told_apart(spark):
    reader = evolve(evolve(V1, V2).reader, V3).reader
    assert [(f.name, f.type) for f in reader.fields] == [
        ("id", "long"), ("qty", "double"), ("sku", "string"), ("note", "string"), ("paid", "boolean")]
    rows, want = [], {}
    for i in range(90):
        sid = 11 + i % 3
        rec: dict[str, Any] = {"id": i, "qty": i % 7 if sid < 13 else i / 4}
        if sid < 13:
            rec["sku"] = f"sku-{i}"
        if sid > 11 and i % 2:
            rec["note"] = f"note {i}"
        if sid > 11 and i % 5 == 0:
            rec["paid"] = True
        if sid == 12:
            rec["extra"] = {"a": [1, 2]}  # a property the reader lacks: skipped
        rows.append((i, _framed(sid, rec)))
        want[i] = {"id": i, "qty": float(rec["qty"]), "sku": rec.get("sku"), "note": rec.get("note"),
                   "paid": rec.get("paid", False) if sid > 11 else None}  # v1 has no paid: the reader's null
    bad = {1000: b"\x01" + rows[0][1][1:],  # another magic byte
           1001: _framed(99, {"id": 1, "qty": 1}),  # an id the registry does not know
           1002: b"\x00" + struct.pack(">I", 11) + b'{"id": 1, "qty": ',  # the body cut short
           1003: _framed(11, {"id": "7", "qty": 1, "sku": "x"}),  # a string where the column is a long
           1004: _framed(11, {"id": 1.5, "qty": 1, "sku": "x"}),  # a fraction where it is a long
           1005: _framed(12, {"qty": 1, "sku": "x"}),  # the required id absent
           1006: _framed(12, [1, 2]),  # not an object
           1007: b"\x00\x00"}  # shorter than the header
    rows += list(bad.items())
    rows.append((1008, None))  # a tombstone: no record to decode
    df = spark.createDataFrame(rows, "offset long, value binary")
    out = decode_json(df, {11: V1, 12: V2, 13: V3}, reader)
    got = {r["offset"]: r for r in out.collect()}
    for i, row in want.items():
        assert got[i][DECODED].asDict() == row, (i, got[i][DECODED], row)
        assert got[i][SCHEMA_ID] == 11 + i % 3
    assert {r["offset"] for r in out.where(undecodable(out)).collect()} == set(bad)
    assert got[1000][SCHEMA_ID] is None and got[1001][SCHEMA_ID] == 99
    flat = columns(out.where(~undecodable(out)), reader)
    assert flat.columns == ["offset", "id", "qty", "sku", "note", "paid"]
    assert flat.count() == 91  # 90 records and the tombstone
