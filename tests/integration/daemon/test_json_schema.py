"""JSON Schema jobs against the real Schema Registry (``format.value = "json"``): a history spanning
versions, a live producer moving on, undecodable records as dead letters, exactly once.

Records are Confluent-framed JSON text (magic byte 0, the id the registry gave the version's JSON Schema,
the record), produced here; every row of a job's table is checked against the record it came from as the
rules say (an absent field: its writer's default, else the reader's), and its offsets against the Kafka
log offset by offset. Slow (``make test-slow``): they need the registry, which ``make test`` does not
build or start.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from deltalake import DeltaTable

from source_backfill.config import DEAD_LETTER_SUFFIX
from source_backfill.core.json_schema import parse_json_schema
from source_backfill.core.schema_evolution import Record
from source_backfill.executors.decoding import READER_PROPERTY
from tests.fixtures.framed_topic import FramedTopic
from tests.integration.daemon.conftest import await_both_tables, finished, job_spec, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_ID, _QTY, _SKU = {"type": "integer"}, {"type": "integer"}, {"type": "string"}
#: v1 ⊂ v2 ⊂ v3: each adds an optional property (v3's with a default), as BACKWARD allows of a closed
#: content model (``additionalProperties: false``; added to an open one, a property is incompatible)
DOCS = {
    1: {"type": "object", "title": "Order", "required": ["id", "qty", "sku"], "additionalProperties": False,
        "properties": {"id": _ID, "qty": _QTY, "sku": _SKU}},
    2: {"type": "object", "title": "Order", "required": ["id", "qty", "sku"], "additionalProperties": False,
        "properties": {"id": _ID, "qty": _QTY, "sku": _SKU, "note": {"type": ["string", "null"]}}},
    3: {"type": "object", "title": "Order", "required": ["id", "qty", "sku"], "additionalProperties": False,
        "properties": {"id": _ID, "qty": _QTY, "sku": _SKU, "note": {"type": ["string", "null"]},
                       "channel": {"type": "string", "default": "web"}}},
}
VERSIONS = {v: parse_json_schema(d) for v, d in DOCS.items()}


class JsonTopic(FramedTopic):
    """A topic of Confluent-framed JSON records (JSON Schema by id)."""

    schema_type = "JSON"

    def schema_text(self, v: int) -> str:
        return json.dumps(DOCS[v])

    def record(self, v: int, i: int) -> dict[str, Any]:
        rec: dict[str, Any] = {"id": i, "qty": i % 7, "sku": f"sku-{i}"}
        if v >= 2 and i % 2:
            rec["note"] = f"note {i}"  # else absent: null
        if v >= 3 and i % 3:
            rec["channel"] = "app"  # else absent: v3's default, web
        return rec

    def body(self, v: int, rec: dict[str, Any]) -> bytes:
        return json.dumps(rec).encode()

    def cut(self, value: bytes) -> bytes:
        return value[:-3]  # the text cut short: not JSON


def expected(reader: Record, v: int, rec: dict[str, Any]) -> dict[str, Any]:
    """The row of ``rec`` (written as version ``v``): a field absent takes its writer's default, else the
    reader's."""
    out = {}
    for f in reader.fields:
        w = VERSIONS[v].get(f.name)
        default = w.default if w is not None and w.has_default and w.default is not None else \
            (f.default if f.has_default else None)
        out[f.name] = rec.get(f.name, default)
    return out


def test_history_over_two_versions_then_a_live_third_evolves_the_table_exactly_once(
    daemon_factory, registry_topic, kafka_bootstrap, tmp_path
):
    topic = registry_topic(JsonTopic)
    topic.send(1, 300)
    topic.send(2, 300)
    topic.send(1, 20, corrupt_every=10)  # two texts cut short
    jobs = [job_spec("evolving", tmp_path, format={"value": "json", "on_decode_error": "dead_letter"},
                     max_rows_per_epoch=200)]
    d = daemon_factory([topic.topic], jobs, schema_registry={"url": topic.registry})
    wait_for(lambda: finished(d, "evolving"), what="the json job finished its history")
    topic.send(3, 200)  # the live producer moves to v3: a property with a default added
    main, dead = tmp_path / "evolving", tmp_path / f"evolving{DEAD_LETTER_SUFFIX}"

    await_both_tables(main, dead, kafka_bootstrap, topic.topic, timeout=180)
    table = DeltaTable(str(main))
    from source_backfill.core.schema_evolution import parse

    reader = parse(table.metadata().configuration[READER_PROPERTY])
    assert [(f.name, f.type) for f in reader.fields] == [
        ("id", "long"), ("qty", "long"), ("sku", "string"), ("note", "string"), ("channel", "string")]
    rows = table.to_pyarrow_table().to_pylist()
    got = {r["id"]: r for r in rows}
    assert len(got) == len(rows) == len(topic.sent)
    for i, (v, rec) in topic.sent.items():
        want = expected(reader, v, rec)
        assert {k: got[i][k] for k in want} == want, (i, v)
    # the column came with the first rows that hold it
    assert any(got[i]["channel"] == "web" for i, (v, _) in topic.sent.items() if v == 3)
    assert all(got[i]["channel"] is None for i, (v, _) in topic.sent.items() if v < 3)
    letters = DeltaTable(str(dead)).to_pyarrow_table().to_pylist()
    assert len(letters) == 2 and all(r["value"] is not None for r in letters)
