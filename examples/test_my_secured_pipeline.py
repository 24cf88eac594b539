"""An example of testing your pipeline against a secured Kafka (SASL_SSL, SCRAM, a private CA).

Run it with the plugin enabled::

    pytest -p source_backfill.testing examples/test_my_secured_pipeline.py

``secured_broker`` is an embedded Apache Kafka whose listener is ``SASL_SSL``, its CA and users made for
the session; ``secured_broker.client_security()`` is a source's ``security`` section for the user
``alice`` (files holding her password and the CA), ``secured_broker.librdkafka_config()`` the same for
your own confluent-kafka clients. The daemon and ``assert_exactly_once`` connect as the source says.
"""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def test_a_job_over_sasl_ssl_backfills_exactly_once(secured_broker, backfill_daemon, assert_exactly_once):
    """A job on a source that connects over SASL_SSL copies the history, checked offset by offset."""
    config = secured_broker.librdkafka_config()  # bootstrap.servers, SASL_SSL, alice, the CA
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(config)
    admin.create_topics([NewTopic(topic, 2)])[topic].result(30)
    producer = Producer(config)
    for i in range(2000):
        producer.produce(topic, value=f'{{"payment": {i}}}'.encode(), partition=i % 2)
    producer.flush(30)

    daemon = backfill_daemon(sources=[{
        "name": "payments", "topics": [topic], "bootstrap_servers": secured_broker.bootstrap,
        "security": secured_broker.client_security(),
    }])
    daemon.create_job(name="payments-copy", source="payments")
    daemon.wait_finished("payments-copy")
    assert_exactly_once(daemon, "payments-copy")  # reads the log over SASL_SSL, offset by offset
