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
    assert live_source._live_stats(batch, start, end) == expected  # noqa: SLF001 - bound 16 rows: driver
    assert live_source._live_stats(batch, None, end) == expected  # noqa: SLF001 - start unknown: Spark
    monkeypatch.setattr(live_source, "SMALL_BATCH_ROWS", 15)
    assert live_source._live_stats(batch, start, end) == expected  # noqa: SLF001 - over the bound: Spark
