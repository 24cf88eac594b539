"""Confluent-framed Protobuf records decoded in Spark (``decode_protobuf.py``): three writer versions land
in one evolved reader's columns as the rules say, and what cannot be decoded (another magic byte, an
unknown id, another message of the file, a truncated message, a string that is not UTF-8) is told apart,
never guessed at or dropped."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from connectors.schema_registry.decode import DECODED, SCHEMA_ID, columns, undecodable
from connectors.schema_registry.decode_protobuf import decode_protobuf, message_class, read_proto
from source_backfill.core.proto_schema import parse_proto, zigzag_indexes
from source_backfill.core.schema_evolution import evolve

pytestmark = pytest.mark.integration

#: v2 adds an optional note (absent: null); v3 widens qty to int64, drops sku, adds a channel (absent: "")
TEXTS = {
    11: 'syntax = "proto3";\npackage shop;\nmessage Order { int64 id = 1; int32 qty = 2; string sku = 3; }\n',
    12: 'syntax = "proto3";\npackage shop;\nmessage Order { int64 id = 1; int32 qty = 2; string sku = 3;\n'
        '  optional string note = 4; }\nmessage Other { bytes x = 1; }\n',
    13: 'syntax = "proto3";\npackage shop;\nmessage Order { int64 id = 1; int64 qty = 2;\n'
        '  optional string note = 4; string channel = 5; }\n',
}


def _framed(sid: int, body: bytes, indexes: tuple[int, ...] = (0,)) -> bytes:
    return b"\x00" + struct.pack(">I", sid) + zigzag_indexes(indexes) + body


def test_three_writer_versions_land_in_one_evolved_reader_and_the_undecodable_are_told_apart(spark):
    versions = {sid: parse_proto(text) for sid, text in TEXTS.items()}
    reader = evolve(evolve(versions[11], versions[12]).reader, versions[13]).reader
    assert [(f.name, f.type) for f in reader.fields] == [
        ("id", "long"), ("qty", "long"), ("sku", "string"), ("note", "string"), ("channel", "string")]
    classes = {sid: message_class(read_proto(text)) for sid, text in TEXTS.items()}
    rows, want = [], {}
    for i in range(90):
        sid = 11 + i % 3
        rec: dict[str, Any] = {"id": i, "qty": i % 7 if sid < 13 else 2**40 + i}
        if sid < 13:
            rec["sku"] = f"sku-{i}"
        if sid > 11 and i % 2:
            rec["note"] = f"note {i}"
        if sid == 13 and i % 3:
            rec["channel"] = "app"
        rows.append((i, _framed(sid, classes[sid](**rec).SerializeToString())))
        # sku, dropped by v3, keeps its default: proto3's zero
        want[i] = {"id": i, "qty": rec["qty"], "sku": rec.get("sku", ""),
                   "note": rec.get("note"), "channel": rec.get("channel", "" if sid == 13 else None)}
    good = classes[11](id=1, qty=2, sku="x").SerializeToString()
    bad = {1000: b"\x01" + rows[0][1][1:],  # another magic byte
           1001: _framed(99, good),  # an id the registry does not know
           1002: _framed(11, good[:-1]),  # the message cut short
           1003: _framed(11, b"\x1a\x02\xff\xfe"),  # sku is not UTF-8
           1004: _framed(12, good, indexes=(1,)),  # the file's second message
           1005: b"\x00" + struct.pack(">I", 11),  # no message indexes
           1006: b"\x00\x00"}  # shorter than the header
    rows += list(bad.items())
    rows.append((1007, None))  # a tombstone: no record to decode
    df = spark.createDataFrame(rows, "offset long, value binary")
    out = decode_protobuf(df, TEXTS, reader)
    got = {r["offset"]: r for r in out.collect()}
    for i, row in want.items():
        assert got[i][DECODED].asDict() == row, (i, got[i][DECODED], row)
        assert got[i][SCHEMA_ID] == 11 + i % 3
    assert {r["offset"] for r in out.where(undecodable(out)).collect()} == set(bad)
    flat = columns(out.where(~undecodable(out)), reader)
    assert flat.columns == ["offset", "id", "qty", "sku", "note", "channel"]
    assert flat.count() == 91  # 90 records and the tombstone
