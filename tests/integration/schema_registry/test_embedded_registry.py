"""The embedded Schema Registry (Apicurio's Confluent API) with Confluent's own clients, no mocks.

Avro records written by confluent-kafka's ``AvroSerializer`` to the real broker are read back and decoded
by the schema id in their 5-byte header; a compatible v2 gets a new id; an incompatible schema is refused
(409) under ``BACKWARD``. Marked slow: the registry's first build takes a minute or two (``make registry``).
"""

from __future__ import annotations

import io
import json
import os
import uuid

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "test.orders",
    "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
}
#: v1 plus a field with a default: BACKWARD compatible (a v2 reader reads v1 records, ``qty`` = 1)
V2 = {**V1, "fields": [*V1["fields"], {"name": "qty", "type": "int", "default": 1}]}
#: ``id`` turned into a string: a v3 reader cannot read v1 records, so BACKWARD refuses it
BROKEN = {**V1, "fields": [{"name": "id", "type": "string"}, {"name": "item", "type": "string"}]}


@pytest.fixture(scope="module")
def client(schema_registry):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": schema_registry})


def _schema(record):
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps(record), "AVRO")


def _produce_avro(bootstrap, client, topic, schema, values):
    """Write ``values`` with Confluent's serializer, which looks the schema's id up (no registering)."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": False})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
    errors = []
    for value in values:
        producer.produce(topic, value=serializer(value, SerializationContext(topic, MessageField.VALUE)),
                         partition=0, on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(30) == 0
    assert not errors, errors


def _read_all(bootstrap, topic, count):
    """The raw values of the first ``count`` records of ``topic``'s partition 0."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "log_level": 3})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values = []
        while len(values) < count:
            msg = consumer.poll(10)
            assert msg is not None, f"only {len(values)} of {count} records came back"
            assert msg.error() is None, msg.error()
            values.append(msg.value())
        return values
    finally:
        consumer.close()


def _decode(client, value, reader=None):
    """``(schema id, record)``: the body decoded with the writer schema its header names (onto ``reader``)."""
    import fastavro

    from connectors.schema_registry.wire import split_header

    schema_id, body = split_header(value)
    writer = fastavro.parse_schema(json.loads(client.get_schema(schema_id).schema_str))
    reader_schema = fastavro.parse_schema(reader) if reader is not None else None
    return schema_id, fastavro.schemaless_reader(io.BytesIO(body), writer, reader_schema)


def test_avro_records_come_back_decoded_by_the_schema_id_in_their_header(client, kafka_bootstrap,
                                                                         topic_factory):
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = topic_factory(1, prefix="avro")
    v1_id = client.register_schema(f"{topic}-value", _schema(V1))
    sent = [{"id": i, "item": f"item-{i}"} for i in range(20)]
    _produce_avro(kafka_bootstrap, client, topic, V1, sent)

    values = _read_all(kafka_bootstrap, topic, len(sent))
    assert all(v[:1] == b"\x00" and int.from_bytes(v[1:5], "big") == v1_id for v in values)
    assert [_decode(client, v) for v in values] == [(v1_id, r) for r in sent]
    # Confluent's own deserializer agrees (it fetches the writer schema by the same id)
    deserialize = AvroDeserializer(client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    assert [deserialize(v, ctx) for v in values] == sent


def test_a_compatible_v2_gets_a_new_id_and_each_record_decodes_by_its_own(client, kafka_bootstrap,
                                                                         topic_factory):
    topic = topic_factory(1, prefix="avro-v2")
    subject = f"{topic}-value"
    client.set_compatibility(subject, "BACKWARD")
    v1_id = client.register_schema(subject, _schema(V1))
    _produce_avro(kafka_bootstrap, client, topic, V1, [{"id": 1, "item": "a"}])
    assert client.test_compatibility(subject, _schema(V2))
    v2_id = client.register_schema(subject, _schema(V2))
    assert v2_id != v1_id
    assert client.get_versions(subject) == [1, 2]
    latest = client.get_latest_version(subject)
    assert (latest.version, latest.schema_id) == (2, v2_id)
    assert client.register_schema(subject, _schema(V2)) == v2_id  # the same schema again: the same id
    _produce_avro(kafka_bootstrap, client, topic, V2, [{"id": 2, "item": "b", "qty": 5}])

    v1_value, v2_value = _read_all(kafka_bootstrap, topic, 2)
    assert _decode(client, v1_value) == (v1_id, {"id": 1, "item": "a"})
    assert _decode(client, v2_value) == (v2_id, {"id": 2, "item": "b", "qty": 5})
    # a v1 record read with v2 as the reader schema gets the added field's default
    assert _decode(client, v1_value, reader=V2) == (v1_id, {"id": 1, "item": "a", "qty": 1})


def test_an_incompatible_schema_is_refused_under_backward(client):
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    subject = f"broken-{uuid.uuid4().hex[:8]}-value"
    client.set_compatibility(subject, "BACKWARD")
    assert client.get_compatibility(subject) == "BACKWARD"
    client.register_schema(subject, _schema(V1))
    assert not client.test_compatibility(subject, _schema(BROKEN))
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, _schema(BROKEN))
    assert refused.value.http_status_code == 409
    assert client.get_versions(subject) == [1]


@pytest.mark.skipif(bool(os.environ.get("SCHEMA_REGISTRY_URL")), reason="a registry of the environment's")
def test_the_embedded_registry_starts_on_loopback_and_stops_with_its_process(schema_registry):
    import httpx

    from connectors.schema_registry.embedded import CCOMPAT_PATH, EmbeddedRegistry

    registry = EmbeddedRegistry(compatibility=None).start()  # built already: the session's fixture did it
    pid, log_dir = registry.pid, registry.log_dir
    try:
        assert registry.url.startswith("http://127.0.0.1:") and registry.url.endswith(CCOMPAT_PATH)
        assert httpx.get(f"{registry.url}/subjects").json() == []  # a registry of its own: empty
        assert (log_dir / "registry.out").stat().st_size > 0
    finally:
        registry.stop()
    assert not registry.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not log_dir.exists()


@pytest.mark.skipif(bool(os.environ.get("SCHEMA_REGISTRY_URL")), reason="a registry of the environment's")
def test_the_embedded_registry_dies_with_the_process_that_started_it(schema_registry, tmp_path):
    """A test run killed before its fixtures stop leaves no registry behind (PR_SET_PDEATHSIG)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    script = ("import os\nfrom connectors.schema_registry.embedded import EmbeddedRegistry\n"
              f"r = EmbeddedRegistry(log_dir={str(tmp_path)!r}).start()\n"
              "print(r.pid, flush=True)\nos._exit(0)  # no stop(): as a killed test run\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, check=True)
    pid = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), f"registry {pid} outlived its parent"
