"""Records the benchmarks write: a history of ~130-byte values, and a steady live stream."""

from __future__ import annotations

import threading
from typing import Any


def fill(bootstrap: str, topic: str, n: int, partitions: int, config: dict[str, str] | None = None) -> None:
    """Produce ``n`` records of ~130 B round-robin over ``partitions``, as fast as the broker takes.

    ``config``: more librdkafka settings (a secured broker's).
    """
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 20000,
                         "queue.buffering.max.messages": 1_000_000, **(config or {})})
    pad = b"x" * 120
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value=b"%d:" % i + pad, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 20000 == 0:
            producer.poll(0)
    producer.flush(300)


def new_history(admin: Any, bootstrap: str, topic: str, n: int, partitions: int) -> None:
    """A new topic of ``partitions`` holding ``n`` history records (:func:`fill`), its time printed."""
    import time

    admin.create_topic(topic, partitions)
    t = time.monotonic()
    fill(bootstrap, topic, n, partitions)
    print(f"produced {n} history records on {partitions} partition(s) in {time.monotonic() - t:.1f}s",
          flush=True)


def live(bootstrap: str, topic: str, partitions: int, per_second: float, stop: threading.Event,
         burst: int = 10) -> None:
    """Produce ``live<i>`` records at ``per_second`` (``burst`` at a time) until ``stop`` is set."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    i = 0
    while not stop.wait(burst / per_second):
        for _ in range(burst):
            producer.produce(topic, value=b"live%d" % i, partition=i % partitions)
            i += 1
        producer.poll(0)
    producer.flush(30)
