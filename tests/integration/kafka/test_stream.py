"""Streaming reads of the kafka_py source: bounded micro-batches, idle epochs, new splits, offset log."""

from __future__ import annotations

import json
import threading
import time

import pytest

from connectors.kafka.admin import KafkaAdmin
from connectors.kafka.source import KAFKA_FORMAT
from connectors.kafka.stream import batch_offsets

pytestmark = pytest.mark.integration


class Batches:
    """Collects (batch_id, rows) from foreachBatch."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items: list[tuple[int, list[tuple[str, int, int, bytes]]]] = []

    def __call__(self, df, batch_id):
        rows = [(r.topic, r.partition, r.offset, bytes(r.value)) for r in df.collect()]
        with self.lock:
            self.items.append((batch_id, rows))

    def wait(self, predicate, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if predicate(list(self.items)):
                    return list(self.items)
            time.sleep(0.2)
        raise AssertionError(f"timed out; batches so far: {[(b, len(r)) for b, r in self.items]}")


def _start(spark, bootstrap, checkpoint, sink, trigger=None, **options):
    reader = spark.readStream.format(KAFKA_FORMAT).option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**(trigger or {"processingTime": "0.5 seconds"}))
        .start()
    )


def _replay(spark, bootstrap, start, end):
    ranges = [
        {
            "topic": sid.rsplit(":", 1)[0],
            "partition": int(sid.rsplit(":", 1)[1]),
            "start": (start or {}).get(sid, 0),
            "end": e,
        }
        for sid, e in end.items()
    ]
    df = (
        spark.read.format(KAFKA_FORMAT)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("ranges", json.dumps(ranges))
    )
    return sorted((r.topic, r.partition, r.offset, bytes(r.value)) for r in df.load().collect())


def test_bounded_micro_batches_idle_epochs_offset_log_and_replay(
    spark, kafka_bootstrap, topic_factory, produce, tmp_path
):
    topic = topic_factory(partitions=2)
    for part in range(2):
        produce(topic, [f"{part}-{i}".encode() for i in range(50)], partition=part)
    sink = Batches()
    checkpoint = tmp_path / "ckpt"
    query = _start(
        spark,
        kafka_bootstrap,
        checkpoint,
        sink,
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="30",
    )
    try:
        # the burst of 100 arrives in batches of <= 30; then the idle topic still yields epochs
        items = sink.wait(lambda b: sum(len(r) for _, r in b) >= 100 and sum(1 for _, r in b if not r) >= 2)
    finally:
        query.stop()
    assert all(len(rows) <= 30 for _, rows in items)
    assert sum(1 for _, rows in items if rows) >= 4
    all_rows = sorted(r for _, rows in items for r in rows)
    assert len(all_rows) == 100 == len(set(all_rows))
    # each batch contains exactly [start, end) of the offset log, and a replay of the ranges is identical
    for batch_id, rows in items:
        start, end = batch_offsets(str(checkpoint), batch_id)
        if batch_id == 0:
            assert start is None
        expected = sorted(
            (topic, int(sid.rsplit(":", 1)[1]), off)
            for sid, e in end.items()
            for off in range((start or {}).get(sid, 0), e)
        )
        assert sorted(r[:3] for r in rows) == expected
        if rows and batch_id % 2 == 0:
            assert _replay(spark, kafka_bootstrap, start, end) == sorted(rows)


@pytest.mark.parametrize("max_tasks", [None, "1"], ids=["task-per-range", "ranges-grouped"])
def test_new_partitions_and_topics_are_picked_up(spark, kafka_bootstrap, topic_factory, produce, tmp_path,
                                                 max_tasks):
    prefix = f"pat{int(time.time() * 1000)}"
    first = topic_factory(partitions=1, prefix=prefix)
    produce(first, [b"a0", b"a1"], partition=0)
    sink = Batches()
    checkpoint = tmp_path / "ckpt"
    query = _start(
        spark, kafka_bootstrap, checkpoint, sink, subscribePattern=f"{prefix}-.*", startingOffsets="earliest",
        **({"maxTasks": max_tasks} if max_tasks else {}),
    )
    try:
        sink.wait(lambda b: sum(len(r) for _, r in b) >= 2)
        # a new topic matching the pattern is a set of new splits: read from its earliest offset
        second = topic_factory(partitions=2, prefix=prefix)
        produce(second, [b"b0"], partition=0)
        produce(second, [b"c0", b"c1"], partition=1)
        # a partition added to a subscribed topic is a new split too
        KafkaAdmin(kafka_bootstrap).add_partitions(first, 2)
        produce(first, [b"n0"], partition=1)
        total = 6
        items = sink.wait(lambda b: sum(len(r) for _, r in b) >= total)
    finally:
        query.stop()
    values = sorted(r[3] for _, rows in items for r in rows)
    assert set(values) == {b"a0", b"a1", b"b0", b"c0", b"c1", b"n0"}
    assert len(values) == len(set(values)) == total
    # the batch that first saw each new split starts it at its earliest offset (recorded as "born" in
    # its offset; the splits of one new topic may show up in different batches), and a replay of that
    # batch's ranges reads exactly its rows
    new_splits = {f"{second}:0", f"{second}:1", f"{first}:1"}
    seen = set()
    for batch_id, rows in items:
        start, end = batch_offsets(str(checkpoint), batch_id)
        firsts = {s for s in new_splits if s not in seen and any(f"{r[0]}:{r[1]}" == s for r in rows)}
        if not firsts:
            continue
        assert start is not None and set(start) == set(end)
        for split in firsts:
            assert start[split] == 0 and end[split] >= 1, (split, start, end)
        assert _replay(spark, kafka_bootstrap, start, end) == sorted(rows)
        seen |= firsts
    assert seen == new_splits


def test_available_now_reads_everything_in_bounded_batches_and_stops(
    spark, kafka_bootstrap, topic_factory, produce, tmp_path
):
    topic = topic_factory(partitions=2)
    for part in range(2):
        produce(topic, [f"{part}-{i}".encode() for i in range(20)], partition=part)
    sink = Batches()
    query = _start(
        spark,
        kafka_bootstrap,
        tmp_path / "ckpt",
        sink,
        trigger={"availableNow": True},
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="15",
    )
    try:
        assert query.awaitTermination(120), "availableNow query did not stop"
    finally:
        query.stop()
    sizes = [len(rows) for _, rows in sink.items]
    assert sum(sizes) == 40 and all(0 < n <= 15 for n in sizes), sizes
    assert len({r for _, rows in sink.items for r in rows}) == 40
