"""An example of testing an Avro pipeline with source-backfill's test kit — copy it and adapt it.

Run it with the plugin enabled::

    pytest -p source_backfill.testing examples/test_my_avro_pipeline.py

Besides Kafka and the daemon, the plugin brings a real Schema Registry (``schema_registry``:
``SCHEMA_REGISTRY_URL``, else the embedded Apicurio Registry, built on first use). The producer here is
Confluent's own Avro serializer, as yours likely is; the job decodes by schema id into typed columns
(docs/guides/avro.md).
"""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

ORDER = """{"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
    {"name": "note", "type": ["null", "string"], "default": null}]}"""


def _avro_topic(bootstrap: str, registry: str, records: int) -> str:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep it alive until the topic exists
    admin.create_topics([NewTopic(topic, 3)])[topic].result(30)
    serialize = AvroSerializer(SchemaRegistryClient({"url": registry}), ORDER)
    producer = Producer({"bootstrap.servers": bootstrap})
    context = SerializationContext(topic, MessageField.VALUE)
    for i in range(records):
        producer.produce(topic, value=serialize({"id": i, "amount": i / 2, "note": None}, context),
                         partition=i % 3)
    producer.flush(30)
    return topic


def test_an_avro_job_backfills_typed_rows_exactly_once(kafka_bootstrap, schema_registry, backfill_daemon,
                                                       assert_exactly_once):
    """An Avro job decodes the topic's history by schema id into typed columns, exactly once."""
    from deltalake import DeltaTable

    topic = _avro_topic(kafka_bootstrap, schema_registry, 2000)
    daemon = backfill_daemon(sources=[{"name": "orders", "topics": [topic],
                                       "schema_registry": {"url": schema_registry}}])

    daemon.create_job(name="orders-typed", source="orders", format={"value": "avro"},
                      transform="SELECT id, amount, note, partition, offset, topic FROM {source}")
    daemon.wait_finished("orders-typed")

    assert_exactly_once(daemon, "orders-typed")
    rows = DeltaTable(str(daemon.tables / "orders-typed")).to_pyarrow_table(columns=["id", "amount"])
    assert sorted(rows.column("id").to_pylist()) == list(range(2000))
    assert sum(rows.column("amount").to_pylist()) == sum(i / 2 for i in range(2000))
