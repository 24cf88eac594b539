"""Benchmark: the kafka_py batch source reading into Parquet vs raw confluent-kafka consume, same records.

Produces BENCH_KAFKA_RECORDS (default 1,000,000) records of 100-200 bytes over 4 partitions into the
embedded Tansu broker (or KAFKA_BOOTSTRAP_SERVERS), then measures
  * raw: one confluent-kafka consumer reading every record (value() touched), single process;
  * source: spark.read.format("kafka_py") with exact ranges -> .write.parquet (local[2]).
Goal: source rows/s >= 0.6 x raw rows/s.

Run: .venv/bin/python bench/bench_kafka_read.py
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

logger = logging.getLogger(__name__)

PARTITIONS = 4


def _produce(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "batch.size": 1 << 20,
            "compression.type": "none",
            "queue.buffering.max.messages": 500000,
            "log_level": 3,
        }
    )
    rnd = random.Random(7)
    payloads = [bytes(rnd.getrandbits(8) for _ in range(rnd.randint(100, 200))) for _ in range(1000)]
    for i in range(records):
        while True:
            try:
                producer.produce(topic, payloads[i % 1000], key=str(i).encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} records not delivered")


def _raw_consume(bootstrap: str, topic: str, ends: dict[str, int]) -> tuple[int, float]:
    from confluent_kafka import Consumer, TopicPartition

    from connectors.kafka.admin import consumer_config

    consumer = Consumer(consumer_config(bootstrap, {}, **{"fetch.wait.max.ms": 50}))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    total = sum(ends.values())
    seen = 0
    size = 0
    t0 = time.perf_counter()
    while seen < total:
        for m in consumer.consume(num_messages=min(10000, total - seen), timeout=1.0):
            if m.error() is None:
                size += len(m.value())
                seen += 1
    elapsed = time.perf_counter() - t0
    consumer.close()
    return seen, elapsed


def main() -> dict:
    """Run the benchmark and return (and print) its figures."""
    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker
    from connectors.kafka.source import KAFKA_FORMAT
    from source_backfill.runtime.spark import build_spark

    records = int(os.environ.get("BENCH_KAFKA_RECORDS", "1000000"))
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap
    workdir = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    try:
        topic = f"bench-{int(time.time())}"
        admin = KafkaAdmin(bootstrap)
        admin.create_topic(topic, PARTITIONS)
        t0 = time.perf_counter()
        _produce(bootstrap, topic, records)
        produce_s = time.perf_counter() - t0
        sids = [f"{topic}:{p}" for p in range(PARTITIONS)]
        ends = admin.end_offsets(sids)

        raw_rows, raw_s = _raw_consume(bootstrap, topic, ends)

        spark = build_spark(master=os.environ.get("BENCH_SPARK_MASTER", "local[2]"))
        ranges = [
            {"topic": topic, "partition": p, "start": 0, "end": ends[f"{topic}:{p}"]}
            for p in range(PARTITIONS)
        ]

        def run(target: Path) -> float:
            start = time.perf_counter()
            (
                spark.read.format(KAFKA_FORMAT)
                .option("kafka.bootstrap.servers", bootstrap)
                .option("ranges", json.dumps(ranges))
                .load()
                .write.mode("overwrite")
                .parquet(str(target))
            )
            return time.perf_counter() - start

        warm_ranges = [
            {"topic": topic, "partition": p, "start": 0, "end": min(1000, ends[f"{topic}:{p}"])}
            for p in range(PARTITIONS)
        ]
        (
            spark.read.format(KAFKA_FORMAT)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("ranges", json.dumps(warm_ranges))
            .load()
            .count()
        )  # warm both Python workers (first Python data-source job costs ~6 s)
        source_s = run(workdir / "out")
        written = spark.read.parquet(str(workdir / "out")).count()
        spark.stop()
        result = {
            "records": records,
            "partitions": PARTITIONS,
            "broker": "embedded-tansu" if broker else bootstrap,
            "produce_rows_per_s": round(records / produce_s),
            "raw_consume_rows": raw_rows,
            "raw_consume_rows_per_s": round(raw_rows / raw_s),
            "source_parquet_rows": written,
            "source_parquet_s": round(source_s, 2),
            "source_parquet_rows_per_s": round(written / source_s),
            "ratio_vs_raw": round((written / source_s) / (raw_rows / raw_s), 3),
            "goal_ratio": 0.6,
        }
        print(json.dumps(result, indent=2))
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
