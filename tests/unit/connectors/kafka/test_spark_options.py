"""The options the service passes Spark's Kafka source: consumer defaults, deadlines, the user's overrides."""

from __future__ import annotations

from connectors.kafka.spark_kafka import reader_options
from source_backfill.config import SourceConfig


def test_spark_consumers_take_large_polls_read_committed_unless_the_source_says_otherwise():
    options = reader_options(SourceConfig(name="s", topics=["t"]), "b:9092")
    assert options["kafka.bootstrap.servers"] == "b:9092"
    assert options["kafka.max.poll.records"] == "10000"  # the Java client's 500 read 1M records ~30% slower
    assert options["kafka.isolation.level"] == "read_committed"
    mine = reader_options(
        SourceConfig(name="s", topics=["t"], kafka={"max.poll.records": "700",
                                                    "isolation.level": "read_uncommitted"}),
        "b:9092",
    )
    assert mine["kafka.max.poll.records"] == "700" and mine["kafka.isolation.level"] == "read_uncommitted"


def test_the_source_deadline_bounds_each_of_sparks_offset_fetch_attempts():
    options = reader_options(SourceConfig(name="s", topics=["t"], poll_timeout_s=30), "b:9092")
    assert options["kafkaConsumer.pollTimeoutMs"] == "30000"
    assert options["kafka.default.api.timeout.ms"] == options["kafka.request.timeout.ms"] == "10000"
