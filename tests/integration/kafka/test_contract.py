"""The connector contract: Spark's Kafka source and the Python data source give the same rows and ranges.

Every test runs once per connector (``sources[].connector``), through what the service uses: the history
reader (an epoch's own read and a read ahead's staged files) and the live stream with its offset log.
"""

from __future__ import annotations

import time

import pytest

from connectors.kafka.admin import KafkaAdmin
from connectors.kafka.factory import connector_for
from connectors.kafka.ranges import kafka_schema
from connectors.kafka.spark_kafka import INTERPRETED_RANGE_OFFSETS
from connectors.kafka.stream import batch_offsets
from source_backfill.config import SourceConfig
from source_backfill.core import HistoryRange
from source_backfill.errors import DataLossError
from source_backfill.executors.history import HistoryReader
from tests.integration.kafka.test_stream import Batches

pytestmark = pytest.mark.integration

CONNECTORS = ["spark", "python"]


def _reader(spark, bootstrap, connector, topic, **source):
    config = SourceConfig(name="s", topics=[topic], connector=connector, bootstrap_servers=bootstrap,
                          **source)
    admin = KafkaAdmin(bootstrap)
    return HistoryReader(spark, config, admin, connector=connector_for(config, bootstrap, spark, admin))


def _rows(df):
    return sorted((r.topic, r.partition, r.offset, bytes(r.value)) for r in df.collect())


@pytest.mark.parametrize("connector", CONNECTORS)
def test_history_rows_are_exactly_the_records_of_the_ranges(spark, kafka_bootstrap, topic_factory, produce,
                                                             connector):
    topic = topic_factory(partitions=3)
    produced = {}
    for part in range(3):
        values = [f"p{part}-{i}".encode() for i in range(20 + part)]
        for (p, off), v in zip(produce(topic, values, partition=part), values, strict=True):
            produced[(p, off)] = v
    reader = _reader(spark, kafka_bootstrap, connector, topic)
    ranges = [
        HistoryRange(f"{topic}:0", 0, 20),
        HistoryRange(f"{topic}:1", 5, 9),  # a sub-range: end exclusive
        HistoryRange(f"{topic}:1", 12, 15),  # a second range of the same split in one read
        HistoryRange(f"{topic}:2", 22, 22),  # empty
    ]
    df = reader.rows(ranges)
    assert df.schema == kafka_schema()
    want = sorted((topic, p, o, produced[(p, o)]) for r in ranges for p, o in produced
                  if f"{topic}:{p}" == r.split and r.start <= o < r.end)
    assert _rows(df) == want
    assert len(want) == 20 + 4 + 3
    # the read's bytes, counted once its action ran (key + value; these records have no key)
    assert reader.broker_bytes() == sum(len(v) for *_, v in want)


@pytest.mark.parametrize("connector", CONNECTORS)
def test_transactional_ranges_hold_only_the_committed_records(spark, kafka_bootstrap, topic_factory,
                                                              transactional_producer, connector):
    topic = topic_factory(partitions=1)
    committed = {}
    for batch, commit in (("c1", True), ("ab", False), ("c2", True), ("ab2", False)):
        values = [f"{batch}-{i}".encode() for i in range(5)]
        send = transactional_producer.commit if commit else transactional_producer.abort
        for (_p, off), v in zip(send(topic, values, partition=0), values, strict=True):
            if commit:
                committed[off] = v
    end = KafkaAdmin(kafka_bootstrap).end_offsets([f"{topic}:0"])[f"{topic}:0"]
    assert end == 24  # the log ends on the abort marker
    reader = _reader(spark, kafka_bootstrap, connector, topic)
    t0 = time.monotonic()
    rows = reader.rows([HistoryRange(f"{topic}:0", 0, end)]).collect()
    assert time.monotonic() - t0 < 30
    assert {r.offset: bytes(r.value) for r in rows} == committed
    # ranges that start or end on a marker or inside an aborted transaction are exact too
    for start, stop in ((5, 12), (6, 17), (0, 6), (17, 24)):
        read = reader.rows([HistoryRange(f"{topic}:0", start, stop)]).collect()
        got = {r.offset: bytes(r.value) for r in read}
        assert got == {o: v for o, v in committed.items() if start <= o < stop}, (start, stop)


