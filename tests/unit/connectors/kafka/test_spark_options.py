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


def test_spark_pools_a_consumer_per_partition_of_a_large_source_for_its_reads():
    """Past the pool's soft cap every borrow evicts idle consumers: a source of 100 partitions (a consumer
    each for its live stream and each poll class of its history) must stay under it."""
    from source_backfill.runtime.spark import DEFAULT_CONF

    assert int(DEFAULT_CONF["spark.kafka.consumer.cache.capacity"]) >= 4 * 100


class _Reader:
    """Spark's ``session.read`` as far as :func:`read_ranges` uses it: the options each read passes."""

    def __init__(self) -> None:
        self.reads: list[dict[str, str]] = []
        self.read = self

    def format(self, _name: str) -> _Reader:
        self.reads.append({})
        return self

    def options(self, **options: str) -> _Reader:
        self.reads[-1].update(options)
        return self

    def option(self, key: str, value: str) -> _Reader:
        self.reads[-1][key] = value
        return self

    def load(self) -> _Reader:
        return self

    def unionByName(self, _other: _Reader) -> _Reader:  # noqa: N802 - Spark's name
        return self


def test_history_reads_share_the_sources_group_by_poll_class_so_spark_lends_them_its_consumers():
    from connectors.kafka.spark_kafka import HISTORY_GROUP, poll_class, pool_group, read_ranges
    from source_backfill.core import HistoryRange

    source = SourceConfig(name="src", topics=["t"])
    connector = SparkKafkaConnector(source, "b:9092", None, None)  # type: ignore[arg-type]
    group = connector.history_group()
    assert group == HISTORY_GROUP.format(source="src")
    options = connector.reader_options()
    # the poll: SMALL_POLL for a read of small ranges (a rate-limited read ahead), else the configured
    assert [poll_class([HistoryRange("t:0", 0, n)], options) for n in (1, 12, 1000, 1001, 10**6)] \
        == [1000, 1000, 1000, 10000, 10000]
    mine = SparkKafkaConnector(SourceConfig(name="src", topics=["t"], kafka={"max.poll.records": "300"}),
                               "b:9092", None, None).reader_options()  # type: ignore[arg-type]
    assert {poll_class([HistoryRange("t:0", 0, n)], mine) for n in (12, 10**6)} == {300}
    session = _Reader()
    # a rate-limited job's reads ahead: a few offsets of each partition, read after read
    for start in (0, 12, 24):
        read_ranges(session, [HistoryRange(f"t:{p}", start, start + 12) for p in range(3)], options,  # type: ignore[arg-type]
                    group=group)
    read_ranges(session, [HistoryRange("t:0", 0, 1_000_000)], options, group=group)  # type: ignore[arg-type]
    seen = [(r["kafka.group.id"], r["kafka.max.poll.records"]) for r in session.reads]
    # one group per source and poll class: Spark's pool keys consumers (and the rest of a poll) by group
    # and partition, and a consumer polls what the read that opened it asked for
    digest = pool_group(group, options, 1000).split("-")[-2]
    assert seen == [(f"source-backfill-src-history-{digest}-1000", "1000")] * 3 \
        + [(f"source-backfill-src-history-{digest}-10000", "10000")]
    # the reads outside the service's connector (a baseline's) keep a group of their own, polls capped
    read_ranges(session, [HistoryRange("t:0", 0, 12)], options)  # type: ignore[arg-type]
    assert "kafka.group.id" not in session.reads[-1] and session.reads[-1]["kafka.max.poll.records"] == "12"


def test_a_source_whose_brokers_or_credentials_change_gets_consumers_of_its_own():
    # Spark's pool lends a consumer by group id and partition, whatever options made it: the same
    # source on other brokers (dropped and added again in a running JVM) must not be lent the consumers
    # still pointing at the old ones (a test's broker after another's on the same topic hung every read)
    from connectors.kafka.spark_kafka import pool_group

    def group_of(bootstrap: str, kafka: dict[str, str] | None = None, poll: int = 1000) -> str:
        source = SourceConfig(name="src", topics=["t"], kafka=kafka or {})
        connector = SparkKafkaConnector(source, bootstrap, None, None)  # type: ignore[arg-type]
        group = connector.history_group()
        assert group is not None
        return pool_group(group, connector.reader_options(), poll)

    assert group_of("b:9092") == group_of("b:9092")  # stable: the reads of a source share their consumers
    assert group_of("b:9092") != group_of("c:9092")
    assert group_of("b:9092") != group_of("b:9092", {"client.id": "other"})
    assert group_of("b:9092") != group_of("b:9092", poll=10000)
    # the poll is in the name already: max.poll.records alone does not split a poll class
    assert group_of("b:9092", {"max.poll.records": "300"}, 300).endswith("-300")


def test_a_source_naming_its_own_group_keeps_it_for_history_reads_too():
    from connectors.kafka.spark_kafka import read_ranges
    from source_backfill.core import HistoryRange

    source = SourceConfig(name="src", topics=["t"], kafka={"group.id": "mine"})
    connector = SparkKafkaConnector(source, "b:9092", None, None)  # type: ignore[arg-type]
    assert connector.history_group() is None
    session = _Reader()
    read_ranges(session, [HistoryRange("t:0", 0, 12)], connector.reader_options(),  # type: ignore[arg-type]
                group=connector.history_group())
    assert session.reads[-1]["kafka.group.id"] == "mine"
    assert session.reads[-1]["kafka.max.poll.records"] == "10000"  # the pool's consumers share options

