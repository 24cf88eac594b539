"""What a repair reads of a job's table: on the driver (delta-rs, pyarrow) the same as with Spark.

A repair counts the rows of its window before and after its commit, and finds a ``latest`` job's first
offset per split (:class:`source_backfill.executors.repair._TableReads`). A small table is read on the
driver, a large one (or one delta-rs cannot read) with Spark: both must give the same answers, on a table
of two topics (one with a quote in its name), partitions with gaps, and two versions.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from source_backfill.core import HistoryRange

pytestmark = pytest.mark.integration

TOPICS = ("orders", "it's")


def _table(path, with_topic: bool):
    import pyarrow as pa
    from deltalake import write_deltalake

    def rows(offsets_by_split):
        cols = {"topic": [], "partition": [], "offset": [], "v": []}
        for (topic, partition), offsets in offsets_by_split.items():
            for o in offsets:
                cols["topic"].append(topic)
                cols["partition"].append(partition)
                cols["offset"].append(o)
                cols["v"].append(f"{topic}/{partition}/{o}")
        table = pa.table({"topic": pa.array(cols["topic"], pa.string()),
                          "partition": pa.array(cols["partition"], pa.int32()),
                          "offset": pa.array(cols["offset"], pa.int64()),
                          "v": pa.array(cols["v"], pa.string())})
        return table if with_topic else table.drop_columns(["topic"])

    first = {(TOPICS[0], 0): range(3, 40), (TOPICS[1], 1): range(10, 90, 3), (TOPICS[0], 2): range(55, 58)}
    second = {(TOPICS[0], 0): range(40, 80, 2), (TOPICS[1], 1): range(90, 120), (TOPICS[0], 2): [70, 71]}
    if not with_topic:  # one topic: the other topic's splits are the first topic's
        first = {(TOPICS[0], p): o for (_, p), o in first.items()}
        second = {(TOPICS[0], p): o for (_, p), o in second.items()}
    write_deltalake(str(path), rows(first), mode="append")
    write_deltalake(str(path), rows(second), mode="append")
    return rows({}).schema, first, second


def _expected(batches, ranges, with_topic: bool):
    held = {}
    for batch in batches:
        for (topic, partition), offsets in batch.items():
            held.setdefault(f"{topic if with_topic else TOPICS[0]}:{partition}", []).extend(offsets)
    inside = {r.split: [o for o in held.get(r.split, []) if r.start <= o < r.end] for r in ranges}
    return sum(len(v) for v in inside.values()), {s: min(v) for s, v in inside.items() if v}


@pytest.mark.parametrize("with_topic", [True, False], ids=["topic-column", "no-topic-column"])
def test_the_driver_and_spark_read_the_same_window_rows_and_first_offsets(spark, tmp_path, monkeypatch,
                                                                         with_topic):
    from source_backfill.executors import repair

    schema, first, second = _table(tmp_path / "j", with_topic)
    job = SimpleNamespace(name="j", spark=spark, source=SimpleNamespace(topics=[TOPICS[0]]),
                          sink=SimpleNamespace(path=str(tmp_path / "j"), arrow_schema=schema))
    other = TOPICS[1] if with_topic else TOPICS[0]
    ranges = [HistoryRange(f"{TOPICS[0]}:0", 5, 50), HistoryRange(f"{other}:1", 0, 100),
              HistoryRange(f"{TOPICS[0]}:2", 60, 200), HistoryRange(f"{TOPICS[0]}:7", 0, 10)]
    rows_latest, firsts = _expected([first, second], ranges, with_topic)
    rows_v0, _ = _expected([first], ranges, with_topic)

    def answers():
        reads = repair._TableReads(job)  # noqa: SLF001 - the reads under test
        return reads.count(ranges), reads.count(ranges, 0), reads.firsts(ranges), reads.firsts([])

    assert repair._TableReads(job)._dataset(None) is not None  # noqa: SLF001 - small: read on the driver
    on_driver = answers()
    monkeypatch.setattr(repair, "DRIVER_READ_ROWS", -1)  # every table is too large for the driver now
    with_spark = answers()
    assert on_driver == with_spark == (rows_latest, rows_v0, firsts, {})
    assert firsts == {f"{TOPICS[0]}:0": 5, f"{other}:1": 10, f"{TOPICS[0]}:2": 70}
