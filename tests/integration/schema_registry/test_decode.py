"""Confluent-framed Avro records decoded by their writer schema's id in Spark (``decode.py``), against
fastavro's Avro resolution record by record: three writer versions in one DataFrame land in one reader's
columns, and what cannot be decoded (another magic byte, an unknown id, a cut body) is told apart, never
guessed at or dropped."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import fastavro
import pytest

from connectors.schema_registry.decode import DECODED, SCHEMA_ID, columns, decode, undecodable
from source_backfill.core.schema_evolution import evolve, parse, resolve

pytestmark = pytest.mark.integration

V1 = parse({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "qty", "type": "int"}, {"name": "sku", "type": "string"}]})
V2 = parse({"type": "record", "name": "Order", "fields": [  # a field added with a default
    {"name": "id", "type": "long"}, {"name": "qty", "type": "int"}, {"name": "sku", "type": "string"},
    {"name": "note", "type": ["null", "string"], "default": None}]})
V3 = parse({"type": "record", "name": "Order", "fields": [  # qty widened, sku dropped
    {"name": "id", "type": "long"}, {"name": "qty", "type": "long"},
    {"name": "note", "type": ["null", "string"], "default": None}]})
WRITERS = {11: V1, 12: V2, 13: V3}


def _framed(sid: int, schema: Any, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", sid))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema.avro()), record)
    return buf.getvalue()


def _record(sid: int, i: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": i, "qty": i % 7}
    if sid in (11, 12):
        rec["sku"] = f"sku-{i}"
    if sid in (12, 13):
        rec["note"] = None if i % 2 else f"note {i}"
    return rec


def test_three_writer_versions_land_in_one_evolved_reader_as_avro_resolves_them(spark):
    reader = evolve(evolve(V1, V2).reader, V3).reader
    assert [f.name for f in reader.fields] == ["id", "qty", "sku", "note"]
    rows, want = [], {}
    for i in range(300):
        sid = 11 + i % 3
        rec = _record(sid, i)
        rows.append((i, _framed(sid, WRITERS[sid], rec)))
        want[i] = resolve(reader, WRITERS[sid]).project(rec)
    bad = {1000: b"\x01" + rows[0][1][1:],  # another magic byte
           1001: _framed(99, V1, _record(11, 1)),  # an id not given
           1002: rows[0][1][:7],  # the body cut short
           1003: b"\x00\x00"}  # shorter than the header
    rows += list(bad.items())
    rows.append((1004, None))  # a tombstone: no record to decode
    df = spark.createDataFrame(rows, "offset long, value binary")
    writers = {sid: json.dumps(s.avro()) for sid, s in WRITERS.items()}
    out = decode(df, writers, reader)
    got = {r["offset"]: r for r in out.collect()}
    for i, row in want.items():
        assert got[i][DECODED].asDict() == row, (i, got[i][DECODED], row)
        assert got[i][SCHEMA_ID] == 11 + i % 3
    failed = {r["offset"] for r in out.where(undecodable(out)).collect()}
    assert failed == set(bad)
    assert got[1000][SCHEMA_ID] is None and got[1001][SCHEMA_ID] == 99
    flat = columns(out.where(~undecodable(out)), reader)
    assert flat.columns == ["offset", "id", "qty", "sku", "note"]
    assert flat.count() == 301  # 300 records and the tombstone


def test_a_known_ids_header_match_gives_every_value_the_id_its_hex_digits_give(spark):
    """``schema_id(value, known)`` matches known ids on the 5-byte header (cheaper than ``conv``): for any
    value, known id or not, framed or not, it must give what the digits-only reading gives."""
    from pyspark.sql import functions as F

    from connectors.schema_registry.decode import schema_id

    values = [b"\x00" + sid.to_bytes(4, "big") + body for sid in (0, 1, 11, 12, 255, 256, 2**31, 2**32 - 1)
              for body in (b"", b"\x02x")]
    values += [b"\x01\x00\x00\x00\x0b", b"\x00\x00\x00\x0b", b"", b"\x00", b"\x00\x00\x00\x00\x0b\xff" * 3]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)] + [(len(values), None)],
                               "offset long, value binary")
    known = (11, 0, 2**32 - 1, 2**31, 12, -1, 2**32, 11)  # repeats, and ids no header can hold
    got = df.select("offset", schema_id(F.col("value")).alias("digits"),
                    schema_id(F.col("value"), known).alias("matched")).collect()
    assert all(r["digits"] == r["matched"] for r in got), [r for r in got if r["digits"] != r["matched"]]
    assert {r["matched"] for r in got} == {None, 0, 1, 11, 12, 255, 256, 2**31, 2**32 - 1}


def test_a_record_of_nulls_decodes_and_a_cut_body_of_the_same_schema_does_not(spark):
    """``from_avro`` gives a body it cannot read a struct of nulls: a record whose every field is null
    (all nullable) is told from it by its exact encoding."""

    nullable = parse({"type": "record", "name": "N", "fields": [
        {"name": "a", "type": ["null", "long"], "default": None},
        {"name": "b", "type": ["string", "null"], "default": "x"}]})
    nulls = _framed(21, nullable, {"a": None, "b": None})
    some = _framed(21, nullable, {"a": 7, "b": "seven"})
    rows = [(0, nulls), (1, some), (2, some[:-3]), (3, nulls + b"\x00")]
    out = decode(spark.createDataFrame(rows, "offset long, value binary"), {21: json.dumps(nullable.avro())},
                 nullable)
    # a trailing byte: from_avro ignores it after a record it reads; after a record of nulls the body is not
    # that record's exact encoding, so it is undecodable (stricter, never a wrong row)
    assert {r["offset"] for r in out.where(undecodable(out)).collect()} == {2, 3}
    got = {r["offset"]: r[DECODED] for r in out.collect()}
    assert got[0].asDict() == {"a": None, "b": None} and got[1].asDict() == {"a": 7, "b": "seven"}


def test_each_record_goes_through_from_avro_once_whichever_rows_are_kept(spark):
    """The decoding is costly: the plan of the rows a job writes holds one ``from_avro`` per writer id.

    A ``where`` on the decoded struct is pushed below the decoding with it inlined (plus once more per
    reader field inside a ``CASE``): 20+ copies for three writers, each record decoded several times.
    """
    from pyspark.sql import functions as F

    from connectors.schema_registry.decode import rows_where

    rows = [(i, _framed(11 + i % 3, WRITERS[11 + i % 3], _record(11 + i % 3, i))) for i in range(30)]
    df = spark.createDataFrame(rows, "offset long, value binary")
    reader = evolve(evolve(V1, V2).reader, V3).reader
    out = decode(df, {sid: json.dumps(s.avro()) for sid, s in WRITERS.items()}, reader)

    def copies(frame: Any) -> int:
        return str(frame._jdf.queryExecution().optimizedPlan().toString()).count("from_avro")

    kept = columns(rows_where(out, ~undecodable(out)), reader)
    assert copies(kept) == 3 and kept.count() == 30
    guard = F.when(undecodable(out), F.raise_error(F.lit("bad"))).otherwise(F.lit(True))
    failing = columns(rows_where(out, guard), reader)  # JobDecoding._failing's shape
    assert copies(failing) == 3 and failing.count() == 30
    assert copies(columns(out.where(~undecodable(out)), reader)) > 3  # what rows_where avoids


def test_the_fail_paths_check_holds_whatever_columns_are_read(spark):
    """A job failing on undecodable records fails even when its transform reads no decoded column."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    from connectors.schema_registry.decode import rows_where

    rows = [(i, _framed(11, V1, _record(11, i))) for i in range(5)] + [(5, b"\x00\x00\x00\x00\x0b\x02")]
    out = decode(spark.createDataFrame(rows, "offset long, value binary"), {11: json.dumps(V1.avro())}, V1)
    guard = F.when(undecodable(out), F.raise_error(F.lit("undecodable at 5"))).otherwise(F.lit(True))
    with pytest.raises(PySparkException, match="undecodable at 5"):
        columns(rows_where(out, guard), V1).select("offset").collect()
    good = out.where(F.col("offset") < 5)
    assert columns(rows_where(good, F.when(undecodable(good), F.raise_error(F.lit("x"))).otherwise(
        F.lit(True))), V1).select("offset").count() == 5
    # a transform's filter after it is not pushed below the check: the record it would drop still fails
    kept = columns(rows_where(out, guard), V1)
    for where in ("id < 3", "offset < 5", "sku = 'none'"):
        with pytest.raises(PySparkException, match="undecodable at 5"):
            kept.where(where).select("offset").collect()


