"""The pyarrow copy of Kafka offset ranges into Parquet files, at a lower CPU priority.

:func:`write_ranges_parquet` runs in a Spark task (a history read ahead of the Python connector): it
reads ranges with :func:`connectors.kafka.ranges.read_range` and writes them with pyarrow's Parquet
writer, a third of the CPU of the same copy through Spark's Arrow -> row -> Parquet path.
:func:`niced` runs such a copy in a thread of its own at a CPU niceness, so the live stream's work gets
the CPU first; :func:`warm_copy` loads what the copy needs in a Spark task's Python worker.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from connectors.kafka.ranges import DEFAULT_POLL_TIMEOUT_MS, KafkaRange, read_range

logger = logging.getLogger(__name__)

#: Rows per Parquet row group of :func:`write_ranges_parquet` (Spark writes ~128 MB groups; this is
#: ~20 MB of Kafka records of ~150 B, and bounds what one task holds in memory).
ROW_GROUP_ROWS = 131_072


def write_ranges_parquet(
    ranges: Sequence[KafkaRange],
    bootstrap: str,
    kafka_options: Mapping[str, Any],
    folder: str,
    *,
    fail_on_data_loss: bool = True,
    poll_timeout_s: float = DEFAULT_POLL_TIMEOUT_MS / 1000.0,
    niceness: int = 0,
) -> tuple[dict[str, int], int]:
    """Copy the records of ``ranges`` into Parquet files in ``folder`` (one per range); rows per split, bytes.

    The bytes are the records' ``len(key) + len(value)`` (:func:`connectors.kafka.ranges.record_bytes`).

    The files have the source's Arrow schema (what Spark would write for its rows, headers left out).
    Meant to run in a Spark task: reading and writing stay in Arrow and pyarrow's Parquet writer, a
    third of the CPU of the same copy through Spark's Arrow -> row -> Parquet path. ``niceness`` > 0
    runs the whole copy at that lower CPU priority (:func:`niced`). A range whose records are all gone
    (transaction markers, compaction) writes no file.
    """

    def copy() -> Iterator[tuple[dict[str, int], int]]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        rows: dict[str, int] = {}
        fetched = 0
        for rng in ranges:
            path = f"{folder}/part-{rng.topic}-{rng.partition}-{rng.start}-{uuid.uuid4().hex[:8]}.parquet"
            writer = None
            pending: list[Any] = []
            pending_rows = 0
            try:
                for batch in read_range(rng, bootstrap, kafka_options, fail_on_data_loss=fail_on_data_loss,
                                        poll_timeout_s=poll_timeout_s):
                    pending.append(batch)
                    pending_rows += batch.num_rows
                    rows[rng.split_id] = rows.get(rng.split_id, 0) + batch.num_rows
                    for column in ("key", "value"):
                        fetched += pc.sum(pc.binary_length(batch.column(column))).as_py() or 0
                    if pending_rows >= ROW_GROUP_ROWS:
                        writer = writer or pq.ParquetWriter(path, batch.schema, compression="snappy")
                        writer.write_table(pa.Table.from_batches(pending))
                        pending, pending_rows = [], 0
                if pending:
                    writer = writer or pq.ParquetWriter(path, pending[0].schema, compression="snappy")
                    writer.write_table(pa.Table.from_batches(pending))
            finally:
                if writer is not None:
                    writer.close()
        yield rows, fetched

    produced = list(niced(copy, niceness)) if niceness > 0 else list(copy())
    return produced[0]


def warm_copy(_: object = None) -> int:
    """Import what :func:`write_ranges_parquet` needs, in a Spark task's Python worker (a warm-up)."""
    import confluent_kafka  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from connectors.kafka import admin  # noqa: F401

    return os.getpid()


_END = object()


def niced(produce: Callable[[], Iterator[Any]], niceness: int, depth: int = 2) -> Iterator[Any]:
    """Yield the items of ``produce()``, run in a thread of its own at CPU ``niceness`` at least.

    On Linux niceness is per thread, and threads inherit it when created: the consumer's librdkafka
    threads, made inside ``produce``, run niced too, while the (reused) worker process keeps its own.
    Where a thread's priority cannot be set, it reads at normal priority. ``depth`` items are read
    ahead at most; closing this generator stops the thread at its next item.
    """
    items: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            tid = threading.get_native_id()  # never raises the priority of an already niced worker
            os.setpriority(os.PRIO_PROCESS, tid, max(niceness, os.getpriority(os.PRIO_PROCESS, tid)))
        except (AttributeError, OSError) as exc:
            logger.debug('reader niceness not set niceness=%d error="%s"', niceness, exc)
        try:
            for item in produce():
                if not put(item):
                    return
        except BaseException as exc:  # noqa: BLE001 - raised in the reading thread below
            put((_END, exc))
            return
        put((_END, None))

    thread = threading.Thread(target=run, name="kafka-reader-niced", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if isinstance(item, tuple) and len(item) == 2 and item[0] is _END:
                if item[1] is not None:
                    raise item[1]
                return
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
