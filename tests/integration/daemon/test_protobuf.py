"""Protobuf jobs against the real Schema Registry (``format.value = "protobuf"``): a history spanning
versions, a live producer moving on, an incompatible version, undecodable records as dead letters,
exactly once.

Records are Confluent-framed Protobuf (magic byte 0, the id the registry gave the version's ``.proto``,
the message indexes, the message), written by the ``protobuf`` package; every row of a job's table is
checked against the record it came from (a field left out: proto3's zero, or null when ``optional``),
and its offsets against the Kafka log offset by offset. Slow (``make test-slow``): they need the
registry, which ``make test`` does not build or start.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from deltalake import DeltaTable

from connectors.schema_registry.decode_protobuf import message_class
from source_backfill.config import DEAD_LETTER_SUFFIX
from source_backfill.core.proto_schema import first_message, zigzag_indexes
from source_backfill.core.schema_evolution import parse
from source_backfill.executors.decoding import READER_PROPERTY
from tests.fixtures.framed_topic import FramedTopic
from tests.integration.daemon.conftest import await_both_tables, exactly_once, finished, job_spec, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_HEAD = 'syntax = "proto3";\npackage shop;\n'
#: v1 ⊂ v2 ⊂ v3: each adds a field (v2's optional: absent is null; v3's implicit: absent is "")
TEXTS = {
    1: _HEAD + "message Order {\n  int64 id = 1;\n  int32 qty = 2;\n  string sku = 3;\n}\n",
    2: _HEAD + "message Order {\n  int64 id = 1;\n  int32 qty = 2;\n  string sku = 3;\n"
               "  optional string note = 4;\n}\n",
    3: _HEAD + "message Order {\n  int64 id = 1;\n  int32 qty = 2;\n  string sku = 3;\n"
               "  optional string note = 4;\n  string channel = 5;\n}\n",
    # qty as text: the registry refuses it under BACKWARD, so it is registered under another subject
    9: _HEAD + "message Order {\n  int64 id = 1;\n  string qty = 2;\n  string sku = 3;\n}\n",
}
CLASSES = {v: message_class(first_message(t)) for v, t in TEXTS.items()}


class ProtoTopic(FramedTopic):
    """A topic of Confluent-framed Protobuf records (a ``.proto`` by id)."""

    schema_type = "PROTOBUF"

    def schema_text(self, v: int) -> str:
        return TEXTS[v]

    def record(self, v: int, i: int) -> dict[str, Any]:
        rec: dict[str, Any] = {"id": i, "qty": i % 7, "sku": f"sku-{i}"}
        if v >= 2 and i % 2:
            rec["note"] = f"note {i}"  # else absent: null
        if v >= 3 and i % 3:
            rec["channel"] = "app"  # else absent: ""
        return rec

    def body(self, v: int, rec: dict[str, Any]) -> bytes:
        return zigzag_indexes((0,)) + CLASSES[v](**rec).SerializeToString()

    def cut(self, value: bytes) -> bytes:
        return value[:-1]  # the last field is a non-empty string: cut inside it


def expected(v: int, rec: dict[str, Any]) -> dict[str, Any]:
    """The row of ``rec`` written as version ``v``, in the reader grown through v3."""
    return {"id": rec["id"], "qty": rec["qty"], "sku": rec["sku"], "note": rec.get("note"),
            "channel": rec.get("channel", "" if v >= 3 else None)}


def test_history_over_two_versions_then_a_live_third_evolves_the_table_exactly_once(
    daemon_factory, registry_topic, kafka_bootstrap, tmp_path
):
    topic = registry_topic(ProtoTopic)
    topic.send(1, 300)
    topic.send(2, 300)
    topic.send(1, 20, corrupt_every=10)  # two messages cut short
    jobs = [job_spec("evolving", tmp_path, format={"value": "protobuf", "on_decode_error": "dead_letter"},
                     max_rows_per_epoch=200),
            job_spec("pinned", tmp_path, format={"value": "protobuf", "evolution": "pin",
                                                 "on_decode_error": "dead_letter"})]
    d = daemon_factory([topic.topic], jobs, schema_registry={"url": topic.registry})
    wait_for(lambda: finished(d, "evolving") and finished(d, "pinned"), what="both jobs finished history")
    topic.send(3, 200)  # the live producer moves to v3
    for name in ("evolving", "pinned"):
        dead = tmp_path / f"{name}{DEAD_LETTER_SUFFIX}"
        await_both_tables(tmp_path / name, dead, kafka_bootstrap, topic.topic)
        letters = DeltaTable(str(dead)).to_pyarrow_table().to_pylist()
        assert len(letters) == 2 and all(r["value"] is not None for r in letters)
    evolving = DeltaTable(str(tmp_path / "evolving"))
    reader = parse(evolving.metadata().configuration[READER_PROPERTY])
    assert [(f.name, f.type) for f in reader.fields] == [
        ("id", "long"), ("qty", "int"), ("sku", "string"), ("note", "string"), ("channel", "string")]
    rows = evolving.to_pyarrow_table().to_pylist()
    got = {r["id"]: r for r in rows}
    assert len(got) == len(rows) == len(topic.sent)
    for i, (v, rec) in topic.sent.items():
        want = expected(v, rec)
        assert {k: got[i][k] for k in want} == want, (i, v)
    # pin: the reader of its creation (v2, the subject's latest then) stays; v3's channel is skipped
    pinned = DeltaTable(str(tmp_path / "pinned")).to_pyarrow_table().to_pylist()
    assert "channel" not in pinned[0] and len(pinned) == len(topic.sent)
    assert {r["id"]: r["note"] for r in pinned} == {i: rec.get("note") for i, (_, rec) in topic.sent.items()}


def test_an_incompatible_version_fails_its_job_alone_naming_the_field(
    daemon_factory, registry_topic, kafka_bootstrap, tmp_path
):
    topic = registry_topic(ProtoTopic)
    topic.send(1, 50)
    jobs = [job_spec("decoding", tmp_path, format={"value": "protobuf"}), job_spec("raw", tmp_path)]
    d = daemon_factory([topic.topic], jobs, schema_registry={"url": topic.registry})
    wait_for(lambda: finished(d, "decoding") and finished(d, "raw"), what="both jobs finished history")
    # qty as text, under another subject (this one's BACKWARD check refuses it): no reader reads it
    r = httpx.post(f"{topic.registry}/subjects/{topic.topic}-other-value/versions", timeout=30,
                   json={"schema": TEXTS[9], "schemaType": "PROTOBUF"})
    r.raise_for_status()
    sid = int(r.json()["id"])
    topic.send_raw(b"\x00" + sid.to_bytes(4, "big") + zigzag_indexes((0,))
                   + CLASSES[9](id=10_000, qty="many", sku="x").SerializeToString())
    wait_for(lambda: d.registry.get("decoding").error, what="the decoding job failed")
    error = d.registry.get("decoding").error
    assert f"writer schema id {sid}" in error and "'qty'" in error, error
    topic.send(1, 10)
    exactly_once(tmp_path / "raw", kafka_bootstrap, [topic.topic])
    assert d.registry.get("raw").error is None
