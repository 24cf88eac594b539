"""A batch decoded for a job against the real registry: three versions of a subject in one batch, each
policy's outcome, and what the registry does not know kept undecodable, never dropped."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from connectors.schema_registry.client import RegistryClient
from connectors.schema_registry.stage import decode_batch
from source_backfill.core.schema_evolution import parse, resolve
from source_backfill.errors import SchemaChangeError
from tests.integration.schema_registry.test_decode import V1, V2, V3, _framed, _record

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _register(url: str, subject: str, schema) -> int:
    r = httpx.post(f"{url}/subjects/{subject}/versions", json={"schema": json.dumps(schema.avro())},
                   timeout=30)
    r.raise_for_status()
    return int(r.json()["id"])


@pytest.fixture
def batch(schema_registry, spark):
    subject = f"orders-{uuid.uuid4().hex[:8]}-value"
    # v3 drops sku (BACKWARD allows a dropped field, and a widened type read by promotion)
    ids = {name: _register(schema_registry, subject, s) for name, s in (("v1", V1), ("v2", V2), ("v3", V3))}
    local = {11: ids["v1"], 12: ids["v2"], 13: ids["v3"]}
    rows, records = [], {}
    for i in range(90):
        sid = 11 + i % 3
        records[i] = (sid, _record(sid, i))
        rows.append((i, _framed(local[sid], {11: V1, 12: V2, 13: V3}[sid], records[i][1])))
    rows += [(100, _framed(2_000_000_000, V1, _record(11, 1))), (101, b"\x00\x00\x00")]
    return spark.createDataFrame(rows, "offset long, value binary"), records, ids


def test_evolve_grows_the_reader_through_every_version_of_the_batch(schema_registry, batch):
    df, records, ids = batch
    with RegistryClient(schema_registry) as client:
        out = decode_batch(df, client, V1, "evolve")
    assert [f.name for f in out.reader.fields] == ["id", "qty", "sku", "note"]
    assert out.reader.get("qty").type == "long"
    assert out.ids == (*sorted(ids.values()), 2_000_000_000) and out.unknown == (2_000_000_000,)
    writers = {11: V1, 12: V2, 13: V3}
    got = {r["offset"]: r.asDict() for r in out.rows.collect()}
    for i, (sid, rec) in records.items():
        want = resolve(out.reader, writers[sid]).project(rec)
        assert {k: got[i][k] for k in want} == want, i
    assert {r["offset"] for r in out.undecodable.collect()} == {100, 101}


def test_pin_and_fail_refuse_a_version_they_cannot_take_naming_its_id(schema_registry, batch):
    df, _, ids = batch
    with RegistryClient(schema_registry) as client:
        with pytest.raises(SchemaChangeError, match=f"writer schema id {ids['v3']}: field 'qty'"):
            decode_batch(df, client, V1, "pin")  # v3 writes qty as long: not read as v1's int
        with pytest.raises(SchemaChangeError, match=f"writer schema id {ids['v2']}: .*policy is fail"):
            decode_batch(df, client, V1, "fail")
        pinned = decode_batch(df.where("offset % 3 != 2"), client, parse(json.dumps(V1.avro())), "pin")
    assert pinned.reader == V1 and pinned.rows.columns == ["offset", "id", "qty", "sku"]