@pytest.mark.parametrize("connector", CONNECTORS)
def test_a_range_under_the_log_start_fails_naming_split_and_offsets(spark, kafka_bootstrap, topic_factory,
                                                                    produce, connector):
    topic = topic_factory(partitions=1)
    produce(topic, [f"v{i}".encode() for i in range(10)], partition=0)
    sid = f"{topic}:0"
    assert KafkaAdmin(kafka_bootstrap).delete_records({sid: 4}) == {sid: 4}
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the data loss may come wrapped by Spark
        _reader(spark, kafka_bootstrap, connector, topic).rows([HistoryRange(sid, 1, 10)]).collect()
    message = str(caught.value)
    assert isinstance(caught.value, DataLossError) or "DataLossError" in message
    assert f"data loss on Kafka split {sid}" in message and "log start is 4" in message, message
    # fail_on_data_loss = false: what is left of the range
    reader = _reader(spark, kafka_bootstrap, connector, topic, fail_on_data_loss=False)
    assert [r.offset for r in reader.rows([HistoryRange(sid, 1, 10)]).orderBy("offset").collect()] == [
        *range(4, 10)
    ]


@pytest.mark.parametrize("connector", CONNECTORS)
def test_a_read_ahead_stages_exactly_the_rows_of_its_ranges(spark, kafka_bootstrap, topic_factory, produce,
                                                            tmp_path, connector):
    import pyarrow.parquet as pq

    from connectors.delta.sink import DeltaEpochSink

    topic = topic_factory(partitions=2)
    for part in range(2):
        produce(topic, [f"{part}-{i}".encode() for i in range(30)], partition=part)
    reader = _reader(spark, kafka_bootstrap, connector, topic)
    sink = DeltaEpochSink(str(tmp_path / "t"), "j", kafka_schema())
    ranges = (HistoryRange(f"{topic}:0", 3, 30), HistoryRange(f"{topic}:1", 0, 11))
    staged, counts = reader.stage(sink, ranges, after_epoch=-1)
    assert counts == {f"{topic}:0": 27, f"{topic}:1": 11}
    # the records' key + value bytes fetched, once (no key; values "<part>-<i>"), the same for both connectors
    fetched = sum(len(f"0-{i}") for i in range(3, 30)) + sum(len(f"1-{i}") for i in range(11))
    assert reader.broker_bytes() == fetched
    assert staged.rows == 38
    files = sorted(staged.folder.rglob("*.parquet"))
    table = pq.ParquetDataset(files).read()
    got = sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    assert got == [(0, o) for o in range(3, 30)] + [(1, o) for o in range(11)]
    sink.discard(staged)
    assert not staged.folder.exists()


def test_spark_copies_run_in_a_session_of_their_own_without_row_code_generation(
        spark, kafka_bootstrap, topic_factory, produce, tmp_path):
    """A read ahead's copy reads in the connector's copy session (Spark's row conversions interpreted, not
    generated per partition); the daemon's session is left as it was, and the staged rows are exactly
    the records, values and keys included."""
    import pyarrow.parquet as pq

    from connectors.delta.sink import DeltaEpochSink

    topic = topic_factory(partitions=3)
    for part in range(3):
        produce(topic, [f"{part}-{i}".encode() for i in range(20)], partition=part)
    reader = _reader(spark, kafka_bootstrap, "spark", topic)
    session = reader.connector.copy_session()
    assert session is reader.connector.copy_session() and session is not spark
    assert session.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
    assert spark.conf.get("spark.sql.codegen.factoryMode") != "NO_CODEGEN"
    sink = DeltaEpochSink(str(tmp_path / "t"), "j", kafka_schema())
    ranges = tuple(HistoryRange(f"{topic}:{p}", 2, 20) for p in range(3))
    sessions, read = [], reader.connector.read_ranges

    def spied(ranges, session=None):
        sessions.append(session)
        return read(ranges, session)

    reader.connector.read_ranges = spied
    staged, counts = reader.stage(sink, ranges, after_epoch=-1)
    assert sessions == [session]  # small ranges: the copy session (large ones keep generated code)
    assert counts == {f"{topic}:{p}": 18 for p in range(3)}
    table = pq.ParquetDataset(sorted(staged.folder.rglob("*.parquet"))).read()
    got = sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                     table.column("value").to_pylist(), table.column("key").to_pylist(), strict=True))
    assert got == [(p, o, f"{p}-{o}".encode(), None) for p in range(3) for o in range(2, 20)]
    sink.discard(staged)
    def chosen(ranges, session=None):  # which session a larger copy would read in (not read: no records)
        sessions.append(session)
        raise LookupError

    reader.connector.read_ranges = chosen
    big = tuple(HistoryRange(f"{topic}:{p}", 0, 20 + INTERPRETED_RANGE_OFFSETS) for p in range(3))
    with pytest.raises(LookupError):
        reader.connector.stage(sink, big, -1, None, tasks=1, niceness=0)
    assert sessions[-1] is None


