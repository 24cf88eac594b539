"""An example of testing your own pipeline with source-backfill's test kit — copy it and adapt it.

Run it with the plugin enabled::

    pytest -p source_backfill.testing examples/test_my_pipeline.py

The plugin brings a real Kafka (``KAFKA_BOOTSTRAP_SERVERS``, else testcontainers when Docker answers,
else an embedded broker), a real daemon process (``backfill_daemon``) and an offset-by-offset exactly-once
check (``assert_exactly_once``).
"""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def _topic_with_history(bootstrap: str, records: int) -> str:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep it alive until the topic exists
    admin.create_topics([NewTopic(topic, 3)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(records):
        producer.produce(topic, key=str(i).encode(), value=f'{{"order": {i}}}'.encode(), partition=i % 3)
    producer.flush(30)
    return topic


def test_a_new_job_backfills_the_history_exactly_once(kafka_bootstrap, backfill_daemon, assert_exactly_once):
    """A job attached to a running source copies the topic's history and hands over, exactly once."""
    topic = _topic_with_history(kafka_bootstrap, 3000)
    daemon = backfill_daemon(sources=[{"name": "orders", "topics": [topic]}])

    # attach a job to the running source: it backfills the history, then follows the live stream
    daemon.create_job(name="orders-copy", source="orders", rate_limit=5000)
    job = daemon.wait_finished("orders-copy")
    assert job["rows_history"] >= 3000

    assert_exactly_once(daemon, "orders-copy")
