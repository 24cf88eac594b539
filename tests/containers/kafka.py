"""Kafka for the container tests: the stand-in image's settings (apache/kafka's) and host-side helpers.

Every client made here is closed (flushed and dropped) before the broker stops, so none is left polling a
stopped broker (librdkafka's ``Connection refused`` lines).
"""

from __future__ import annotations

import gc
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def kafka_env(host_port: int, alias: str = "broker") -> list[str]:
    """``-e`` arguments of one KRaft node: ``alias:9092`` inside the network, ``127.0.0.1:host_port`` outside.

    The settings of deploy/compose/compose.yaml's kafka service (the official image's variables).
    """
    env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@{alias}:9093",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093,HOST://:9094",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{alias}:9092,HOST://127.0.0.1:{host_port}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,HOST:PLAINTEXT",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }
    return [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]


def wait_kafka(bootstrap: str, timeout_s: float = 120.0) -> float:
    """Block until a metadata request names a broker; the seconds it took."""
    started = time.monotonic()
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        while True:
            try:
                if admin.list_topics(timeout=2).brokers:
                    return time.monotonic() - started
            except Exception:  # noqa: BLE001 - not up yet
                pass
            assert time.monotonic() - started < timeout_s, f"no Kafka at {bootstrap} within {timeout_s}s"
            time.sleep(0.5)
    finally:
        del admin
        gc.collect()


def create_and_fill(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    """Create ``topic`` and produce ``records`` records across its partitions (then drop the clients)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)
    finally:
        del admin
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
    try:
        for i in range(records):
            producer.produce(topic, key=str(i).encode(), value=f'{{"n": {i}}}'.encode(),
                             partition=i % partitions)
        assert producer.flush(30) == 0, "records not delivered"
    finally:
        del producer
        gc.collect()
