"""The test kit's exactly-once checker: a table's offsets against the whole Kafka log, offset by offset.

For every split, the table must hold each offset of the log (from the job's start) exactly once, and
nothing else: no missing offset, no duplicate, no offset the log does not have (an aborted transaction's
record, say). Works on tables whose rows keep the ``topic``, ``partition`` and ``offset`` columns (the
identity transform does). Reads the table with delta-rs and the log with confluent-kafka: no Spark. Both
sides are held in memory: for tests and demos; a job of any size is checked by :mod:`.kafka_job`.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from source_backfill.core.splits import split_id


@dataclass(frozen=True)
class SplitCheck:
    """One split compared: offsets missing from the table, duplicated in it, or unknown to the log."""

    split: str
    log_records: int
    table_rows: int
    missing: tuple[int, ...] = ()
    duplicates: tuple[int, ...] = ()
    unexpected: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the table holds the log's offsets exactly once."""
        return not (self.missing or self.duplicates or self.unexpected)


@dataclass(frozen=True)
class Report:
    """Per-split results; ``ok`` only if every split is."""

    splits: dict[str, SplitCheck] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every split is exactly once."""
        return all(s.ok for s in self.splits.values())

    def summary(self) -> str:
        """One line per failing split (or an all-good line)."""
        total = sum(s.log_records for s in self.splits.values())
        if self.ok:
            return f"exactly once: {len(self.splits)} splits, {total} records"
        lines = []
        for s in self.splits.values():
            if not s.ok:
                lines.append(
                    f"{s.split}: missing={len(s.missing)} {list(s.missing[:5])} "
                    f"duplicates={len(s.duplicates)} {list(s.duplicates[:5])} "
                    f"unexpected={len(s.unexpected)} {list(s.unexpected[:5])}"
                )
        return "\n".join(lines)


def table_offsets(path: str) -> dict[str, list[int]]:
    """The ``(topic, partition) -> offsets`` held by the Delta table at ``path`` (latest version)."""
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table(columns=["topic", "partition", "offset"])
    out: dict[str, list[int]] = {}
    topics = table.column("topic").to_pylist()
    partitions = table.column("partition").to_pylist()
    offsets = table.column("offset").to_pylist()
    for topic, partition, offset in zip(topics, partitions, offsets, strict=True):
        out.setdefault(split_id(topic, partition), []).append(int(offset))
    return out


def log_offsets(
    bootstrap: str,
    topics: Iterable[str],
    *,
    start: Mapping[str, int] | None = None,
    end: Mapping[str, int] | None = None,
    timeout_s: float = 60.0,
    kafka_options: Mapping[str, Any] | None = None,
) -> dict[str, list[int]]:
    """Offsets of the committed records of every partition of ``topics``, from ``start`` to ``end``.

    ``kafka_options``: librdkafka options of the cluster (a secured one's: ``security.librdkafka_options``).
    """
    import time

    from confluent_kafka import Consumer, TopicPartition

    from connectors.kafka.admin import KafkaAdmin, consume_available

    admin = KafkaAdmin(bootstrap, dict(kafka_options or {}))
    splits = admin.list_splits(list(topics))
    ids = [split_id(t, p) for t, p in splits]
    ends = dict(end) if end is not None else admin.end_offsets(ids)
    firsts = admin.earliest_offsets(ids)
    out: dict[str, list[int]] = {s: [] for s in ids}
    consumer = Consumer({
        **(kafka_options or {}),
        "bootstrap.servers": bootstrap,
        "group.id": f"source-backfill-verify-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "fetch.queue.backoff.ms": 0,
    })
    try:
        todo = {}
        assignment = []
        for (topic, partition), split in zip(splits, ids, strict=True):
            lo = max(firsts[split], (start or {}).get(split, firsts[split]))
            if lo < ends[split]:
                todo[(topic, partition)] = ends[split]
                assignment.append(TopicPartition(topic, partition, lo))
        consumer.assign(assignment)
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            for msg in consume_available(consumer, 10_000, 0.5):
                key = (msg.topic(), msg.partition())
                if msg.error() is not None:
                    if msg.error().code() == -191:  # _PARTITION_EOF: the log is read to its end
                        todo.pop(key, None)
                    continue
                if key in todo and msg.offset() < todo[key]:
                    out[split_id(*key)].append(msg.offset())
                if key in todo and msg.offset() >= todo[key] - 1:
                    todo.pop(key, None)
            for tp in consumer.position([TopicPartition(t, p) for t, p in list(todo)]):
                if tp.offset >= 0 and tp.offset >= todo.get((tp.topic, tp.partition), 1 << 62):
                    todo.pop((tp.topic, tp.partition), None)
        if todo:
            msg = f"log not read to its end within {timeout_s}s: {sorted(todo)}"
            raise TimeoutError(msg)
    finally:
        consumer.close()
        admin.close()  # no client left polling a broker a test stops next
    return out


def compare(log: Mapping[str, list[int]], table: Mapping[str, list[int]]) -> Report:
    """Compare the log's offsets with the table's, split by split."""
    checks: dict[str, SplitCheck] = {}
    for split in sorted(set(log) | set(table)):
        expected = set(log.get(split, ()))
        counts = Counter(table.get(split, ()))
        checks[split] = SplitCheck(
            split=split,
            log_records=len(expected),
            table_rows=sum(counts.values()),
            missing=tuple(sorted(expected - counts.keys())),
            duplicates=tuple(sorted(o for o, n in counts.items() if n > 1)),
            unexpected=tuple(sorted(counts.keys() - expected)),
        )
    return Report(checks)


def check_exactly_once(
    table_path: str,
    bootstrap: str,
    topics: Iterable[str],
    *,
    start: Mapping[str, int] | None = None,
    end: Mapping[str, int] | None = None,
    kafka_options: Mapping[str, Any] | None = None,
) -> Report:
    """Check that the table at ``table_path`` holds the log of ``topics`` exactly once (from ``start``).

    ``kafka_options``: librdkafka options of a secured cluster (``security.librdkafka_options``).
    """
    return compare(log_offsets(bootstrap, topics, start=start, end=end, kafka_options=kafka_options),
                   table_offsets(table_path))