@pytest.mark.parametrize("connector", CONNECTORS)
def test_the_live_stream_has_epochs_on_an_idle_topic_and_exact_batch_ranges(
    spark, kafka_bootstrap, topic_factory, produce, tmp_path, connector
):
    topic = topic_factory(partitions=2)
    for part in range(2):
        produce(topic, [f"{part}-{i}".encode() for i in range(40)], partition=part)
    config = SourceConfig(name="s", topics=[topic], connector=connector, bootstrap_servers=kafka_bootstrap,
                          starting_offsets="earliest", max_offsets_per_trigger=30, trigger_interval_s=0.5)
    sink = Batches()
    checkpoint = tmp_path / "ckpt"
    query = (
        connector_for(config, kafka_bootstrap, spark, KafkaAdmin(kafka_bootstrap)).live_stream()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0.5 seconds")
        .start()
    )
    try:
        # the backlog in bounded batches, then epochs on the idle topic, then new records
        sink.wait(lambda b: sum(len(r) for _, r in b) >= 80 and sum(1 for _, r in b[1:] if not r) >= 3)
        # on the idle topic epoch after epoch, each empty (their cadence, one a trigger, is make bench's:
        # trigger.*; a count in 4 s of wall clock failed on a busy machine, 5 epochs for 6)
        idle = len(sink.items)
        sink.wait(lambda b: len(b) >= idle + 6)
        assert all(not r for _, r in sink.items[idle:idle + 6]), [b for b, _ in sink.items[idle:]]
        produce(topic, [b"late"] * 5, partition=1)
        items = sink.wait(lambda b: sum(len(r) for _, r in b) >= 85)
    finally:
        query.stop()
    rows = sorted(r[:3] for _, batch in items for r in batch)
    assert len(rows) == 85 == len(set(rows))
    assert all(len(batch) <= 30 for _, batch in items)
    for batch_id, batch in items:
        start, end = batch_offsets(str(checkpoint), batch_id)
        assert (start is None) == (batch_id == 0)
        expected = sorted((topic, int(sid.rsplit(":", 1)[1]), off) for sid, e in end.items()
                          for off in range((start or {}).get(sid, 0), e))
        assert sorted(r[:3] for r in batch) == expected, batch_id


def test_the_same_source_with_other_consumer_options_reads_in_the_same_jvm(spark, kafka_bootstrap,
                                                                           topic_factory, produce):
    # Spark's consumer pool keys a consumer by group id and partition and fails a read whose options
    # differ from the pooled consumer's: a source added again with other brokers or deadlines (same
    # name, same topic) must read under a group of its own, not be refused for the old consumers
    topic = topic_factory(partitions=2)
    for part in range(2):
        produce(topic, [f"p{part}-{i}".encode() for i in range(30)], partition=part)
    ranges = [HistoryRange(f"{topic}:0", 0, 30), HistoryRange(f"{topic}:1", 0, 30)]
    for poll_timeout_s in (60, 15, 60):  # the consumer's deadlines change with the source's poll timeout
        reader = _reader(spark, kafka_bootstrap, "spark", topic, poll_timeout_s=poll_timeout_s)
        assert len(_rows(reader.rows(ranges))) == 60


def test_a_checkpoint_written_with_the_old_tick_keeps_it_and_a_new_one_ticks_every_trigger(
    spark, kafka_bootstrap, topic_factory, produce, tmp_path, monkeypatch
):
    # a query's sources can not change under its checkpoint: a log written with Spark's rate tick (before
    # rate-micro-batch) is read on with it after an upgrade, and its rows still come exactly
    from connectors.kafka import stream

    topic = topic_factory(partitions=1)
    produce(topic, [f"a{i}".encode() for i in range(10)], partition=0)
    config = SourceConfig(name="s", topics=[topic], connector="spark", bootstrap_servers=kafka_bootstrap,
                          starting_offsets="earliest", trigger_interval_s=0.5)
    checkpoint = tmp_path / "ckpt"

    def run(until) -> list:
        sink = Batches()
        query = (connector_for(config, kafka_bootstrap, spark, KafkaAdmin(kafka_bootstrap))
                 .live_stream(checkpoint).writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(checkpoint)).trigger(processingTime="0.5 seconds").start())
        try:
            return sink.wait(until)
        finally:
            query.stop()

    monkeypatch.setattr(stream, "tick_format", lambda _: stream.OLD_TICK_FORMAT)  # the old daemon's query
    first = run(lambda b: sum(len(r) for _, r in b) >= 10 and len(b) >= 2)
    monkeypatch.undo()
    assert stream.tick_format(checkpoint) == stream.OLD_TICK_FORMAT  # read from its log
    produce(topic, [f"b{i}".encode() for i in range(5)], partition=0)
    second = run(lambda b: sum(len(r) for _, r in b) >= 5)
    rows = sorted(r[2] for _, batch in first + second for r in batch)
    assert rows == list(range(15))  # each record once across the restart
    assert stream.tick_format(tmp_path / "new") == stream.TICK_FORMAT  # no log yet: the new tick
