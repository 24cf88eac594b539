"""The live batch's per-split stats: the driver-side path for small batches agrees with Spark's groupBy."""

from __future__ import annotations

import pytest

from source_backfill.core import LiveStats
from source_backfill.runtime import source as live_source

pytestmark = pytest.mark.integration


def test_small_batch_stats_on_the_driver_equal_the_spark_aggregation(spark, monkeypatch):
    # offsets with gaps (transaction markers), two topics, and a split present in ``end`` without rows
    rows = [("a", 0, o) for o in (10, 11, 13, 17)] + [("a", 1, 5)] + [("b", 0, o) for o in range(3, 9)]
    batch = spark.createDataFrame(rows, "topic string, partition int, offset long")
    start = {"a:0": 10, "a:1": 5, "a:2": 4, "b:0": 3}
    end = {"a:0": 19, "a:1": 6, "a:2": 4, "b:0": 9}
    expected = {
        "a:0": LiveStats(first=10, last=17, count=4, end=19),
        "a:1": LiveStats(first=5, last=5, count=1, end=6),
        "b:0": LiveStats(first=3, last=8, count=6, end=9),
    }
    asked = []

    def read_small(s, e):  # stands in for LiveSource._read_small: the batch's records, read on the driver
        asked.append((s, e))
        return batch.toArrow()

    rows, stats = live_source._rows_and_stats(batch, start, end, read_small)  # noqa: SLF001 - 16 rows: small
    assert asked == [(start, end)] and rows is not None and rows.num_rows == 11
    assert stats == expected  # from the driver's rows
    rows, stats = live_source._rows_and_stats(batch, None, end, read_small)  # noqa: SLF001 - start unknown
    assert rows is None and stats == expected and len(asked) == 1  # Spark's groupBy over the persisted batch
    batch.unpersist()
    monkeypatch.setattr(live_source, "SMALL_BATCH_ROWS", 15)
    rows, stats = live_source._rows_and_stats(batch, start, end, read_small)  # noqa: SLF001 - over the bound
    assert rows is None and stats == expected and len(asked) == 1
    batch.unpersist()

def test_the_live_filter_on_the_driver_keeps_what_sparks_filter_keeps(spark):
    from source_backfill.executors.live_filter import live_rows_arrow

    rows = [("a", 0, o) for o in range(10, 20)] + [("a", 1, o) for o in range(5)]
    rows += [("b", 0, o) for o in range(3)]
    batch = spark.createDataFrame(rows, "topic string, partition int, offset long").toArrow()
    got = live_rows_arrow(batch, {"a:0": 14, "a:1": None, "b:0": -1})
    assert sorted(zip(got.column("topic").to_pylist(), got.column("partition").to_pylist(),
                      got.column("offset").to_pylist(), strict=True)) == sorted(
        [("a", 0, o) for o in range(15, 20)] + [("b", 0, o) for o in range(3)])
    assert live_rows_arrow(batch, {"a:0": -1, "a:1": -1, "b:0": -1}).num_rows == 18  # all finished
    assert live_rows_arrow(batch, {"a:0": None, "a:1": None, "b:0": None}).num_rows == 0


def test_sparks_aggregation_gives_each_splits_timestamp_range_for_the_live_latency(spark):
    rows = [("a", 0, o, 1_700_000_000_000 + 10 * o, 0) for o in range(5)]
    rows.append(("b", 0, 7, 1_700_000_000_500, 1))
    schema = "topic string, partition int, offset long, ms long, timestampType int"
    batch = spark.createDataFrame(rows, schema)
    batch = batch.selectExpr("topic", "partition", "offset", "timestamp_millis(ms) AS timestamp",
                             "timestampType")
    stats = live_source._live_stats(batch, {"a:0": 5, "b:0": 8}, None)  # noqa: SLF001 - Spark's groupBy
    assert (stats["a:0"].ts_min_ms, stats["a:0"].ts_max_ms, stats["a:0"].ts_type) == (
        1_700_000_000_000, 1_700_000_000_040, 0)
    assert (stats["b:0"].ts_min_ms, stats["b:0"].ts_max_ms, stats["b:0"].ts_type) == (
        1_700_000_000_500, 1_700_000_000_500, 1)


def test_both_paths_fingerprint_each_splits_last_record_as_the_core_does(spark, monkeypatch):
    """The anchor (``core/anchors.py``): the driver's rows and Spark's aggregation hash the same record
    (the one at ``last``, not the last in the batch's order) to the same fingerprint; a null key, an empty
    value and a timestamp before 1970 included."""
    from source_backfill.core.anchors import fingerprint

    records = [("a", 0, 12, b"k12", b"v12", 1_700_000_000_123), ("a", 0, 10, None, b"", -1),
               ("a", 0, 11, b"\x00", None, 5), ("b", 3, 4, None, b"x", 1_700_000_000_999)]
    schema = "topic string, partition int, offset long, key binary, value binary, ms long"
    batch = spark.createDataFrame([(t, p, o, bytearray(k) if k is not None else None,
                                    bytearray(v) if v is not None else None, ms)
                                   for t, p, o, k, v, ms in records], schema)
    batch = batch.selectExpr("key", "value", "topic", "partition", "offset",
                             "timestamp_millis(ms) AS timestamp", "0 AS timestampType")
    expected = {"a:0": fingerprint(b"k12", b"v12", 1_700_000_000_123),
                "b:3": fingerprint(None, b"x", 1_700_000_000_999)}
    end = {"a:0": 13, "b:3": 5}
    rows, stats = live_source._rows_and_stats(batch, {"a:0": 10, "b:3": 4}, end,  # noqa: SLF001
                                              lambda s, e: batch.toArrow())
    assert rows is not None and {s: x.fingerprint for s, x in stats.items()} == expected
    rows, stats = live_source._rows_and_stats(batch, None, end, lambda s, e: batch.toArrow())  # noqa: SLF001
    assert rows is None and {s: x.fingerprint for s, x in stats.items()} == expected  # Spark's max_by
    batch.unpersist()