class _Schemas:
    """The registry's answers by id (``RegistryClient.schema``): the writer schemas of :data:`WRITERS`."""

    def __init__(self, writers: dict[int, Any]) -> None:
        self.writers = writers

    def schema(self, sid: int) -> str:
        from source_backfill.errors import SchemaNotFoundError

        if sid not in self.writers:
            raise SchemaNotFoundError(str(sid))
        return json.dumps(self.writers[sid].avro())

    def close(self) -> None:
        pass


def test_a_read_ahead_taking_the_writer_ids_seen_decodes_alike_and_fails_at_an_unseen_one(spark):
    """``seen_only`` (``JobDecoding.decode``): the ids a read ahead decoded without growing the reader
    are taken as the next read's, in one pass; a record of another id fails the write, naming it."""
    from pyspark.errors import PySparkException

    from connectors.kafka.ranges import kafka_schema
    from source_backfill.config import JobSpec
    from source_backfill.executors.decoding import JobDecoding, unseen_writer

    v1_again = {**WRITERS, 14: V1}  # another id of the same schema: one the reads have not met
    spec = JobSpec(name="j", source="s", sink_path="/nowhere", format={"value": "avro", "evolution": "pin"})
    decoding = JobDecoding(spec, _Schemas(v1_again), V2)  # type: ignore[arg-type]
    readers = decoding.readers()

    def kafka_rows(sids: list[int]) -> Any:
        rows = [(None, _framed(sid, WRITERS[11 if sid == 14 else sid], _record(11 if sid == 14 else sid, i)),
                 "t", 0, i, None, 0) for i, sid in enumerate(sids)]
        return spark.createDataFrame(rows, kafka_schema())

    def decoded(df: Any, seen_only: bool) -> list[tuple[Any, ...]]:
        out = decoding.decode(df, None, None, None, ahead=readers, seen_only=seen_only)  # type: ignore[arg-type]
        return sorted(tuple(r) for r in out.drop("timestamp").collect())

    assert decoded(kafka_rows([]), False) == []  # an empty batch (an epoch's) sees no id
    assert decoding._seen(*readers) is None
    first = kafka_rows([11, 12] * 20)
    collected = decoded(first, True)  # no id seen yet: collected as an epoch does
    assert decoding._seen(*readers) == ((11, 12), ())
    assert decoded(first, True) == collected  # the seen ids taken: the same rows
    # offset, id, sku
    assert [(r[3], r[5], r[7]) for r in collected] == [(i, i, f"sku-{i}") for i in range(40)]
    met = kafka_rows([11, 12, 14, 11])
    with pytest.raises(PySparkException) as failed:
        decoded(met, True)
    assert unseen_writer(failed.value)
    assert len(decoded(met, False)) == 4  # decoded again, its ids collected: 14 is V1, resolved onto V2
    assert decoding._seen(*readers) == ((11, 12, 14), ())
