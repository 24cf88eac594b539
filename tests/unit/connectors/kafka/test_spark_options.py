"""The options the service passes Spark's Kafka source: consumer defaults, deadlines, the user's overrides."""

from __future__ import annotations

from connectors.kafka.spark_kafka import SparkKafkaConnector
from source_backfill.config import SourceConfig


def reader_options(source: SourceConfig, bootstrap: str) -> dict[str, str]:
    """The Spark connector's options (no session or admin needed to make them)."""
    return SparkKafkaConnector(source, bootstrap, None, None).reader_options()  # type: ignore[arg-type]


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


def test_a_history_read_polls_no_more_records_than_its_largest_range():
    from connectors.kafka.spark_kafka import poll_records
    from source_backfill.core import HistoryRange

    options = reader_options(SourceConfig(name="s", topics=["t"]), "b:9092")
    small = [HistoryRange("t:0", 100, 150), HistoryRange("t:1", 0, 80)]
    # Spark keeps a reader's last poll after the read: a 10,000-record poll for 80 offsets held the rest
    assert poll_records(small, options) == "80"
    assert poll_records([HistoryRange("t:0", 0, 1_000_000)], options) == "10000"
    assert poll_records([HistoryRange("t:0", 5, 5)], options) == "1"
    mine = reader_options(SourceConfig(name="s", topics=["t"], kafka={"max.poll.records": "700"}), "b:9092")
    assert poll_records([HistoryRange("t:0", 0, 5000)], mine) == "700"
    # a source's own group id shares Spark's pooled consumers between reads: their options must be equal
    grouped = reader_options(SourceConfig(name="s", topics=["t"], kafka={"group.id": "g"}), "b:9092")
    assert poll_records(small, grouped) is None


def test_spark_keeps_a_readers_last_poll_briefly_not_five_minutes():
    from source_backfill.runtime.spark import DEFAULT_CONF

    assert DEFAULT_CONF["spark.kafka.consumer.fetchedData.cache.timeout"] == "10s"
    assert DEFAULT_CONF["spark.kafka.consumer.fetchedData.cache.evictorThreadRunInterval"] == "5s"
